"""``symmoe.nn.MoELayer`` forward + backward, per communication, in one job.

Every rank builds one ``MoELayer`` (rank-major, exact sizes; weights from the seed, so every
rank and every variant computes the same model) and runs the same steps -- router, dispatch,
experts, combine, shared expert forward; the backward of a random output gradient -- with
the layer's communication taken from, in turn:

* each symmoe config (``--config NAME=PATH``): the layer itself, over that config's Buffer;
* ``deepep``: DeepEP V1's ``deep_ep.Buffer`` where ``deep_ep`` imports (never required), and
  ``v1-shim``: the same DeepEP V1 code on ``symmoe.compat.deep_ep_v1`` (the import swap), on
  the first symmoe config; both through autograd functions written against the DeepEP V1 API
  as Megatron-Core writes them (dispatch's backward a combine, combine's a cached dispatch);
* ``a2a``: a plain ``torch.distributed.all_to_all_single`` dispatcher
  (``symmoe.bench.baselines.a2a_dispatch``/``a2a_combine``, with their backward passes).

Variants are interleaved per repeat, in a balanced order (each right after each other one
equally often: ``timing.balanced``). A step's forward and backward are timed apart (hosts
aligned at a barrier, the device idle; CUDA events on the GPU, the host clock on the CPU); a
cell is the slowest rank's median. ``ratio`` = the baseline's time / the variant's (above 1:
faster than the baseline; the baseline is ``deepep`` where it ran, else ``a2a``). Each
variant's output and x gradient are compared with the first variant's, bitwise.

``python -m symmoe.bench.layer --world-sizes 2,4 --tokens 4096 --json out.json --md out.md``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import autograd, launch
from ..config import from_dict, load
from .baselines import A2AHandle, _exchange, a2a_combine, a2a_dispatch
from .deepep import MPS_SHARES, _bitwise, _config_arg, markdown, rank_env
from .gpu import provenance
from .timing import balanced

PHASES = ("forward", "backward", "step")
# DeepSeek-V3's routed experts (hidden 7168, top-8 of 256), the expert width cut from 2048 to
# 1024 so that every rank's experts and their gradients fit one 80 GB GPU at any W.
SHAPE = {"hidden": 7168, "topk": 8, "num_experts": 256, "ffn_hidden": 1024}


# -- communications: (x, topk_idx, topk_weights) -> received rows, and back ---------------------------
class SymmoeComm:
    """The layer's own path: ``symmoe.autograd`` over a Buffer."""

    def __init__(self, buffer: Any):
        self.buffer = buffer

    def dispatch(self, x, idx, w):
        d = autograd.dispatch(self.buffer, x, idx, w, output_layout="rank")
        return d.x, d.topk_idx, d.topk_weights, d.handle

    def combine(self, y, handle):
        return autograd.combine(self.buffer, y, handle)


class DeepEPV1Comm:
    """Any DeepEP V1 ``Buffer`` (``deep_ep`` or ``symmoe.compat.deep_ep_v1``), with gradients."""

    def __init__(self, buffer: Any, num_experts: int):
        self.buffer, self.num_experts = buffer, num_experts

    def dispatch(self, x, idx, w):
        rx, ri, rw, handle = _V1Dispatch.apply(x, idx, w, self)
        return rx, ri, rw, handle

    def combine(self, y, handle):
        return _V1Combine.apply(y, handle, self)


class _V1Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx, w, comm):
        buf = comm.buffer
        per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, comm.num_experts)
        rx, ri, rw, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=per_rank,
                                                num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
                                                num_tokens_per_expert=per_expert)
        ctx.comm, ctx.handle = comm, handle
        ctx.mark_non_differentiable(ri)
        return rx, ri, rw, handle

    @staticmethod
    def backward(ctx, g_rx, _g_ri, g_rw, _g_h):
        gw = None if g_rw is None else g_rw.float().contiguous()
        grad_x, grad_w, _ = ctx.comm.buffer.combine(g_rx.contiguous(), ctx.handle, topk_weights=gw)
        return grad_x, None, grad_w, None


class _V1Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, handle, comm):
        out, _, _ = comm.buffer.combine(y, handle)
        ctx.comm, ctx.handle = comm, handle
        return out

    @staticmethod
    def backward(ctx, g):
        grad_y = ctx.comm.buffer.dispatch(g.contiguous(), handle=ctx.handle)[0]
        return grad_y, None, None


class A2AComm:
    """``all_to_all_single`` with uneven splits (counts, then rows, ids and weights)."""

    def __init__(self, num_experts: int):
        self.num_experts = num_experts

    def dispatch(self, x, idx, w):
        return _A2ADispatch.apply(x, idx, w, self.num_experts)

    def combine(self, y, handle):
        return _A2ACombine.apply(y, handle)


