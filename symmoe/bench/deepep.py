"""symmoe's backends beside DeepEP V1 on one seeded workload, in one job.

Every rank builds DeepEP's ``deep_ep.Buffer`` (when ``deep_ep`` imports; never required) and
one ``symmoe.compat.deep_ep_v1.Buffer`` per symmoe config, and drives them all with the same
DeepEP-shaped code: ``get_dispatch_layout`` once per batch size, then, for each repeat and
each implementation in turn (interleaved, so they share the device's state; in a balanced
order, each following each other equally often: ``timing.balanced``):
``dispatch`` (exact size: the host learns the counts), ``dispatch(num_worst_tokens=W*T)``,
the cached ``dispatch(x, handle=...)`` and ``combine``.

Timing is what a user of either library sees: the hosts meet at a (gloo) barrier, the device
is idle, then CUDA events bracket the whole call (its host work, launches and any host wait).
A cell's time is the median over repeats on each rank, then the slowest rank's median.
``ratio`` = DeepEP's time / symmoe's time (above 1: symmoe is faster).

Outputs are compared too: symmoe's ``recv_x`` and ``combined_x`` against DeepEP's, bitwise
(rank-major rows ordered by source rank and token; combine summed in fp32 in rank order).

``--fp8 float32`` (or ``ue8m0``) adds two ops in the same run: ``fp8_dispatch`` and
``fp8_cached_dispatch``, where every implementation dispatches ``(x_e4m3, scales)`` quantized
from the same rows (DeepEP V1's FP8 dispatch; its scales are float32 only); their received
e4m3 bytes and scales are compared bitwise with DeepEP's too. The report says the bytes a row
moves in each (``fp8_rows``: H + scale bytes rounded up to 16, against 2H for bfloat16).

``--profile`` adds, per implementation and op, the device time of the kernels of a few calls
(torch.profiler) beside the call's time: a call much longer than its kernels is spending its
time on the host or waiting for peers.

``python -m symmoe.bench.deepep --world-sizes 2,4 --tokens 128,512,4096 --json out.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

from .. import launch
from ..config import from_dict, load, parse_key_value
from .gpu import provenance
from .timing import balanced, profile_table

OPS = ("dispatch", "worst_dispatch", "cached_dispatch", "combine")
FP8_OPS = ("fp8_dispatch", "fp8_cached_dispatch")  # with --fp8: x as (e4m3, scales), same run
FP8_KINDS = ("none", "float32", "ue8m0")
MPS_SHARES = ("auto", "default", "split")
SHAPE = {"hidden": 7168, "topk": 8, "num_experts": 256}  # DeepSeek-V3


def rank_env(world_size: int, mps_share: str, *backends: str) -> dict[str, str]:
    """Environment of ranks sharing the GPUs: torch's symmetric memory allowed on one device, and
    the MPS share. ``default``: each rank at MPS's default (DeepEP V1 needs it: at 25 % its
    combine timed out at W=4 on an H100); ``split``: 100/W percent each (NVSHMEM's full
    multi-process mode needs the shares of one GPU to sum to <= 100); ``auto``: split when an
    nvshmem backend runs its put protocol (``SYMMOE_NVSHMEM_PUTS``/``_STAGE``: its senders and
    receivers spin side by side), else default (on one node nvshmem runs the shared kernels)."""
    from ..backends.nvshmem import put_protocol_forced

    env = {"TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES": "1"}
    split = mps_share == "split" or (mps_share == "auto" and "nvshmem" in backends and put_protocol_forced())
    share = launch.mps_share(world_size)
    if split and share:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
    return env


DEEPEP_SMS = 20  # DeepEP V1's default Buffer.num_sms


def deepep_num_sms(world_size: int, device_sms: int, default: int = DEEPEP_SMS) -> int:
    """DeepEP V1's SMs per rank when ``world_size`` ranks share one GPU of ``device_sms`` SMs: its
    default, unless W of them would not all be resident at once, then the most even count that
    is (its intranode kernels spin on each other's blocks: at W = 8 on an H100, 8 x 20 > 132 SMs
    and its dispatch senders timed out, killing the job)."""
    if world_size * default <= device_sms:
        return default
    return max(2, device_sms // world_size // 2 * 2)


def _inputs(T: int, W: int, rank: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """x (bf16), topk_idx (int64) and topk_weights (fp32) of this rank: scores |randn| + 1,
    top-k of them, as DeepEP's tests draw them."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    H, K, E = SHAPE["hidden"], SHAPE["topk"], SHAPE["num_experts"]
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    scores = torch.randn(T, E, generator=gen).abs() + 1
    w, idx = torch.topk(scores, K, dim=-1, largest=True, sorted=False)
    return x.to(device), idx.to(device), w.float().to(device)


