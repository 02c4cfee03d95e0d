"""The low-latency mode at decode sizes, beside normal-mode dispatch/combine, in one job.

Every rank drives, at each token count (DeepSeek-V3's shape: hidden 7168 bf16, top-8 of 256):

* ``deepep``: DeepEP V1's normal-mode ``dispatch`` / ``combine`` (when ``deep_ep`` imports);
* ``symmoe-normal``: symmoe's normal mode through the same DeepEP-shaped calls (torch push);
* ``symmoe-ll``: symmoe's ``low_latency_dispatch`` / ``low_latency_combine`` (T_max = tokens);
  ``symmoe-ll-fp8``: its dispatch with ``use_fp8=True`` (the cast included; hidden % 128 == 0);
* a step, dispatch -> a per-expert scale of the received rows only (``recv_count``; one
  kernel, ``symmoe.testing.low_latency.masked_expert_op``) -> combine: ``step-eager`` (three
  calls from Python) and ``step-graph`` (the same step captured once in a CUDA graph,
  replayed). Every checked replay's output is compared bitwise with the eager step's
  (``graph_bitwise``).

Whole calls are timed as ``symmoe.bench.deepep`` times them: the hosts meet at a (gloo)
barrier with the device idle, then CUDA events bracket the call, host work included; a
cell is the median over repeats on each rank, then the slowest rank's. Phases: after the
timed repeats, a few dispatch + combine pairs run with the kernels' global-timer stamps on
(``set_stamps``), and each phase's median µs is reported, the slowest rank's (``phases_us``;
``--no-phases`` skips it): ``send`` (the send kernel, first block's start to last block's end),
``gap`` (send end to receive start: launch and host), ``wait`` (receive start until its last
block got every flag: the slowest peer's send), ``recv`` (from there to the receive's end),
``device`` (send start to receive end) and ``host`` (the call's host time, Python and launches,
until it returns: where it exceeds ``device`` the call is bound by the host). ``--trace-host``
then splits that host time by layer (``host_split_us``, rank 0's: the Buffer call, its checks,
the engine, its outputs, each pybind11 launch of ``ll``/``mod``), beside the host's speed
(``python_loop_us``: a plain loop of 100000 additions; ``launch_us``: one tiny torch launch).

``python -m symmoe.bench.low_latency --world-sizes 2,4 --tokens 128 --json ll.json``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from .. import launch
from ..config import Config, parse_key_value
from .deepep import SHAPE, Impl, _inputs, _launch_us, _python_us, _timed, host_split, rank_env
from .gpu import provenance
from .timing import balanced

OPS = ("dispatch", "combine", "step")


def _config(T: int, sets: dict[str, Any] | None = None) -> Config:
    """symmoe's config for both modes (torch push); ``sets``: ``--set`` overrides, e.g.
    ``low_latency.num_sms`` (the low-latency kernels' grid) or ``kernel.num_sms`` (the normal mode's)."""
    return Config().replace(**{"backend": "torch", "protocol": "push", "buffer.hidden": SHAPE["hidden"],
                               "buffer.topk": SHAPE["topk"], "buffer.num_experts": SHAPE["num_experts"],
                               "buffer.max_tokens_per_rank": T, "buffer.dtype": "bfloat16",
                               "torch.allow_overlapping_devices": True, **(sets or {})})


def _rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from ..buffer import Buffer
    from ..compat import deep_ep_v1
    from ..testing.low_latency import masked_expert_op

    device = launch.local_gpu(rank)
    group, sync = dist.group.WORLD, dist.barrier
    E, L = SHAPE["num_experts"], SHAPE["num_experts"] // world_size
    cells: dict[str, Any] = {}
    notes: dict[str, str] = {}
    deepep = None
    if spec["deepep"]:
        try:
            import deep_ep
            hb = SHAPE["hidden"] * 2
            nvl = max(deep_ep.Buffer.get_dispatch_config(world_size).get_nvl_buffer_size_hint(hb, world_size),
                      deep_ep.Buffer.get_combine_config(world_size).get_nvl_buffer_size_hint(hb, world_size))
            deepep = Impl("deepep", deep_ep.Buffer(group, nvl, 0))
        except Exception as e:  # reported beside symmoe's numbers, never fatal
            notes["deepep"] = f"{type(e).__name__}: {e}"
    for T in spec["tokens"]:
        x, idx, w = _inputs(T, world_size, rank, spec["seed"], device)
        normal = Impl("symmoe-normal", deep_ep_v1.Buffer(group, symmoe_config=_config(T, spec["sets"])))
        impls = ([deepep] if deepep is not None else []) + [normal]
        for im in impls:
            im.prepare(x, idx, w, E)
        buf = Buffer(group, _config(T, spec["sets"]))
        scale = (torch.arange(L, device=device, dtype=torch.float32) / L + 0.5).to(torch.bfloat16)
        st: dict[str, Any] = {}

        def ll_dispatch() -> Any:
            st["d"] = buf.low_latency_dispatch(x, idx, T, E)
            return st["d"]

        def ll_dispatch_fp8() -> Any:  # DeepEP's default: cast to e4m3, move data + scales
            return buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)

        def ll_combine() -> Any:
            recv_x, _, handle, _, _ = st["d"]
            return buf.low_latency_combine(recv_x, idx, w, handle)

        op_blocks = max(1, 4 * torch.cuda.get_device_properties(device).multi_processor_count // L)

        def step() -> torch.Tensor:
            recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E)
            return buf.low_latency_combine(masked_expert_op(recv_x, count, scale, op_blocks), idx, w, handle)[0]

        fp8_ok = x.shape[1] % 128 == 0
        if fp8_ok:
            ll_dispatch_fp8()
        ll_dispatch()
        ll_combine()
        eager = step().clone()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = step()
        torch.cuda.synchronize()
        sync()
        graph.replay()
        torch.cuda.synchronize()
        bitwise = bool(torch.equal(graph_out.view(torch.int16), eager.view(torch.int16)))
        times: dict[str, dict[str, list[float]]] = {im.name: {"dispatch": [], "combine": []} for im in impls}
        times["symmoe-ll"] = {"dispatch": [], "combine": []}
        if fp8_ok:
            times["symmoe-ll-fp8"] = {"dispatch": []}
        times["step-eager"], times["step-graph"] = {"step": []}, {"step": []}
        for _ in range(spec["warmup"]):
            for im in impls:
                im.call("dispatch"), im.call("combine")
            ll_dispatch(), ll_combine(), step(), graph.replay()
        torch.cuda.synchronize()
        # What each implementation times in a round, run together; the rounds interleave them
        # in a balanced order (timing.balanced): none always runs right after the same other.
        entries = [[(im.name, op, lambda im=im, op=op: im.call(op)) for op in ("dispatch", "combine")]
                   for im in impls]
        entries.append([("symmoe-ll", "dispatch", ll_dispatch), ("symmoe-ll", "combine", ll_combine)])
        if fp8_ok:
            entries.append([("symmoe-ll-fp8", "dispatch", ll_dispatch_fp8)])
        entries += [[("step-eager", "step", step)], [("step-graph", "step", graph.replay)]]
        for rep in range(spec["repeats"]):
            for entry in balanced(entries, rep):
                for name, op, fn in entry:
                    times[name][op].append(_timed(fn, sync))
            bitwise &= bool(torch.equal(graph_out.view(torch.int16), eager.view(torch.int16)))
        buf.check_low_latency(synchronize=True)
        cells[str(T)] = {"median_us": {n: {op: statistics.median(v) for op, v in t.items()} for n, t in times.items()},
                         "graph_bitwise": bitwise, "launch": buf._ll[2].shapes()}
        if spec["phases"]:
            cells[str(T)]["phases_us"] = _phases(buf._ll[2], ll_dispatch, ll_combine, sync, device)
            buf.check_low_latency(synchronize=True)
        if spec["trace_host"]:
            cells[str(T)]["host_split_us"] = _host_split(buf, ll_dispatch, ll_combine,
                                                         ll_dispatch_fp8 if fp8_ok else None, sync)
            buf.check_low_latency(synchronize=True)
        del graph
        buf.close()
        normal.buf.destroy()
    return {"cells": cells, "notes": notes}


PHASES = ("send", "gap", "wait", "recv", "device", "host")


def _host_split(buf: Any, ll_dispatch: Any, ll_combine: Any, ll_dispatch_fp8: Any, sync: Any) -> dict[str, Any]:
    """Host µs per call by layer (``symmoe.bench.deepep.host_split``): a dispatch + combine pair,
    and the FP8 dispatch alone, with the host's speed beside them."""
    from .. import buffer as buffer_mod
    from ..protocol import low_latency as engine_mod
    eng = buf._ll[2]
    targets = [(buf, "low_latency_dispatch", "Buffer.low_latency_dispatch"),
               (buf, "low_latency_combine", "Buffer.low_latency_combine"), (buf, "_low_latency", "Buffer._low_latency"),
               (buffer_mod.EventOverlap, "record", "EventOverlap.record"), (engine_mod, "stream_handle", "stream_handle"),
               (eng, "dispatch", "engine.dispatch"), (eng, "combine", "engine.combine"), (eng, "_outputs", "engine._outputs"),
               (eng, "fp8_rows", "engine.fp8_rows")]
    targets += [(buffer_mod.lowlat, name, f"low_latency.{name}")
                for name in ("check_dispatch", "check_fp8", "check_combine", "fp8_outputs")]
    proxies = [(eng, "ll", "ll"), (eng, "mod", "mod")]
    out: dict[str, Any] = {"python_loop_us": _python_us(), "launch_us": _launch_us()}
    out["dispatch+combine"] = host_split(lambda: (ll_dispatch(), ll_combine()), sync, targets, proxies)
    if ll_dispatch_fp8 is not None:
        out["fp8 dispatch"] = host_split(ll_dispatch_fp8, sync, targets, proxies)
    return out