class _A2ADispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx, w, num_experts):
        recv, handle = a2a_dispatch(x, idx, w, num_experts)
        ctx.handle = handle
        ctx.mark_non_differentiable(recv.topk_idx)
        return recv.x, recv.topk_idx, recv.topk_weights, handle

    @staticmethod
    def backward(ctx, g_rx, _g_ri, g_rw, _g_h):
        # Rows and received weights go back as a combine does: summed per token in rank order, fp32.
        grad_w = None if g_rw is None else a2a_combine(g_rw.float(), ctx.handle)
        return a2a_combine(g_rx, ctx.handle), None, grad_w, None


class _A2ACombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, handle: A2AHandle):
        ctx.handle = handle
        return a2a_combine(y, handle)

    @staticmethod
    def backward(ctx, g):
        h = ctx.handle  # the cached dispatch: each token's gradient to every rank that got it
        return _exchange(g[h.send_tokens], h.recv_counts, h.send_counts, h.group), None


# -- the layer's step ------------------------------------------------------------------------------------
def forward(layer: Any, comm: Any, x: torch.Tensor) -> torch.Tensor:
    """``MoELayer.forward`` with ``comm`` moving the rows (symmoe: the layer's own ``moe``)."""
    idx, w = layer.route(x)
    if isinstance(comm, SymmoeComm):
        layer.buffer = comm.buffer
        return layer.moe(x, idx, w)
    rx, ri, rw, handle = comm.dispatch(x, idx, w)
    out = comm.combine(layer.experts(rx, ri, rw), handle)
    if layer.shared_w13 is not None:
        from ..nn import _swiglu
        out = out + _swiglu(x, layer.shared_w13, layer.shared_w2)
    return out


def _clock(fn: Callable[[], Any], cuda: bool) -> tuple[Any, float]:
    """(fn's result, µs of the call), the ranks aligned and the device idle before it."""
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end) * 1e3
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e6


def _rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    from ..buffer import Buffer
    from ..compat import deep_ep_v1
    from ..nn import MoELayer

    shape = spec["shape"]
    cfgs = {name: from_dict(c) for name, c in spec["configs"].items()}
    cuda = next(iter(cfgs.values())).backend != "host"
    device = launch.local_gpu(rank) if cuda else torch.device("cpu")
    group = dist.group.WORLD
    comms: dict[str, Any] = {}
    notes: dict[str, str] = {}
    buffers = {name: Buffer(group, c) for name, c in cfgs.items()}
    first = next(iter(cfgs))
    layer = MoELayer(buffers[first], shape["ffn_hidden"], shared_ffn_hidden=shape["shared_ffn_hidden"],
                     output_layout="rank", seed=spec["seed"]).to(device)
    if spec["deepep"]:
        try:
            import deep_ep
            hb = shape["hidden"] * 2
            nvl = max(deep_ep.Buffer.get_dispatch_config(world_size).get_nvl_buffer_size_hint(hb, world_size),
                      deep_ep.Buffer.get_combine_config(world_size).get_nvl_buffer_size_hint(hb, world_size))
            comms["deepep"] = DeepEPV1Comm(deep_ep.Buffer(group, nvl, 0), shape["num_experts"])
        except Exception as e:  # reported beside the others, never fatal
            notes["deepep"] = f"{type(e).__name__}: {e}"
    for name, buf in buffers.items():
        comms[name] = SymmoeComm(buf)
    shim = deep_ep_v1.Buffer(group, symmoe_config=cfgs[first])
    comms["v1-shim"] = DeepEPV1Comm(shim, shape["num_experts"])
    comms["a2a"] = A2AComm(shape["num_experts"])

    cells: dict[str, Any] = {}
    for T in spec["tokens"]:
        gen = torch.Generator().manual_seed(spec["seed"] * 1000 + rank)
        x0 = torch.randn(T, shape["hidden"], generator=gen).to(layer.buffer.dtype).to(device)
        g = torch.randn(T, shape["hidden"], generator=gen).to(layer.buffer.dtype).to(device)
        times = {n: {p: [] for p in PHASES} for n in comms}
        results: dict[str, list[torch.Tensor]] = {}
        for it in range(spec["warmup"] + spec["repeats"]):
            for name, comm in balanced(list(comms.items()), it):  # none always right after the same other
                layer.zero_grad(set_to_none=True)
                x = x0.detach().requires_grad_(True)
                out, t_f = _clock(lambda: forward(layer, comm, x), cuda)
                _, t_b = _clock(lambda: out.backward(g), cuda)
                if it >= spec["warmup"]:
                    times[name]["forward"].append(t_f)
                    times[name]["backward"].append(t_b)
                    times[name]["step"].append(t_f + t_b)
                if name not in results:
                    results[name] = [out.detach(), x.grad.detach()]
                del out
        base = next(iter(results.values()))
        cells[str(T)] = {"median_us": {n: {p: statistics.median(v) for p, v in t.items()} for n, t in times.items()},
                         "bitwise_vs_first": {n: all(_bitwise(a, b) for a, b in zip(r, base)) for n, r in results.items()}}
    layer.buffer = buffers[first]
    shim.destroy()
    for buf in buffers.values():
        buf.close()
    return {"cells": cells, "notes": notes, "names": list(comms)}