class Impl:
    """One implementation under the DeepEP V1 API: its buffer and the four timed calls."""

    def __init__(self, name: str, buffer: Any):
        self.name, self.buf = name, buffer
        self.state: dict[str, Any] = {}

    def prepare(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, num_experts: int,
                x8: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        per_rank, _, per_expert, in_rank, _ = self.buf.get_dispatch_layout(idx, num_experts)
        self.state = {"x": x, "x8": x8, "idx": idx, "w": w, "layout": (per_rank, per_expert, in_rank)}
        self.call("dispatch")  # a handle for the cached dispatch and combine
        if x8 is not None:
            self.call("fp8_dispatch")

    def call(self, op: str) -> Any:
        s = self.state
        per_rank, per_expert, in_rank = s["layout"]
        if op in ("dispatch", "worst_dispatch", "fp8_dispatch"):
            worst = s["x"].shape[0] * self.buf.group_size if op == "worst_dispatch" else 0
            out = self.buf.dispatch(s["x8"] if op == "fp8_dispatch" else s["x"], topk_idx=s["idx"],
                                    topk_weights=s["w"], num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                    num_tokens_per_expert=per_expert, num_worst_tokens=worst)
            if op == "dispatch":
                s["recv"], s["handle"] = out, out[4]
            if op == "fp8_dispatch":
                s["recv8"], s["handle8"] = out, out[4]
            return out
        if op == "cached_dispatch":
            return self.buf.dispatch(s["x"], handle=s["handle"])
        if op == "fp8_cached_dispatch":
            return self.buf.dispatch(s["x8"], handle=s["handle8"])
        recv_x, _, recv_w = s["recv"][:3]
        return self.buf.combine(recv_x, s["handle"], topk_weights=recv_w)


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    """µs of one whole call, hosts aligned and the device idle before it."""
    torch.cuda.synchronize()
    sync()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    del out
    return start.elapsed_time(end) * 1e3


def timed_rounds(impls: list[Any], ops: tuple[str, ...], repeats: int,
                 time_call: Callable[[Any, str], float]) -> dict[str, dict[str, list[float]]]:
    """``time_call(impl, op)`` of every implementation (``.name``) and op, ``repeats`` rounds,
    interleaved in a carry-over balanced order (``timing.balanced``), so none is always the one
    right after another library's calls. {name: {op: [times]}}."""
    times: dict[str, dict[str, list[float]]] = {im.name: {op: [] for op in ops} for im in impls}
    for rep in range(repeats):
        for im in balanced(impls, rep):
            for op in ops:
                times[im.name][op].append(time_call(im, op))
    return times


def _kernel_us(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 5) -> dict[str, float]:
    """Per call: the kernels' summed device time and the names of the kernels, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            sync()
            fn()
            torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name and "Memset" not in e.name:
            kernels[e.name[:60]] = kernels.get(e.name[:60], 0.0) + e.device_time / calls
    return {"total": sum(kernels.values()), **kernels}


class _Clock:
    """Host seconds spent in wrapped callables, by name (``--trace-host``)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t0
        return timed


class _CtxProxy:
    """A kernel object (the context, the low-latency kernels) with every method call timed on the host."""

    def __init__(self, ctx: Any, clock: _Clock, prefix: str = "ctx"):
        self._ctx, self._clock, self._prefix = ctx, clock, prefix

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ctx, name)
        return self._clock.wrap(f"{self._prefix}.{name}", attr) if callable(attr) else attr