def _phases(engine: Any, ll_dispatch: Any, ll_combine: Any, sync: Any, device: torch.device,
            calls: int = 20) -> dict[str, dict[str, float]]:
    """Median µs of each phase (PHASES) of the low-latency dispatch and combine, from the
    kernels' stamps over ``calls`` eager dispatch + combine pairs (hosts aligned first)."""
    stamps = torch.zeros(12, dtype=torch.int64, device=device)
    init = torch.zeros(12, dtype=torch.int64, device=device)
    init[0::3] = -1  # start columns take the minimum
    per_call: list[list[int]] = []
    host: dict[str, list[float]] = {"dispatch": [], "combine": []}
    engine.set_stamps(stamps)
    try:
        for _ in range(calls):
            stamps.copy_(init)
            torch.cuda.synchronize()
            sync()
            t0 = time.perf_counter()
            ll_dispatch()
            t1 = time.perf_counter()
            ll_combine()
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            per_call.append(stamps.tolist())
            host["dispatch"].append(t1 - t0)
            host["combine"].append(t2 - t1)
    finally:
        engine.set_stamps(None)
    out = phase_medians(per_call)
    for op, spent in host.items():
        out[op]["host"] = round(statistics.median(spent) * 1e6, 2)
    return out


def phase_medians(per_call: list[list[int]]) -> dict[str, dict[str, float]]:
    """Stamps of each call (12 ns values: send and receive kernel of dispatch, then of combine,
    each start, waited, end) -> the median µs of each phase per op."""
    out = {}
    for op, k in (("dispatch", 0), ("combine", 6)):
        def med(f: Any) -> float:
            return round(statistics.median(f(c[k:k + 6]) for c in per_call) / 1e3, 2)
        out[op] = {"send": med(lambda s: s[2] - s[0]), "gap": med(lambda s: s[3] - s[2]),
                   "wait": med(lambda s: s[4] - s[3]), "recv": med(lambda s: s[5] - s[4]),
                   "device": med(lambda s: s[5] - s[0])}
    return out


