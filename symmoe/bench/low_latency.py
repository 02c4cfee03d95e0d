"""The low-latency mode at decode sizes, beside normal-mode dispatch/combine, in one job.

Every rank drives, at each token count (DeepSeek-V3's shape: hidden 7168 bf16, top-8 of 256):

* ``deepep``: DeepEP V1's normal-mode ``dispatch`` / ``combine`` (when ``deep_ep`` imports);
* ``symmoe-normal``: symmoe's normal mode through the same DeepEP-shaped calls (torch push);
* ``symmoe-ll``: symmoe's ``low_latency_dispatch`` / ``low_latency_combine`` (T_max = tokens);
* a step, dispatch -> a per-expert scale -> combine: ``step-eager`` (three calls from Python)
  and ``step-graph`` (the same step captured once in a CUDA graph, replayed). Every checked
  replay's output is compared bitwise with the eager step's (``graph_bitwise``).

Whole calls are timed as ``symmoe.bench.deepep`` times them: the hosts meet at a (gloo)
barrier with the device idle, then CUDA events bracket the call, host work included; a
cell is the median over repeats on each rank, then the slowest rank's.

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
from .deepep import SHAPE, Impl, _inputs, _timed, rank_env
from .gpu import provenance

OPS = ("dispatch", "combine", "step")


def _config(T: int, sets: dict[str, Any] | None = None) -> Config:
    """symmoe's config for both modes (torch push); ``sets``: ``--set`` overrides, e.g.
    ``kernel.num_sms`` (the low-latency kernels' grid is capped by it)."""
    return Config().replace(**{"backend": "torch", "protocol": "push", "buffer.hidden": SHAPE["hidden"],
                               "buffer.topk": SHAPE["topk"], "buffer.num_experts": SHAPE["num_experts"],
                               "buffer.max_tokens_per_rank": T, "buffer.dtype": "bfloat16",
                               "torch.allow_overlapping_devices": True, **(sets or {})})


def _rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from ..buffer import Buffer
    from ..compat import deep_ep_v1

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
        scale = (torch.arange(L, device=device, dtype=torch.float32) / L + 0.5).to(torch.bfloat16).view(L, 1, 1)
        st: dict[str, Any] = {}

        def ll_dispatch() -> Any:
            st["d"] = buf.low_latency_dispatch(x, idx, T, E)
            return st["d"]

        def ll_combine() -> Any:
            recv_x, _, handle, _, _ = st["d"]
            return buf.low_latency_combine(recv_x, idx, w, handle)

        def step() -> torch.Tensor:
            recv_x, _, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E)
            return buf.low_latency_combine(recv_x * scale, idx, w, handle)[0]

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
        times["step-eager"], times["step-graph"] = {"step": []}, {"step": []}
        for _ in range(spec["warmup"]):
            for im in impls:
                im.call("dispatch"), im.call("combine")
            ll_dispatch(), ll_combine(), step(), graph.replay()
        torch.cuda.synchronize()
        for _ in range(spec["repeats"]):
            for im in impls:
                for op in ("dispatch", "combine"):
                    times[im.name][op].append(_timed(lambda: im.call(op), sync))
            times["symmoe-ll"]["dispatch"].append(_timed(ll_dispatch, sync))
            times["symmoe-ll"]["combine"].append(_timed(ll_combine, sync))
            times["step-eager"]["step"].append(_timed(step, sync))
            times["step-graph"]["step"].append(_timed(graph.replay, sync))
            bitwise &= bool(torch.equal(graph_out.view(torch.int16), eager.view(torch.int16)))
        buf.check_low_latency(synchronize=True)
        cells[str(T)] = {"median_us": {n: {op: statistics.median(v) for op, v in t.items()} for n, t in times.items()},
                         "graph_bitwise": bitwise}
        del graph
        buf.close()
        normal.buf.destroy()
    return {"cells": cells, "notes": notes}


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
            "notes": {i: r["notes"] for i, r in enumerate(ranks) if r["notes"]}}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| W | tokens/rank | impl | op | µs (slowest rank's median) |", "|---|---|---|---|---|"]
    for res in results:
        for row in res["rows"]:
            lines.append(f"| {row['world_size']} | {row['tokens']} | {row['impl']} | {row['op']} | {row['us']:.0f} |")
        lines.append(f"| {res['world_size']} | | graph replay bitwise equal to eager | | {res.get('graph_bitwise')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m symmoe.bench.low_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--tokens", default="128")
    ap.add_argument("--no-deepep", action="store_true", help="symmoe alone, even where deep_ep imports")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="symmoe config value for both modes (repeatable), e.g. kernel.num_sms=132")
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("symmoe.bench.low_latency: needs a CUDA GPU", file=sys.stderr)
        return 2
    spec = {"tokens": [int(t) for t in args.tokens.split(",")], "deepep": not args.no_deepep,
            "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
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