def host_split(fn: Callable[[], Any], sync: Callable[[], None], targets: list[tuple[Any, str, str]],
               proxies: list[tuple[Any, str, str]] = (), calls: int = 20,
               device_sync: Callable[[], None] = torch.cuda.synchronize) -> dict[str, float]:
    """Host µs per call of ``fn`` (``call``) and of each callable in it that ``targets`` names
    (``(object, attribute, label)``: the attribute wrapped for the ``calls`` calls, then put
    back) and of every method of each ``proxies`` object (``(object, attribute, prefix)``: a
    pybind11 kernel object, its launches); the longest first."""
    clock = _Clock()
    saved: list[tuple[Any, str, Any]] = []
    try:
        for obj, attr, label in targets:
            if hasattr(obj, attr):
                saved.append((obj, attr, obj.__dict__.get(attr)))
                setattr(obj, attr, clock.wrap(label, getattr(obj, attr)))
        for obj, attr, prefix in proxies:
            if hasattr(obj, attr):
                saved.append((obj, attr, obj.__dict__.get(attr)))
                setattr(obj, attr, _CtxProxy(getattr(obj, attr), clock, prefix))
        whole = clock.wrap("call", fn)
        for _ in range(calls):
            device_sync()
            sync()
            whole()
            device_sync()
    finally:
        for obj, attr, old in reversed(saved):
            if old is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
    return {k: round(v / calls * 1e6, 1) for k, v in sorted(clock.spent.items(), key=lambda kv: -kv[1])}


def _trace_host(im: Impl, op: str, sync: Callable[[], None], calls: int = 20) -> dict[str, float]:
    """Host µs per call of the whole call and, for symmoe, of its layers and each kernel-context
    method (launches): where a call's host time goes."""
    sym = getattr(im.buf, "symmoe", None)
    targets: list[tuple[Any, str, str]] = []
    proxies: list[tuple[Any, str, str]] = []
    if sym is not None:
        proto = sym._protocol
        targets = [(sym, "dispatch", "Buffer.dispatch"), (sym, "combine", "Buffer.combine"),
                   (proto, "dispatch", "protocol.dispatch"), (proto, "dispatch_cached", "protocol.dispatch_cached"),
                   (proto, "combine", "protocol.combine"), (proto, "_wait_counts", "protocol._wait_counts")]
        from .. import buffer as buffer_mod
        from ..protocol import base as base_mod, counts as counts_mod, cuda as cuda_mod

        for obj, attr in ((buffer_mod.validate, "check_dispatch"), (buffer_mod.validate, "check_cached_dispatch"),
                          (buffer_mod.validate, "check_combine"), (buffer_mod.EventOverlap, "record"),
                          (base_mod.Protocol, "_outputs"), (cuda_mod, "make_handle"), (cuda_mod, "recv_views"),
                          (cuda_mod, "summarized_result"), (counts_mod, "cached_rows"), (cuda_mod, "cached_rows")):
            targets.append((obj, attr, f"{getattr(obj, '__name__', obj)}.{attr}"))
        proxies = [(proto, "ctx", "ctx")]
    return host_split(lambda: im.call(op), sync, targets, proxies, calls)


def _api_table(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 10, rows: int = 30) -> str:
    """torch.profiler's host table of ``calls`` calls: each torch op and CUDA runtime call
    (launches, copies, syncs) with its self CPU time, the longest first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            sync()
            fn()
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=50)


def _py_table(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 20, rows: int = 40) -> str:
    """cProfile's account of ``calls`` calls of ``fn`` (``timing.profile_table``), each after
    the device and the ranks lined up."""
    import cProfile

    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        sync()
        prof.enable()
        fn()
        prof.disable()
        torch.cuda.synchronize()
    return profile_table(prof, calls, rows)


def _python_us(n: int = 100000) -> float:
    """µs of a plain Python loop of ``n`` additions: how fast this host runs Python."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(n):
        acc += i
    return round((time.perf_counter() - t0) * 1e6, 1)


def _launch_us(calls: int = 200) -> float:
    """Host µs of one tiny torch kernel launch on this process: the floor every launch pays."""
    t = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        t.add_(1)
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return round(dt / calls * 1e6, 2)