def summarize(world_size: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for T in ranks[0]["cells"]:
        names = ranks[0]["cells"][T]["median_us"]
        for name in names:
            for op in names[name]:
                us = max(r["cells"][T]["median_us"][name][op] for r in ranks)
                rows.append({"world_size": world_size, "tokens": int(T), "impl": name, "op": op, "us": round(us, 1)})
    return {"world_size": world_size, "rows": rows,
            "graph_bitwise": {T: all(r["cells"][T]["graph_bitwise"] for r in ranks) for T in ranks[0]["cells"]},
            "launch": {T: ranks[0]["cells"][T].get("launch") for T in ranks[0]["cells"]},
            "phases_us": {T: _slowest_phases([r["cells"][T].get("phases_us") for r in ranks])
                          for T in ranks[0]["cells"]},
            "host_split_us": {T: ranks[0]["cells"][T]["host_split_us"] for T in ranks[0]["cells"]
                              if "host_split_us" in ranks[0]["cells"][T]},
            "notes": {i: r["notes"] for i, r in enumerate(ranks) if r["notes"]}}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| W | tokens/rank | impl | op | µs (slowest rank's median) |", "|---|---|---|---|---|"]
    for res in results:
        for row in res["rows"]:
            lines.append(f"| {row['world_size']} | {row['tokens']} | {row['impl']} | {row['op']} | {row['us']:.0f} |")
        lines.append(f"| {res['world_size']} | | graph replay bitwise equal to eager | | {res.get('graph_bitwise')} |")
    phases = [(res["world_size"], T, op, p) for res in results for T, ops in (res.get("phases_us") or {}).items()
              if ops for op, p in ops.items()]
    if phases:
        lines += ["", "| W | tokens/rank | low-latency op | " + " | ".join(PHASES) + " |",
                  "|---|---|---|" + "---|" * len(PHASES)]
        lines += [f"| {W} | {T} | {op} | " + " | ".join(f"{p[n]:.1f}" if n in p else "-" for n in PHASES) + " |"
                  for W, T, op, p in phases]
        lines.append("(device µs from the kernels' stamps, host µs from the host's clock: median per rank, then the "
                     "slowest rank's)")
    for res in results:
        for T, split in (res.get("host_split_us") or {}).items():
            lines.append(f"\nW={res['world_size']}, {T} tokens, rank 0, host µs per call (python loop "
                         f"{split['python_loop_us']} µs, one launch {split['launch_us']} µs):")
            for what in ("dispatch+combine", "fp8 dispatch"):
                if what in split:
                    lines.append(f"- {what}: " + ", ".join(f"{k} {v}" for k, v in split[what].items()))
    return "\n".join(lines) + "\n"


def _slowest_phases(per_rank: list[Any]) -> dict[str, dict[str, float]] | None:
    """Each phase's slowest rank (None when a rank has none)."""
    if not per_rank or any(p is None for p in per_rank):
        return None
    return {op: {n: max(p[op][n] for p in per_rank) for n in per_rank[0][op]} for op in per_rank[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m symmoe.bench.low_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--tokens", default="128")
    ap.add_argument("--no-deepep", action="store_true", help="symmoe alone, even where deep_ep imports")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-phases", action="store_true", help="skip the phase times (the kernels' timer stamps)")
    ap.add_argument("--trace-host", action="store_true", help="split each call's host time by layer and launch")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="symmoe config value for both modes (repeatable), e.g. low_latency.num_sms=66")
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("symmoe.bench.low_latency: needs a CUDA GPU", file=sys.stderr)
        return 2
    spec = {"tokens": [int(t) for t in args.tokens.split(",")], "deepep": not args.no_deepep,
            "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed, "phases": not args.no_phases,
            "trace_host": args.trace_host,
            "sets": dict(parse_key_value(kv) for kv in args.set)}
    results = []
    status = 0
    for W in (int(w) for w in args.world_sizes.split(",")):
        env = rank_env(W, "default", "torch")
        t0 = time.time()
        try:
            ranks = launch.spawn(_rank, W, (spec,), env=env, timeout_s=300)
        except launch.RankFailed as e:
            print(f"W={W}: {e}", file=sys.stderr)
            results.append({"world_size": W, "rows": [], "error": str(e)})
            status = 1
            continue
        res = summarize(W, ranks)
        res["seconds"] = round(time.time() - t0, 1)
        results.append(res)
        print(markdown([res]), flush=True)
        print(f"low-latency launch shapes: {res['launch']}", flush=True)
        if res["notes"]:
            print(f"notes: {res['notes']}", flush=True)
        if not all(res["graph_bitwise"].values()):
            status = 1
    doc = {**provenance("python -m symmoe.bench.low_latency " + " ".join(argv if argv is not None else sys.argv[1:])),
           "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(results))
    return status


if __name__ == "__main__":
    sys.exit(main())
