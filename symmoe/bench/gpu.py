"""GPU benchmark of the CUDA protocols against the copy roofline and plain torch.

``run_gpu_bench(config, world_size)`` times dispatch and combine (CUDA events, warm-up,
median) at the DeepSeek-V3 shape by default, and measures in the same run:

* the device-to-device copy roofline (bytes read + written per second of ``dst.copy_(src)``
  of 1 GiB), and a copy of exactly each op's bytes (per GPU) timed as the ops are
  (``ratio_same_size_copy``: what a plain copy of those bytes reaches pays the same launch,
  ramp-up and tail; a 1 GiB copy amortises them),
* plain-torch dispatch/combine (nonzero / argsort + index_select, index_add_) at world size 1;
  the cached dispatch against index_select along the routing computed once.

Bytes that must move: dispatch reads each received source row once and writes each output
row once (padding rows included); combine reads each received row once and writes each
token once. ``ratio_roofline`` = (bytes / roofline) / measured time.

Timing: before each timed call a ``torch.cuda._sleep`` kernel (1 ms: longer than any call's
host enqueue, which reached 240 µs on a slow host) keeps the GPU busy while the host
enqueues, so the events measure GPU time, not Python launch overhead (dispatch still
includes its mid-call host wait for the counts: the data kernel is already queued then).
With several ranks a device barrier follows the sleep (``Protocol.barrier_on_stream``): the
hosts leave the gloo barrier before each call tens of µs apart, and without it each call's
first cross-rank wait would carry that skew (at W=2 a routing kernel's time spread over 24-175 µs).
``cached_dispatch``: ``dispatch(x, handle=...)`` along the last dispatch's routing (DeepEP's
cached dispatch, what its intranode benchmark times); the same bytes as ``dispatch``.
``worst_dispatch`` (rank-major): ``dispatch(..., num_worst_tokens=W * T)``, outputs of DeepEP's
worst-case size; the same bytes, and the CUDA protocols skip the host wait.
``api_*`` numbers time ``Buffer.dispatch``/``combine`` with their input validation.
``host_us``: the host's wall time inside a call, timed in a second pass without the sleep;
``dispatch_host_phases``: that pass's dispatch split at its counts wait (before / in / after);
``dispatch_host_phases_timed``: the same split of the timed dispatches (their wait spans the sleep).
Every timed call's result (a dispatch's: the one it replaces) is released after the end event,
plain torch's too: a training step keeps its results (a dispatch's handle until the backward),
and freeing the previous result's tensors took the host 7.6 µs on a CPU-only machine (a W=1
rank-major result over CPU tensors), which an exact-size dispatch would otherwise pay between
its counts wait and its end event.

Several ranks on one GPU (MPS) all get the same active thread percentage, whatever the
backend (``launch.mps_share``); the roofline is measured by the launching process on the whole
device before any rank starts.

``python -m symmoe.bench --world-sizes 1,4 --json out.json`` runs it from a shell.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Callable

import torch

from .. import launch
from ..backends import BACKENDS
from ..config import Config, from_dict, parse_key_value
from ..launch_shape import gpu_sms
from ..layout import MAX_CHANNELS
from .ops import BASE_OP, BUSY, LABEL, kernels_total, ops_of, union_length
from .timing import sleep_cycles_for

HOST_PHASES = ("before_wait", "wait", "after_wait")  # a dispatch's host time, split at its counts wait
DEEPSEEK_V3 = {"buffer.max_tokens_per_rank": 4096, "buffer.hidden": 7168, "buffer.topk": 8,
               "buffer.num_experts": 256, "buffer.dtype": "bfloat16", "buffer.expert_alignment": 1}


def bench_config(protocol: str = "pull", num_sms: int = 132, **over: Any) -> Config:
    # nvshmem runs one sender and one receiver block per channel: the same SMs as the others.
    d = {"backend": "torch", "protocol": protocol, "kernel.num_sms": num_sms,
         "kernel.num_channels": max(1, min(MAX_CHANNELS, num_sms // 2)), "kernel.timeout_s": 30.0,
         "torch.allow_overlapping_devices": True, **DEEPSEEK_V3}
    d.update(over)
    return Config().replace(**d)


def _host_phases(marks: list[tuple[float, tuple[float, float] | None, float]]) -> list[tuple[float, float, float]]:
    """Each dispatch's host seconds before / in / after its counts wait (HOST_PHASES), from its
    marks (entry, the wait's start and end, return); dispatches without a wait are left out."""
    return [(w[0] - t0, w[1] - w[0], t1 - w[1]) for t0, w, t1 in marks if w is not None]


def _time(fn: Callable[[], Any], warmup: int, repeats: int, sleep_cycles: int, sync: Callable[[], None],
          host: list[float] | None = None, align: Callable[[], None] | None = None) -> list[float]:
    """GPU seconds per call (events); ``host`` receives the host's wall seconds per call.
    ``align``: queued after the sleep, before the start event: a device barrier of the ranks,
    so every rank's call starts together however far apart their hosts left ``sync``."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    stream = torch.cuda.current_stream()  # looked up once: a host-bound call's end waits for no lookup
    for _ in range(repeats):
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        if align is not None:
            align()
        start.record(stream)
        t0 = time.perf_counter()
        done = fn()
        t1 = time.perf_counter()
        end.record(stream)
        end.synchronize()
        del done  # released after the end event (see the module's docstring)
        out.append(start.elapsed_time(end) * 1e-3)
        if host is not None:
            host.append(t1 - t0)
    return out


def kernel_breakdown(fn: Callable[[], Any], calls: int = 5, sync: Callable[[], None] = lambda: None,
                     host: bool = False) -> dict[str, float]:
    """Time per call of each kernel ``fn`` launches (CUDA profiler activity), in µs: what the
    GPU itself spends, without the host gaps the event timings include, and under ``BUSY`` the
    time some kernel ran (ops.kernels_total: a following kernel's time includes its wait for
    the one before). With several ranks, ``sync`` lines them up before each call; a kernel that
    ends in a barrier still includes the wait for the slowest peer. ``host=True``: the host's
    self time per operator instead (CPU activity), which shows what keeps the GPU waiting
    between kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    wall = 0.0
    with profile(activities=[ProfilerActivity.CPU if host else ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            sync()
            t0 = time.perf_counter()
            fn()
            wall += time.perf_counter() - t0
            torch.cuda.synchronize()
    out: dict[str, float] = {}
    skip = ("ProfilerStep", "cudaDeviceSynchronize") if host else ("cuda", "Activity")
    for ev in prof.key_averages():
        if host:
            total = ev.self_cpu_time_total
        else:
            total = getattr(ev, "device_time_total", None)
            if total is None:
                total = getattr(ev, "cuda_time_total", 0.0)
        if total <= 0 or ev.key.startswith(skip):
            continue
        name = ev.key.split("<")[0].split("(")[0].replace("void ", "").replace("symmoe::", "").strip()[:48]
        out[name] = out.get(name, 0.0) + total / calls
    if host:  # the rest of the call: Python, extension launches, host waits on the GPU
        out["(other: python, launches, waits)"] = max(0.0, wall / calls * 1e6 - sum(out.values()))
    ranked = dict(sorted(out.items(), key=lambda kv: -kv[1]))
    if not host and ranked:
        spans = [(ev.time_range.start, ev.time_range.end) for ev in prof.events()
                 if ev.device_type == DeviceType.CUDA and not ev.name.startswith(skip)]
        ranked[BUSY] = union_length(spans) / calls
    return ranked


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_us": statistics.median(s) * 1e6, "p10_us": s[len(s) // 10] * 1e6, "p90_us": s[(9 * len(s)) // 10] * 1e6,
            "n": len(s)}


def _copy_seconds(nbytes: int, repeats: int, sleep_cycles: int = 0) -> float:
    """Median seconds of ``dst.copy_(src)`` of ``nbytes`` on this device (events)."""
    src = torch.empty(max(1, nbytes), dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return statistics.median(_time(lambda: dst.copy_(src), 3, repeats, sleep_cycles, lambda: None))


def copy_roofline(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes (read + written) per second of a device-to-device copy of ``nbytes``."""
    return 2 * nbytes / _copy_seconds(nbytes, repeats)


def same_size_copy(sleep_cycles: int, repeats: int = 20) -> Callable[[int], float]:
    """µs of ``dst.copy_(src)`` moving ``nbytes`` (read + written) on this device, timed as the
    ops are (sleep kernel in front, events): the copy of exactly the bytes an op must move,
    launch and ramp included, where ``copy_roofline`` is the asymptote of a 1 GiB copy."""
    memo: dict[int, float] = {}

    def us(nbytes: int) -> float:
        if nbytes not in memo:
            memo[nbytes] = _copy_seconds(nbytes // 2, repeats, sleep_cycles) * 1e6
        return memo[nbytes]
    return us


def _inputs(T: int, H: int, K: int, E: int, W: int, rank: int, seed: int, device: torch.device):
    """This rank's uniform routing, drawn exactly as ``python -m symmoe.bench.baselines`` draws it
    (same seed, same generator): a multi-GPU run's baselines move the same rows."""
    from ..workload import Routing, make_inputs

    mine = make_inputs(Routing("uniform"), num_tokens=T, hidden=H, topk=K, num_experts=E, world_size=W,
                       dtype=torch.bfloat16, seed=seed, device=device, ranks=[rank])[rank]
    return mine.x, mine.topk_idx, mine.topk_weights


def probe_inputs(device: torch.device) -> tuple[torch.Tensor, ...]:
    """World size 1, DeepSeek-V3 shape, for the W=1 probes (scripts/timeline_probe.py): this
    rank's x, topk ids and weights as the bench draws them, and a source and destination of the
    rank-major dispatch's bytes for a same-size copy."""
    T, H = DEEPSEEK_V3["buffer.max_tokens_per_rank"], DEEPSEEK_V3["buffer.hidden"]
    x, idx, w = _inputs(T, H, DEEPSEEK_V3["buffer.topk"], DEEPSEEK_V3["buffer.num_experts"], 1, 0, 0, device)
    src = torch.empty(T * H * x.element_size(), dtype=torch.uint8, device=device).random_(0, 255)
    return x, idx, w, src, torch.empty_like(src)


def torch_dispatches(x: torch.Tensor, idx: torch.Tensor) -> dict[str, dict[str, Callable[[], torch.Tensor]]]:
    """Plain torch's world-size-1 dispatch per layout: ``dispatch`` routes inside the call (the
    nonzero / stable argsort), ``cached_dispatch`` gathers along that routing computed once, as
    a cached dispatch reuses its handle's. For routings without masked slots, as the bench
    draws them (a stable argsort puts -1 slots first)."""
    K = idx.shape[1]
    sel = (idx >= 0).any(1).nonzero().squeeze(1)
    src = torch.argsort(idx.flatten(), stable=True) // K

    def d_rank():
        return x.index_select(0, (idx >= 0).any(1).nonzero().squeeze(1))

    def d_expert():
        return x.index_select(0, torch.argsort(idx.flatten(), stable=True) // K)

    return {"rank": {"dispatch": d_rank, "cached_dispatch": lambda: x.index_select(0, sel)},
            "expert": {"dispatch": d_expert, "cached_dispatch": lambda: x.index_select(0, src)}}


def _torch_baselines(x, idx, w, y_rank, y_expert, warmup, repeats, sleep) -> dict[str, Any]:
    """World size 1: what plain torch does for the same dispatch/combine."""
    T, K = idx.shape
    H = x.shape[1]
    sel = (idx >= 0).any(1).nonzero().squeeze(1)
    order = torch.argsort(idx.flatten(), stable=True)
    wo = w.flatten()[order].unsqueeze(1)

    def c_rank():
        return torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add_(0, sel, y_rank.float()).to(x.dtype)

    def c_expert():
        return torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add_(
            0, order // K, y_expert.float() * wo).to(x.dtype)

    none = lambda: None  # noqa: E731
    combines = {"rank": c_rank, "expert": c_expert}
    return {layout: {**{op: _stats(_time(fn, warmup, repeats, sleep, none)) for op, fn in ds.items()},
                     "combine": _stats(_time(combines[layout], warmup, repeats, sleep, none))}
            for layout, ds in torch_dispatches(x, idx).items()}


def _bench_rank(rank: int, world_size: int, config: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from ..buffer import Buffer

    device = launch.local_gpu(rank)
    cfg = from_dict(config)
    b = cfg.buffer
    T = opts["tokens"] or b.max_tokens_per_rank
    rb = b.hidden * 2
    x, idx, w = _inputs(T, b.hidden, b.topk, b.num_experts, world_size, rank, opts["seed"], device)
    warmup, repeats = opts["warmup"], opts["repeats"]
    sleep = opts["sleep_cycles"]
    sync = (lambda: dist.barrier()) if world_size > 1 else (lambda: None)
    align = None
    res: dict[str, Any] = {"tokens": T, "seed": opts["seed"]}  # then one entry per output layout
    with Buffer(None, cfg) as buf:
        proto = buf._protocol
        if world_size > 1:  # the hosts leave the (gloo) barrier tens of µs apart
            align = proto.barrier_on_stream
        if opts["x_in_buffer"]:  # built where the layer before would write it: nothing to publish
            x = buf.input_view(T).copy_(x)
        ys = {}
        for layout in opts["layouts"]:
            state: dict[str, Any] = {}
            # Each dispatch's marks: entry, its wait's (start, end), return. Split only later, so
            # the timed call's host is not kept from its end event by the bookkeeping.
            marks: list[tuple[float, tuple[float, float] | None, float]] = []

            # Each returns what its call released (_time frees it after the end event).
            def dispatch() -> Any:
                t0 = time.perf_counter()
                d = proto.dispatch(x, idx, w, layout, b.expert_alignment)
                marks.append((t0, proto.wait_marks, time.perf_counter()))
                old, state["d"] = state.get("d"), d
                return old

            def combine() -> Any:
                recv, handle = state["d"]
                return proto.combine(recv.x, handle, None)

            def cached() -> Any:  # dispatch(x, handle=...): the routing of the last dispatch
                return proto.dispatch_cached(x, state["d"][1])

            def worst() -> Any:  # DeepEP V1's num_worst_tokens: no host wait on the CUDA protocols
                return proto.dispatch(x, idx, w, layout, b.expert_alignment, world_size * T)

            # In this order: combine and the cached dispatch use the last dispatch's handle.
            fns = {"dispatch": dispatch, "combine": combine, "cached_dispatch": cached}
            if layout == "rank":
                fns["worst_dispatch"] = worst
            mark = len(marks)
            gpu = {op: _time(f, warmup, repeats, sleep, sync, align=align) for op, f in fns.items()}
            timed_phases = _host_phases(marks[mark:])[-repeats:]  # the timed dispatches: their waits began during the sleep
            # The host's wall time per call, without the sleep kernel in front (with it, the
            # dispatch's wait for the counts would include the sleep): for dispatch the launches,
            # the wait for the routing kernels and the work after it; for combine the launches.
            host: dict[str, list[float]] = {op: [] for op in fns}
            first = len(marks)  # the dispatches of this pass, the only ones timed without the sleep
            for op, f in fns.items():
                _time(f, 1, repeats, 0, sync, host[op])
            host_phases = _host_phases(marks[first:])
            recv, handle = state["d"]
            rows = recv.x.shape[0]
            real = int((recv.src_rank >= 0).sum())
            unique_src = int(torch.unique(recv.src_rank.long() * (T + 1) + recv.src_token.long()).numel()
                             - (1 if real < rows else 0))
            ys[layout] = recv.x
            api_d = _time(lambda: buf.dispatch(x, idx, w, output_layout=layout), 2, max(5, repeats // 3), sleep, sync,
                          align=align)
            kernels = {op: kernel_breakdown(f, sync=sync) for op, f in fns.items()}
            host_ops = {op: kernel_breakdown(f, sync=sync, host=True) for op, f in fns.items()}
            res[layout] = {
                "rows": rows, "real_rows": real, "kernels_us": kernels, "host_ops_us": host_ops,
                **{op: _stats(t) for op, t in gpu.items()}, "api_dispatch": _stats(api_d),
                **{f"{op}_host": _stats(t) for op, t in host.items()},
                **({"dispatch_host_phases": {k: _stats([p[i] for p in host_phases]) for i, k in enumerate(HOST_PHASES)}}
                   if host_phases else {}),
                **({"dispatch_host_phases_timed": {k: _stats([p[i] for p in timed_phases])
                                                   for i, k in enumerate(HOST_PHASES)}} if timed_phases else {}),
                "dispatch_bytes": (unique_src + rows) * rb, "combine_bytes": (real + T) * rb,
                "cached_dispatch_bytes": (unique_src + rows) * rb,
                **({"worst_dispatch_bytes": (unique_src + rows) * rb} if "worst_dispatch" in fns else {}),
            }
        if world_size == 1 and opts["baselines"]:
            res["torch"] = _torch_baselines(x, idx, w, ys.get("rank"), ys.get("expert"), warmup, repeats, sleep)
    return res


def run_gpu_bench(config: Config, world_size: int = 1, tokens: int = 0, warmup: int = 5, repeats: int = 30,
                  layouts: tuple[str, ...] = ("rank", "expert"), seed: int = 0, baselines: bool = True,
                  sleep_us: float = 1000.0, x_in_buffer: bool = False) -> dict[str, Any]:
    """Time ``config`` (a GPU backend) at ``world_size`` local ranks; returns a JSON-able dict.
    ``x_in_buffer``: x lives in ``Buffer.input_view`` (no publish copy) instead of its own tensor."""
    opts = {"tokens": tokens, "warmup": warmup, "repeats": repeats, "layouts": tuple(layouts), "seed": seed,
            "baselines": baselines, "sleep_cycles": sleep_cycles_for(sleep_us), "x_in_buffer": x_in_buffer}
    env = {"TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
    share = launch.mps_share(world_size)
    if share:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
    # The roofline of the whole device, before any rank runs (an MPS-limited rank would
    # measure only its share).
    roof = copy_roofline()
    if world_size == 1:
        os.environ.update(env)
        ranks = [_bench_rank(0, 1, config.to_dict(), opts)]
    else:
        ranks = launch.spawn(_bench_rank, world_size, args=(config.to_dict(), opts), env=env, timeout_s=600.0)
    return summarize(config, world_size, ranks, roof, share, gpus=min(world_size, torch.cuda.device_count()),
                     x_in_buffer=x_in_buffer, copy_us=same_size_copy(opts["sleep_cycles"]))


def summarize(config: Config, world_size: int, ranks: list[dict[str, Any]], roof: float,
              mps_percentage: int = 0, gpus: int = 1, x_in_buffer: bool = False,
              copy_us: Callable[[int], float] | None = None) -> dict[str, Any]:
    """The run's result: per layout and op the slowest rank's median and every rank's bytes.
    ``gpus``: how many devices the ranks ran on (rank r on GPU r % gpus); the roofline is one
    device's, so ratios of a run over several GPUs are per device summed, not a share.
    ``copy_us(nbytes)``: µs of a copy moving nbytes on one device (``same_size_copy``); each op
    then also gets ``ratio_same_size_copy``, that copy of its bytes per device over its time."""
    out: dict[str, Any] = {
        "backend": config.backend, "protocol": config.effective_protocol, "world_size": world_size,
        "tokens_per_rank": ranks[0]["tokens"], "hidden": config.buffer.hidden, "topk": config.buffer.topk,
        "num_experts": config.buffer.num_experts, "dtype": config.buffer.dtype, "num_sms": config.kernel.num_sms,
        "routing": "uniform", "seed": ranks[0].get("seed", 0),
        "x_in_buffer": x_in_buffer,
        "copy_roofline_TBps": roof / 1e12, "mps_thread_percentage": mps_percentage, "gpus": gpus,
        "layouts": {}, "ranks": ranks,
    }
    for layout in ("rank", "expert"):
        if layout not in ranks[0]:
            continue
        row: dict[str, Any] = {}
        for op in ops_of(ranks[0][layout]):
            t = max(r[layout][op]["median_us"] for r in ranks) * 1e-6
            nbytes = sum(r[layout][f"{op}_bytes"] for r in ranks)
            row[op] = {"median_us": t * 1e6, "bytes": nbytes, "TBps": nbytes / t / 1e12,
                       "ratio_roofline": (nbytes / roof) / t,
                       "host_us": max(r[layout][f"{op}_host"]["median_us"] for r in ranks)}
            if copy_us is not None:
                c = copy_us(nbytes // gpus)
                row[op]["same_size_copy_us"] = c
                row[op]["ratio_same_size_copy"] = c / (t * 1e6)
            row[f"api_{op}_us"] = max(r[layout]["api_dispatch"]["median_us"] for r in ranks) if op == "dispatch" else None
            if "torch" in ranks[0]:
                # Like for like: a cached dispatch against plain torch along a routing computed
                # once (older files hold only its whole dispatch), the rest against
                # plain torch's op that routes as well.
                base = ranks[0]["torch"][layout]
                tt = base[op if op in base else BASE_OP[op]]["median_us"]
                row[op]["torch_us"] = tt
                row[op]["speedup_vs_torch"] = tt / (t * 1e6)
        out["layouts"][layout] = row
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':<8} {'proto':<5} {'W':>2} {'layout':<6} {'op':<15} {'us':>8} {'TB/s':>6} {'%roof':>6} {'%copy':>6} "
             f"{'torch us':>9} {'x torch':>7} {'kern us':>8} {'host us':>8}  kernels (rank 0, device µs per call)"]
    for r in results:
        for layout, row in r["layouts"].items():
            for op in ops_of(row):
                o = row[op]
                tu = f"{o['torch_us']:.1f}" if "torch_us" in o else "-"
                cp = f"{100 * o['ratio_same_size_copy']:5.1f}%" if "ratio_same_size_copy" in o else "-"
                sp = f"{o['speedup_vs_torch']:.2f}" if "speedup_vs_torch" in o else "-"
                ks = r["ranks"][0][layout].get("kernels_us", {}).get(op, {})
                kdesc = ", ".join(f"{k} {v:.0f}" for k, v in list(ks.items())[:4] if k != BUSY)
                proto = r["protocol"] + ("*" if r.get("x_in_buffer") else "")
                lines.append(f"{r['backend']:<8} {proto:<5} {r['world_size']:>2} {layout:<6} {LABEL[op]:<15} {o['median_us']:>8.1f} "
                             f"{o['TBps']:>6.2f} {100 * o['ratio_roofline']:>5.1f}% {cp:>6} {tu:>9} {sp:>7} {kernels_total(ks):>8.1f} "
                             f"{o.get('host_us', float('nan')):>8.1f}  {kdesc}")
    if any(r["ranks"][0][lay].get("host_ops_us") for r in results for lay in r["layouts"]):
        lines.append("host, self time per call (rank 0, µs; the GPU idles while the host works after a sync):")
    for r in results:
        for layout, row in r["layouts"].items():
            for op in ops_of(row):
                hs = r["ranks"][0][layout].get("host_ops_us", {}).get(op, {})
                if hs:
                    top = ", ".join(f"{k} {v:.0f}" for k, v in list(hs.items())[:6])
                    lines.append(f"  {r['backend']:<8} {r['protocol']:<5} {r['world_size']:>2} {layout:<6} {LABEL[op]:<15} "
                                 f"total {sum(hs.values()):.0f}: {top}")
    phased = [(r, layout, ph) for r in results for layout in r["layouts"]
              if (ph := r["ranks"][0][layout].get("dispatch_host_phases"))]
    if phased:
        lines.append("dispatch, host wall time before / in / after its counts wait (rank 0, median µs; "
                     "the data kernel runs during the last two):")
    for r, layout, ph in phased:
        timed = r["ranks"][0][layout].get("dispatch_host_phases_timed")
        lines.append(f"  {r['backend']:<8} {r['protocol']:<5} {r['world_size']:>2} {layout:<6} "
                     + " / ".join(f"{ph[k]['median_us']:.0f}" for k in HOST_PHASES)
                     + (" (timed calls: " + " / ".join(f"{timed[k]['median_us']:.0f}" for k in HOST_PHASES) + ")"
                        if timed else ""))
    roofs = sorted({round(r['copy_roofline_TBps'], 2) for r in results})
    lines.append(f"copy roofline (read + write, whole device): {', '.join(map(str, roofs))} TB/s; "
                 "%copy: a copy of the op's bytes (per GPU) timed the same way, over the op's time; "
                 "host us: the host's wall time inside the call, the GPU idle before it")
    if any("cached_dispatch" in row for r in results for row in r["layouts"].values()):
        lines.append("cached dispatch: dispatch(x, handle=...) along the last dispatch's routing "
                     "(no routing kernels, no host wait)")
    if any("worst_dispatch" in row for r in results for row in r["layouts"].values()):
        lines.append("worst dispatch: dispatch(..., num_worst_tokens=W*T), DeepEP's worst-case outputs "
                     "(torch and nccl: no host wait)")
    if any(r.get("x_in_buffer") for r in results):
        lines.append("proto*: x built in Buffer.input_view, dispatched where it lies (no publish copy)")
    shares = sorted({(r["world_size"], r.get("mps_thread_percentage", 0)) for r in results if r.get("mps_thread_percentage")})
    if shares:
        lines.append("MPS share of every rank, all backends alike: " + ", ".join(f"W={w}: {p} %" for w, p in shares))
    return "\n".join(lines)


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return f"cpu ({platform.processor() or platform.machine()}, no CUDA)"


def provenance(command: str) -> dict[str, str]:
    """What every results JSON starts with: date (UTC), commit, device, torch, and the command
    (``SYMMOE_COMMIT`` / ``SYMMOE_BENCH_COMMAND`` override what git and argv say: the GPU
    machine's copy of the repository may not know its commit)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("SYMMOE_COMMIT") or _git_commit(), "device": _device_name(),
            "torch": torch.__version__, "command": os.environ.get("SYMMOE_BENCH_COMMAND", command)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m symmoe.bench", description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", default="1", help="comma-separated local rank counts, e.g. 1,4")
    p.add_argument("--backends", default="torch", help="comma-separated: torch,nvshmem,nccl (same run, same shape)")
    p.add_argument("--protocols", default="pull", help="comma-separated: pull,push (each backend runs those it has)")
    p.add_argument("--tokens", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--num-sms", type=int, default=0, help="0: every SM of the device")
    p.add_argument("--set", action="append", type=parse_key_value, default=[], metavar="KEY=VALUE",
                   help="config value for every run, e.g. --set kernel.copy_bytes=7168 (repeatable)")
    p.add_argument("--x-in-buffer", choices=("no", "yes", "both"), default="no",
                   help="x built in Buffer.input_view (the Mega MoE way: no publish copy); both: each pull run "
                        "twice, each push run once with x outside the buffer (a push reads x where it lies)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    placements = {"no": [False], "yes": [True], "both": [False, True]}[a.x_in_buffer]
    sets = dict(a.set)
    sms = a.num_sms or gpu_sms(torch.device("cuda", 0)).total
    results = []
    for backend in a.backends.split(","):
        for proto in a.protocols.split(","):
            if proto not in BACKENDS[backend].protocols:
                continue
            for ws in [int(v) for v in a.world_sizes.split(",")]:
                if backend == "nccl" and ws > torch.cuda.device_count():
                    print(f"skipping nccl at world size {ws}: NCCL needs one GPU per rank", flush=True)
                    continue
                cfg = bench_config(proto, sms, backend=backend, **sets)
                for in_buf in placements if proto == "pull" else placements[:1]:
                    results.append(run_gpu_bench(cfg, ws, a.tokens, a.warmup, a.repeats, baselines=(ws == 1),
                                                 x_in_buffer=in_buf))
                    print(table(results[-1:]), flush=True)
    doc = {**provenance(" ".join(["python -m symmoe.bench", *(argv or [])])), "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(table(results))
    return 0


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