def _bitwise(a: torch.Tensor | tuple, b: torch.Tensor | tuple) -> bool:
    """Bit patterns equal; FP8 pairs: the e4m3 bytes and the scales (whatever their strides)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and all(_bitwise(p, q) for p, q in zip(a, b))
    from ..testing.compare import bits
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def _rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from ..compat import deep_ep_v1

    device = launch.local_gpu(rank)
    group = dist.group.WORLD
    sync = dist.barrier
    maxT = max(spec["tokens"])
    impls: list[Impl] = []
    notes: dict[str, str] = {}
    deepep_sms = 0
    if spec["deepep"]:
        try:
            import deep_ep
            sms = deepep_num_sms(world_size, torch.cuda.get_device_properties(device).multi_processor_count,
                                 deep_ep.Buffer.num_sms)
            deep_ep.Buffer.set_num_sms(sms)  # its dispatch / combine configs read it
            hidden_bytes = SHAPE["hidden"] * 2
            nvl = max(deep_ep.Buffer.get_dispatch_config(world_size).get_nvl_buffer_size_hint(hidden_bytes, world_size),
                      deep_ep.Buffer.get_combine_config(world_size).get_nvl_buffer_size_hint(hidden_bytes, world_size))
            impls.append(Impl("deepep", deep_ep.Buffer(group, nvl, 0)))
            deepep_sms = sms  # recorded only for a DeepEP that runs
        except Exception as e:  # reported beside symmoe's numbers, never fatal
            notes["deepep"] = f"{type(e).__name__}: {e}"
    for name, cfg in spec["configs"].items():
        c = from_dict(cfg).replace(**{"buffer.max_tokens_per_rank": maxT})
        impls.append(Impl(name, deep_ep_v1.Buffer(group, symmoe_config=c)))

    fp8_kind = spec.get("fp8", "none")
    ops = OPS + (FP8_OPS if fp8_kind != "none" else ())
    cells: dict[str, Any] = {}
    for T in spec["tokens"]:
        x, idx, w = _inputs(T, world_size, rank, spec["seed"], device)
        x8 = None
        if fp8_kind != "none":
            from .. import fp8
            x8 = fp8.quantize(x, fp8_kind)
        live = []
        for im in impls:
            try:
                im.prepare(x, idx, w, SHAPE["num_experts"], x8)
                live.append(im)
            except Exception as e:
                notes[f"{im.name}@{T}"] = f"{type(e).__name__}: {e}"
        for _ in range(spec["warmup"]):
            for im in live:
                for op in ops:
                    im.call(op)
        torch.cuda.synchronize()
        times = timed_rounds(live, ops, spec["repeats"], lambda im, op: _timed(lambda: im.call(op), sync))
        cell: dict[str, Any] = {"median_us": {n: {op: statistics.median(v) for op, v in t.items()} for n, t in times.items()}}
        ref = next((im for im in live if im.name == "deepep"), None)
        if ref is not None:
            want_x = ref.state["recv"][0]
            want_c = ref.call("combine")[0]
            cell["bitwise_vs_deepep"] = {
                im.name: {"recv_x": _bitwise(im.state["recv"][0], want_x), "combined_x": _bitwise(im.call("combine")[0], want_c)}
                for im in live if not im.name.startswith("deepep")}
            if x8 is not None:
                for im in live:
                    if not im.name.startswith("deepep"):
                        cell["bitwise_vs_deepep"][im.name]["fp8_recv_x"] = _bitwise(im.state["recv8"][0],
                                                                                  ref.state["recv8"][0])
        if spec["profile"] and T in spec["profile"]:
            cell["kernels_us"] = {im.name: {op: _kernel_us(lambda: im.call(op), sync) for op in ops} for im in live}
        if T in spec["trace_api"]:
            tables = {im.name: {op: _api_table(lambda: im.call(op), sync) for op in ops} for im in live}
            if rank == 0:
                cell["api_tables"] = tables
        if T in spec.get("trace_py", ()):
            tables = {im.name: {op: _py_table(lambda: im.call(op), sync) for op in ops} for im in live
                      if im.name != "deepep"}
            if rank == 0:
                cell["py_tables"] = tables
        if T in spec["trace_host"]:
            cell["python_loop_us"] = _python_us()
            cell["launch_us"] = _launch_us()
            cell["host_us"] = {im.name: {op: _trace_host(im, op, sync) for op in ops} for im in live}
        cells[str(T)] = cell
        torch.cuda.synchronize()
    for im in impls:
        if im.name != "deepep":  # DeepEP's buffer frees itself (explicitly_destroy=False)
            im.buf.destroy()
    return {"cells": cells, "notes": notes, "deepep_num_sms": deepep_sms}


def _slowest(ranks: list[dict[str, Any]], T: str, name: str, op: str) -> float | None:
    vals = [r["cells"][T]["median_us"].get(name, {}).get(op) for r in ranks if T in r["cells"]]
    return max(vals) if vals and None not in vals else None


def summarize(world_size: int, ranks: list[dict[str, Any]], names: list[str], mps: str) -> dict[str, Any]:
    """One row per (tokens, op): each implementation's slowest-rank median and its ratio to DeepEP."""
    rows = []
    for T in ranks[0]["cells"]:
        timed = ranks[0]["cells"][T]["median_us"].values()
        for op in (op for op in OPS + FP8_OPS if any(op in m for m in timed)):
            row: dict[str, Any] = {"world_size": world_size, "tokens": int(T), "op": op, "us": {}, "ratio": {}}
            for n in names:
                v = _slowest(ranks, T, n, op)
                if v is not None:
                    row["us"][n] = round(v, 1)
            base = row["us"].get("deepep")
            for n, v in row["us"].items():
                if base and not n.startswith("deepep"):
                    row["ratio"][n] = round(base / v, 3)
            rows.append(row)
    same = {}
    for T in ranks[0]["cells"]:
        per = [r["cells"][T].get("bitwise_vs_deepep") for r in ranks]
        if all(per):
            same[T] = {n: all(all(p[n].values()) for p in per) for n in per[0]}
    return {"world_size": world_size, "mps_share": mps, "deepep_num_sms": ranks[0].get("deepep_num_sms", 0),
            "rows": rows, "bitwise_vs_deepep": same,
            "kernels_us": {T: [r["cells"][T].get("kernels_us") for r in ranks] for T in ranks[0]["cells"]
                           if "kernels_us" in ranks[0]["cells"][T]},
            "api_tables": {T: ranks[0]["cells"][T]["api_tables"] for T in ranks[0]["cells"]
                           if "api_tables" in ranks[0]["cells"][T]},
            "py_tables": {T: ranks[0]["cells"][T]["py_tables"] for T in ranks[0]["cells"]
                          if "py_tables" in ranks[0]["cells"][T]},
            "host_us": {T: [{"launch_us": r["cells"][T]["launch_us"], "python_loop_us": r["cells"][T]["python_loop_us"],
                             **r["cells"][T]["host_us"]} for r in ranks]
                        for T in ranks[0]["cells"] if "host_us" in ranks[0]["cells"][T]},
            "notes": {r_i: r["notes"] for r_i, r in enumerate(ranks) if r["notes"]}}