def summarize(world_size: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per (tokens, phase): each variant's slowest-rank median and its ratio to the baseline."""
    names = ranks[0]["names"]
    base = "deepep" if "deepep" in names else "a2a"
    rows = []
    for T in ranks[0]["cells"]:
        for phase in PHASES:
            us = {n: round(max(r["cells"][T]["median_us"][n][phase] for r in ranks), 1) for n in names}
            ratio = {n: round(us[base] / v, 3) for n, v in us.items() if n != base and v > 0}
            rows.append({"world_size": world_size, "tokens": int(T), "op": phase, "us": us, "ratio": ratio})
    same = {T: {n: all(r["cells"][T]["bitwise_vs_first"][n] for r in ranks) for n in names} for T in ranks[0]["cells"]}
    return {"world_size": world_size, "baseline": base, "rows": rows, "bitwise_vs_first": same,
            "notes": {i: r["notes"] for i, r in enumerate(ranks) if r["notes"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m symmoe.bench.layer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--tokens", default="4096", help="tokens per rank (comma list)")
    ap.add_argument("--config", action="append", type=_config_arg, default=[],
                    help="NAME=PATH[,key=value...] (repeatable); default: configs/torch.yaml push and pull")
    ap.add_argument("--hidden", type=int, default=SHAPE["hidden"])
    ap.add_argument("--topk", type=int, default=SHAPE["topk"])
    ap.add_argument("--experts", type=int, default=SHAPE["num_experts"])
    ap.add_argument("--ffn-hidden", type=int, default=SHAPE["ffn_hidden"])
    ap.add_argument("--shared-ffn-hidden", type=int, default=0)
    ap.add_argument("--no-deepep", action="store_true", help="without DeepEP, even where deep_ep imports")
    ap.add_argument("--mps-share", choices=MPS_SHARES, default="auto")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="")
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    shape = {"hidden": a.hidden, "topk": a.topk, "num_experts": a.experts, "ffn_hidden": a.ffn_hidden,
             "shared_ffn_hidden": a.shared_ffn_hidden}
    configs = dict(a.config) or {"torch-push": load("configs/torch.yaml").replace(protocol="push").to_dict(),
                                 "torch-pull": load("configs/torch.yaml").replace(protocol="pull").to_dict()}
    sized = {"buffer.hidden": a.hidden, "buffer.topk": a.topk, "buffer.num_experts": a.experts,
             "buffer.max_tokens_per_rank": max(tokens), "buffer.output_layout": "rank"}
    configs = {n: from_dict(c).replace(**sized).to_dict() for n, c in configs.items()}
    if any(c["backend"] != "host" for c in configs.values()) and not torch.cuda.is_available():
        print("symmoe.bench.layer: a GPU backend needs a CUDA GPU; on the CPU pass --config NAME=configs/host.yaml",
              file=sys.stderr)
        return 2
    spec = {"tokens": tokens, "configs": configs, "shape": shape, "deepep": not a.no_deepep, "repeats": a.repeats,
            "warmup": a.warmup, "seed": a.seed}
    results = []
    for W in (int(w) for w in a.world_sizes.split(",")):
        env = rank_env(W, a.mps_share, *(c["backend"] for c in configs.values())) if torch.cuda.is_available() else {}
        t0 = time.time()
        try:
            ranks = launch.spawn(_rank, W, (spec,), env=env, timeout_s=600)
        except launch.RankFailed as e:
            print(f"W={W}: {e}", file=sys.stderr)
            results.append({"world_size": W, "rows": [], "error": str(e)})
            continue
        res = summarize(W, ranks)
        res["seconds"] = round(time.time() - t0, 1)
        results.append(res)
        print(f"W={W}: µs per phase, slowest rank's median (ratio: {res['baseline']} / variant)", flush=True)
        print(markdown([res]), flush=True)
    doc = {**provenance("python -m symmoe.bench.layer " + " ".join(argv if argv is not None else sys.argv[1:])),
           "shape": shape, "configs": configs, "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(markdown([r for r in results if r.get("rows")]))
    return 0 if all(r.get("rows") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