def fp8_rows(kind: str, hidden: int = SHAPE["hidden"]) -> dict[str, Any]:
    """The bytes one row moves in symmoe's FP8 dispatch with ``kind`` scales and in its bfloat16
    dispatch, and their ratio."""
    from .. import fp8
    rb = fp8.formats(hidden)[kind].row_bytes(hidden)
    return {"scales": kind, "fp8_row_bytes": rb, "bf16_row_bytes": 2 * hidden, "ratio": round(rb / (2 * hidden), 3)}


def fp8_rows_line(rows: dict[str, Any]) -> str:
    return (f"FP8 rows ({rows['scales']} scales) move {rows['fp8_row_bytes']} bytes each, bfloat16 rows "
            f"{rows['bf16_row_bytes']} ({rows['ratio']:.2f}x).\n")


def markdown(results: list[dict[str, Any]]) -> str:
    """The table: each op's µs per implementation with its ratio to DeepEP; a cell whose
    outputs were not bitwise equal to DeepEP's on every rank is marked, and a line says so."""
    names = sorted({n for res in results for row in res["rows"] for n in row["us"]}, key=lambda n: (n != "deepep", n))
    head = "| W | tokens/rank | op | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (3 + len(names))]
    differ = []
    for res in results:
        same = res.get("bitwise_vs_deepep", {})
        for row in res["rows"]:
            cells = []
            for n in names:
                v = row["us"].get(n)
                r = row["ratio"].get(n)
                bad = same.get(str(row["tokens"]), {}).get(n) is False
                cells.append("—" if v is None else (f"{v:.0f} ({r:.2f})" if r else f"{v:.0f}") + (" ≠" if bad else ""))
                if bad and (res["world_size"], row["tokens"], n) not in differ:
                    differ.append((res["world_size"], row["tokens"], n))
            lines.append(f"| {res['world_size']} | {row['tokens']} | {row['op']} | " + " | ".join(cells) + " |")
    capped = [(res["world_size"], res["deepep_num_sms"]) for res in results
              if res.get("deepep_num_sms") and res["deepep_num_sms"] != DEEPEP_SMS]
    if capped:
        lines.append("")
        lines.append("DeepEP V1 at fewer SMs than its default " + str(DEEPEP_SMS) + " per rank, so that every rank's "
                     "blocks are resident at once: " + ", ".join(f"{n} at W={w}" for w, n in capped))
    if differ:
        lines.append("")
        lines.append("≠ outputs not bitwise equal to DeepEP's: " + ", ".join(f"{n} at W={w}, {t} tokens"
                                                                        for w, t, n in differ))
    return "\n".join(lines) + "\n"


def _deepep_version() -> str:
    """DeepEP's version where it imports here (its package metadata, else its path), '' if not."""
    try:
        import deep_ep
    except ImportError:
        return ""
    try:
        from importlib.metadata import version
        return version("deep_ep")
    except Exception:
        return getattr(deep_ep, "__file__", "") or "unknown"


def _config_arg(text: str) -> tuple[str, dict[str, Any]]:
    """NAME=PATH[,key=value...]: a symmoe config file with overrides."""
    name, _, rest = text.partition("=")
    if not rest:
        raise argparse.ArgumentTypeError(f"--config {text!r}: expected NAME=PATH[,key=value...]")
    path, *sets = rest.split(",")
    cfg = load(path).replace(**dict(parse_key_value(s) for s in sets))
    return name, cfg.to_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m symmoe.bench.deepep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--tokens", default="128,512,1024,4096,8192")
    ap.add_argument("--config", action="append", type=_config_arg, default=[],
                    help="NAME=PATH[,key=value...] (repeatable); default: torch push and pull, nvshmem")
    ap.add_argument("--fp8", choices=FP8_KINDS, default="none",
                    help="also time fp8_dispatch and fp8_cached_dispatch: x as (e4m3, scales of this kind)")
    ap.add_argument("--no-deepep", action="store_true", help="symmoe alone, even where deep_ep imports")
    ap.add_argument("--mps-share", choices=MPS_SHARES, default="auto",
                    help="default: every rank at MPS's default share; split: 100/W percent each (nvshmem needs it); "
                         "auto: split when an nvshmem config runs")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="", help="token counts whose kernels to profile (comma list)")
    ap.add_argument("--trace-host", default="", help="token counts whose calls' host time is split by layer and launch")
    ap.add_argument("--trace-api", default="", help="token counts whose calls' torch ops and CUDA API calls rank 0 tables")
    ap.add_argument("--trace-py", default="", help="token counts whose symmoe calls rank 0 profiles (cProfile, by own time)")
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("symmoe.bench.deepep: needs a CUDA GPU", file=sys.stderr)
        return 2
    configs = dict(args.config) or {
        "torch-push": load("configs/torch.yaml").replace(protocol="push").to_dict(),
        "torch-pull": load("configs/torch.yaml").replace(protocol="pull").to_dict(),
    }
    spec = {"tokens": [int(t) for t in args.tokens.split(",")], "configs": configs, "deepep": not args.no_deepep,
            "fp8": args.fp8,
            "repeats": args.repeats,
            "warmup": args.warmup, "seed": args.seed, "profile": [int(t) for t in args.profile.split(",") if t],
            "trace_host": [int(t) for t in args.trace_host.split(",") if t],
            "trace_api": [int(t) for t in args.trace_api.split(",") if t],
            "trace_py": [int(t) for t in args.trace_py.split(",") if t]}
    names = (["deepep"] if spec["deepep"] else []) + list(configs)
    rows = fp8_rows(args.fp8) if args.fp8 != "none" else None
    if rows:
        print(fp8_rows_line(rows), flush=True)
    results = []
    for W in (int(w) for w in args.world_sizes.split(",")):
        env = rank_env(W, args.mps_share, *(c["backend"] for c in configs.values()))
        t0 = time.time()
        try:
            ranks = launch.spawn(_rank, W, (spec,), env=env, timeout_s=300)
        except launch.RankFailed as e:
            print(f"W={W}: {e}", file=sys.stderr)
            results.append({"world_size": W, "mps_share": args.mps_share, "rows": [], "error": str(e)})
            continue
        res = summarize(W, ranks, names, env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "default"))
        res["seconds"] = round(time.time() - t0, 1)
        results.append(res)
        print(markdown([res]), flush=True)
    doc = {**provenance("python -m symmoe.bench.deepep " + " ".join(argv if argv is not None else sys.argv[1:])),
           "deepep": _deepep_version(), "configs": configs, "results": results,
           **({"fp8_rows": rows} if rows else {})}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(results) + (f"\n{fp8_rows_line(rows)}" if rows else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
