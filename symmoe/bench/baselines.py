"""Baselines and ceilings that symmoe's backends are measured against.

* ``a2a_dispatch`` / ``a2a_combine``: the rank-major dispatch/combine a user without symmoe
  writes with ``torch.distributed.all_to_all_single`` (counts first, then rows, ids and
  weights with uneven splits). Bitwise equal to ``symmoe.reference`` (rank-major), so it
  doubles as an independent check of the reference's ordering rules.
* ``p2p_copy_matrix``: GB/s of ``dst.copy_(src)`` between every ordered pair of GPUs.
* ``nccl_all_to_all_bandwidth``: equal-split all-to-all, algorithm and bus bandwidth (the
  NVLink all-to-all ceiling).
* ``time_a2a_baseline``: median/p10/p90 of ``a2a_dispatch`` and ``a2a_combine``.
* ``all_to_all_vdev_2d_probe``: torch's NVSHMEM 2-D all-to-all (``torch.ops.symm_mem``),
  timed when it runs here, else the precise reason it does not.

``torchrun --nproc-per-node 8 -m symmoe.bench.baselines --tokens 4096 --hidden 7168 --topk 8
--experts 256 --repeats 20 --json out.json`` runs all of them at the DeepSeek-V3 shape. On a
machine without CUDA it runs on the CPU over gloo (host-clock timings).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import launch, reference
from ..reference import RecvResult
from ..workload import ROUTINGS, Routing, make_inputs
from . import timing
from .gpu import _stats, _time, provenance

Group = Any  # a torch.distributed ProcessGroup, or None for the default group


# --------------------------------------------------------------------------- a2a baseline

@dataclass(frozen=True)
class A2AHandle:
    """What ``a2a_combine`` needs to send rows back and reduce them."""

    send_counts: list[int]  # rows sent to each destination rank
    recv_counts: list[int]  # rows received from each source rank
    send_tokens: torch.Tensor  # [sum(send_counts)] int64: source token of each sent row, by destination
    num_tokens: int
    group: Group


def _exchange(inp: torch.Tensor, out_counts: list[int], in_counts: list[int], group: Group) -> torch.Tensor:
    """Uneven all_to_all_single along dim 0: ``in_counts[r]`` rows go to rank r."""
    out = inp.new_empty((sum(out_counts), *inp.shape[1:]))
    dist.all_to_all_single(out, inp.contiguous(), out_counts, in_counts, group=group)
    return out


def a2a_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                 group: Group = None) -> tuple[RecvResult, A2AHandle]:
    """Rank-major dispatch with ``all_to_all_single``; equal to
    ``reference.dispatch(..., layout="rank").recv[rank]`` bit for bit."""
    W = dist.get_world_size(group)
    L = reference.experts_per_rank(num_experts, W)
    if x.dim() != 2 or topk_idx.dim() != 2 or topk_idx.shape != topk_weights.shape or x.shape[0] != topk_idx.shape[0]:
        raise ValueError(f"shapes x {tuple(x.shape)}, topk_idx {tuple(topk_idx.shape)}, "
                         f"topk_weights {tuple(topk_weights.shape)}: expected [T, H], [T, K], [T, K]")
    T, K = topk_idx.shape
    dev = x.device
    idx = topk_idx.long()
    owner = torch.where(idx >= 0, idx // L, torch.full_like(idx, -1))
    in_rank = (owner.unsqueeze(-1) == torch.arange(W, device=dev)).any(1)  # [T, W]
    # nonzero of the [W, T] transpose is ordered by destination, then token: the send order.
    dest, tok = in_rank.t().nonzero(as_tuple=True)
    send_counts_t = in_rank.sum(0).long()
    recv_counts_t = torch.empty_like(send_counts_t)
    dist.all_to_all_single(recv_counts_t, send_counts_t, group=group)
    send_counts, recv_counts = send_counts_t.tolist(), recv_counts_t.tolist()

    # Ids are made local by the sender (the receiver would need the global ids otherwise).
    sel = idx[tok]
    d = dest.unsqueeze(1)
    local = torch.where((sel >= 0) & (sel // L == d), sel - d * L, torch.full_like(sel, -1))
    w = topk_weights[tok].float()
    w = torch.where(local >= 0, w, torch.zeros_like(w))
    meta = torch.cat([local, tok.unsqueeze(1)], 1)  # ids and source token in one exchange

    recv_x = _exchange(x[tok], recv_counts, send_counts, group)
    recv_meta = _exchange(meta, recv_counts, send_counts, group)
    recv_w = _exchange(w, recv_counts, send_counts, group)
    recv_idx = recv_meta[:, :K].contiguous()
    per_expert = torch.bincount(recv_idx[recv_idx >= 0], minlength=L).to(torch.int32)
    src_rank = torch.repeat_interleave(torch.arange(W, dtype=torch.int32, device=dev),
                                       torch.tensor(recv_counts, device=dev))
    recv = RecvResult(recv_x, recv_idx, recv_w, per_expert, src_rank, recv_meta[:, K].to(torch.int32), None)
    return recv, A2AHandle(send_counts, recv_counts, tok, T, group)


def a2a_combine(y: torch.Tensor, handle: A2AHandle, group: Group = None) -> torch.Tensor:
    """Send each received row back and sum per token in fp32, destinations in ascending rank
    order, one cast at the end (``reference.combine``, rank-major)."""
    group = handle.group if group is None else group
    if y.dim() != 2 or y.shape[0] != sum(handle.recv_counts):
        raise ValueError(f"y has shape {tuple(y.shape)}; dispatch received {sum(handle.recv_counts)} rows")
    back = _exchange(y, handle.send_counts, handle.recv_counts, group)  # ordered by destination, then token
    acc = torch.zeros((handle.num_tokens, y.shape[1]), dtype=torch.float32, device=y.device)
    start = 0
    for n in handle.send_counts:  # one block per destination rank, ascending
        # Tokens are unique within a block, so index_add_ is one rounded fp32 add per element.
        acc.index_add_(0, handle.send_tokens[start:start + n], back[start:start + n].float())
        start += n
    return acc.to(y.dtype)


# --------------------------------------------------------------------------- timing helpers

def _group_device(group: Group) -> torch.device:
    """Where a group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _barrier(group: Group) -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if dist.get_world_size(group) > 1:
        dist.barrier(group=group)


def _seconds(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int,
             sync: Callable[[], None]) -> list[float]:
    """CUDA events on a GPU (gpu._time), the host clock on the CPU (timing)."""
    if device.type == "cuda":
        return _time(fn, warmup, repeats, 0, sync)
    samples = timing.Samples()
    timer = timing.Timer(device, samples)
    for _ in range(warmup):
        fn()
    for _ in range(repeats):
        sync()
        with timer:
            fn()
    return samples.seconds


def p2p_copy_matrix(nbytes: int = 256 << 20, repeats: int = 10) -> dict[str, Any]:
    """GB/s of ``dst_on_j.copy_(src_on_i)`` for every ordered pair of visible GPUs (one
    process; call it on rank 0 only). The diagonal is a local copy (bytes copied / time)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n <= 1:
        return {"gpus": n, "pairs": []}
    srcs = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}").random_(0, 255) for i in range(n)]
    dsts = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}") for j in range(n)]
    gbps = [[0.0] * n for _ in range(n)]
    pairs = []
    for i in range(n):
        for j in range(n):
            # A cross-device copy runs on i's stream, fenced by j's current stream both ways,
            # so events recorded on j time it.
            with torch.cuda.device(j):
                ts = _time(lambda: dsts[j].copy_(srcs[i]), 2, repeats, 0, lambda: None)
            gbps[i][j] = nbytes / statistics.median(ts) / 1e9
            if i != j:
                pairs.append({"src": i, "dst": j, "GBps": gbps[i][j],
                              "peer_access": torch.cuda.can_device_access_peer(j, i)})
    off = [p["GBps"] for p in pairs]
    return {"gpus": n, "nbytes": nbytes, "repeats": repeats, "GBps": gbps, "pairs": pairs,
            "min_GBps": min(off), "median_GBps": statistics.median(off)}


def nccl_all_to_all_bandwidth(group: Group, nbytes_per_rank: int = 256 << 20, repeats: int = 10,
                              warmup: int = 3) -> dict[str, Any]:
    """Equal-split ``all_to_all_single``: algbw = bytes sent per rank / time, busbw = algbw *
    (W-1)/W (nccl-tests' definition; the all-to-all ceiling of the links)."""
    W = dist.get_world_size(group)
    dev = _group_device(group)
    n = max(W, nbytes_per_rank // W * W)  # equal splits
    inp = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    out = torch.empty_like(inp)
    ts = _seconds(lambda: dist.all_to_all_single(out, inp, group=group), dev, warmup, repeats,
                  lambda: _barrier(group))
    st = _stats(ts)
    algbw = n / (st["median_us"] * 1e-6)
    return {"backend": dist.get_backend(group), "world_size": W, "nbytes_per_rank": n, **st,
            "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * (W - 1) / W / 1e9}


def time_a2a_baseline(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                      group: Group, warmup: int, repeats: int) -> dict[str, Any]:
    """Median/p10/p90 of ``a2a_dispatch`` and ``a2a_combine`` (the combine sends back the
    received rows: identity experts)."""
    state: dict[str, Any] = {}

    def dispatch() -> None:
        state["d"] = a2a_dispatch(x, topk_idx, topk_weights, num_experts, group)

    def combine() -> None:
        recv, handle = state["d"]
        a2a_combine(recv.x, handle, group)

    sync = lambda: _barrier(group)  # noqa: E731
    d = _seconds(dispatch, x.device, warmup, repeats, sync)
    c = _seconds(combine, x.device, warmup, repeats, sync)
    recv, handle = state["d"]
    row_bytes = x.shape[1] * x.element_size()
    sent = sum(handle.send_counts)
    out: dict[str, Any] = {"dispatch": _stats(d), "combine": _stats(c), "sent_rows": sent,
                           "recv_rows": recv.x.shape[0], "row_bytes": row_bytes}
    out["dispatch"]["GBps_sent"] = sent * row_bytes / (out["dispatch"]["median_us"] * 1e-6) / 1e9
    out["combine"]["GBps_sent"] = recv.x.shape[0] * row_bytes / (out["combine"]["median_us"] * 1e-6) / 1e9
    return out


# --------------------------------------------------------------------------- all_to_all_vdev_2d

VDEV_2D_MAX_EXPERTS_PER_RANK = 16  # the kernel's NUM_TILES (512 threads / 32-lane tiles)
VDEV_2D_MAX_WORLD_SIZE = 32  # its warp-wide prefix sum over ranks


def _vdev_2d_local_reason(group: Group) -> tuple[str, Any]:
    """('', op) when this rank can try the op, else (reason, None)."""
    op = getattr(torch.ops.symm_mem, "all_to_all_vdev_2d", None)
    if op is None:
        return f"torch {torch.__version__} has no torch.ops.symm_mem.all_to_all_vdev_2d", None
    if not torch.cuda.is_available():
        return (f"CUDA is not available (torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                "all_to_all_vdev_2d runs only on CUDA tensors in NVSHMEM symmetric memory"), None
    import torch.distributed._symmetric_memory as symm_mem

    if not symm_mem.is_nvshmem_available():
        return "torch symmetric memory reports NVSHMEM unavailable (libnvshmem_host.so.3 not loadable)", None
    W = dist.get_world_size(group)
    if W > VDEV_2D_MAX_WORLD_SIZE:
        return f"world size {W} > {VDEV_2D_MAX_WORLD_SIZE}, the kernel's limit", None
    try:
        dev = torch.device("cuda", torch.cuda.current_device())
        if symm_mem.get_backend(dev) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")  # fails once another backend has allocated here
    except Exception as e:  # noqa: BLE001 -- any failure becomes the reason
        return f"cannot select the NVSHMEM symmetric-memory backend: {type(e).__name__}: {e}", None
    return "", op


def all_to_all_vdev_2d_probe(group: Group, tokens: int = 4096, hidden: int = 7168, topk: int = 8,
                             num_experts: int = 256, repeats: int = 10, warmup: int = 3, major_align: int = 1,
                             seed: int = 0) -> dict[str, Any]:
    """Time torch's NVSHMEM 2-D all-to-all (rank-major in, expert-major out) on a
    DeepSeek-V3-like shape, after checking where every chunk landed; never raises.

    Each rank sends ``tokens * topk`` rows (one per (token, slot), already sorted by
    destination expert) of ``hidden`` bf16. The kernel takes at most 16 experts per rank,
    so experts fold onto ``min(num_experts / W, 16)`` bins per rank (same bytes).
    Returns {"available": False, "reason": ...} when it cannot run or runs wrong."""
    schema = ""
    try:
        op0 = getattr(torch.ops.symm_mem, "all_to_all_vdev_2d", None)
        schema = str(op0.default._schema) if op0 is not None else ""
        reason, op = _vdev_2d_local_reason(group)
        # Every rank must agree before anyone enters the op's collectives.
        reasons: list[str] = [""] * dist.get_world_size(group)
        dist.all_gather_object(reasons, reason, group=group)
        bad = [(r, s) for r, s in enumerate(reasons) if s]
        if bad:
            if all(s == bad[0][1] for _, s in bad) and len(bad) == len(reasons):
                why = bad[0][1]
            else:
                why = "; ".join(f"rank {r}: {s}" for r, s in bad)
            return {"available": False, "reason": why, "schema": schema}
        return {"available": True, "schema": schema,
                **_run_vdev_2d(op, group, tokens, hidden, topk, num_experts, repeats, warmup, major_align, seed)}
    except _WrongResult as e:
        return {"available": False, "ran": True, "reason": f"ran, but the output is wrong: {e}", "schema": schema}
    except Exception as e:  # noqa: BLE001 -- a probe reports, it does not raise
        return {"available": False, "reason": f"{type(e).__name__}: {e}", "schema": schema}


class _WrongResult(Exception):
    pass


def _run_vdev_2d(op: Any, group: Group, T: int, H: int, K: int, E: int, repeats: int, warmup: int,
                 align: int, seed: int) -> dict[str, Any]:
    import torch.distributed._symmetric_memory as symm_mem

    W, me = dist.get_world_size(group), dist.get_rank(group)
    L = reference.experts_per_rank(E, W)
    ne = min(L, VDEV_2D_MAX_EXPERTS_PER_RANK)
    nsplits = W * ne
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(seed * 1000003 + me)
    idx = torch.rand(T, E, generator=g).topk(K, dim=1).indices  # uniform, distinct (bench._inputs)
    bins = (idx // L) * ne + (idx % L) % ne
    in_splits_host = torch.bincount(bins.flatten(), minlength=nsplits)
    all_splits: list[list[int]] = [[] for _ in range(W)]
    dist.all_gather_object(all_splits, in_splits_host.tolist(), group=group)
    S = torch.tensor(all_splits, dtype=torch.int64)  # [W src, nsplits]
    recv_per_rank = S.view(W, W, ne).sum((0, 2))  # rows each rank receives
    max_in = int(S.sum(1).max())
    max_out = int(recv_per_rank.max()) + ne * align  # aligned groups, empty ones padded too
    name = group.group_name if group is not None else dist.group.WORLD.group_name
    # NVSHMEM's heap defaults to 1 GiB, too small here; only read at its initialisation.
    heap = (max(max_in, 1) + max_out) * H * 2 + (64 << 20)
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap + heap // 4))

    # Symmetric allocations must have the same size on every rank.
    inp = symm_mem.empty((max(max_in, 1), H), dtype=torch.bfloat16, device=dev)
    out = symm_mem.empty((max_out, H), dtype=torch.bfloat16, device=dev)
    in_splits = symm_mem.empty(nsplits, dtype=torch.int64, device=dev)
    out_so = symm_mem.empty((2, nsplits), dtype=torch.int64, device=dev)
    for t in (inp, out, in_splits, out_so):
        symm_mem.rendezvous(t, name)
    rows = int(S[me].sum())
    inp.normal_()
    marks = inp.view(torch.int16)  # columns 0-2 tag each row: (source rank, row >> 15, row & 0x7fff)
    r = torch.arange(rows, device=dev)
    marks[:rows, 0] = me
    marks[:rows, 1] = (r >> 15).to(torch.int16)
    marks[:rows, 2] = (r & 0x7FFF).to(torch.int16)
    in_splits.copy_(in_splits_host)
    out.fill_(0)
    out_so.fill_(-1)

    def call() -> None:
        op(inp, out, in_splits, out_so, name, major_align=align)

    call()
    torch.cuda.synchronize()
    _check_vdev_2d(out, out_so, S, me, W, ne)
    ts = _time(call, warmup, repeats, 0, lambda: _barrier(group))
    st = _stats(ts)
    nbytes = rows * H * 2
    return {"world_size": W, "tokens": T, "hidden": H, "topk": K, "num_experts": E, "experts_per_rank": L,
            "bins_per_rank": ne, "major_align": align, "rows_sent": rows, "rows_recv": int(recv_per_rank[me]),
            "bytes_sent": nbytes, "nvshmem_symmetric_size": os.environ.get("NVSHMEM_SYMMETRIC_SIZE"), **st,
            "GBps_sent": nbytes / (st["median_us"] * 1e-6) / 1e9,
            "checked": "every chunk's rows carry the expected (source rank, source row) tags"}


def _check_vdev_2d(out: torch.Tensor, out_so: torch.Tensor, S: torch.Tensor, me: int, W: int, ne: int) -> None:
    """Output splits [e * W + s] must equal what source s sent to this rank's bin e, and the
    rows at the returned offsets must be source s's rows for that bin, in order."""
    got = out_so.cpu()
    want_splits = S[:, me * ne:(me + 1) * ne].t().reshape(-1)  # [e, s] -> e * W + s
    if not torch.equal(got[0], want_splits):
        raise _WrongResult(f"output splits {got[0].tolist()} != expected {want_splits.tolist()}")
    src_start = torch.cat([S.new_zeros(W, 1), S.cumsum(1)[:, :-1]], 1)  # [s, bin] exclusive prefix
    dst_rows, src, src_rows = [], [], []
    for e in range(ne):
        for s in range(W):
            n, off = int(want_splits[e * W + s]), int(got[1][e * W + s])
            if off < 0 or off + n > out.shape[0]:
                raise _WrongResult(f"offset {off} of expert {e} from rank {s} ({n} rows) outside {out.shape[0]} rows")
            dst_rows.append(torch.arange(off, off + n))
            src.append(torch.full((n,), s))
            src_rows.append(torch.arange(n) + int(src_start[s, me * ne + e]))
    dst = torch.cat(dst_rows).to(out.device)
    marks = out.view(torch.int16)[dst, :3].long().cpu()
    want = torch.stack([torch.cat(src), torch.cat(src_rows) >> 15, torch.cat(src_rows) & 0x7FFF], 1)
    bad = (marks != want).any(1).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise _WrongResult(f"{bad.numel()} of {dst.numel()} rows misplaced; output row {int(dst[i])} carries "
                           f"{marks[i].tolist()}, expected {want[i].tolist()}")


# --------------------------------------------------------------------------- main

def check_against_reference(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                            group: Group, seed: int = 0) -> dict[str, Any]:
    """Gather every rank's inputs, run ``symmoe.reference`` and compare ``a2a_dispatch`` and
    ``a2a_combine`` bitwise; {"bitwise_equal": bool, "detail": str}."""
    from ..testing.checks import first_difference

    W, me = dist.get_world_size(group), dist.get_rank(group)

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(t) for _ in range(W)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return parts

    xs, idxs, ws = gather(x), gather(topk_idx), gather(topk_weights)
    ref = reference.dispatch(xs, idxs, ws, num_experts, "rank")
    want = ref.recv[me]
    recv, handle = a2a_dispatch(x, topk_idx, topk_weights, num_experts, group)
    # Fresh expert outputs per receiving rank, from the seed: every rank can build all of them.
    ys = [torch.randn(ref.recv[r].x.shape, device=x.device,
                      generator=torch.Generator(device=x.device).manual_seed(seed * 7 + r)).to(x.dtype)
          for r in range(W)]
    want_c = reference.combine(ys, ref, idxs, ws, num_experts, "rank")[me][0]
    got_c = a2a_combine(ys[me], handle, group)
    pairs = [("recv_x", recv.x, want.x), ("recv_topk_idx", recv.topk_idx, want.topk_idx),
             ("recv_topk_weights", recv.topk_weights, want.topk_weights),
             ("num_recv_tokens_per_expert", recv.num_recv_tokens_per_expert, want.num_recv_tokens_per_expert),
             ("src_rank", recv.src_rank, want.src_rank), ("src_token", recv.src_token, want.src_token),
             ("combined_x", got_c, want_c)]
    for name, got, exp in pairs:
        diff = first_difference(got.cpu(), exp.cpu())
        if diff:
            return {"bitwise_equal": False, "detail": f"rank {me}: {name}: {diff}"}
    return {"bitwise_equal": True, "detail": f"rank {me}: dispatch (6 outputs) and combine bitwise equal"}


def _slowest(ranks: list[dict[str, Any]], op: str) -> dict[str, float]:
    """The collective is as slow as its slowest rank: that rank's median and spread."""
    worst = max(ranks, key=lambda r: r[op]["median_us"])[op]
    return {k: worst[k] for k in ("median_us", "p10_us", "p90_us")}


def _table(doc: dict[str, Any]) -> str:
    s, res = doc["shape"], doc["results"]
    lines = [f"symmoe baselines: W={doc['world_size']} {doc['device']}, tokens {s['tokens']}, hidden {s['hidden']}, "
             f"top-{s['topk']}, {s['experts']} experts, {s['dtype']}, routing {s['routing']}"]
    chk = res["reference_check"]
    lines.append(f"reference check      {'bitwise equal' if chk['bitwise_equal'] else 'DIFFERS: ' + chk['detail']}")
    for op in ("dispatch", "combine"):
        a = res["a2a"][op]
        lines.append(f"a2a {op:<16} median {a['median_us']:10.1f} us  p10 {a['p10_us']:.1f}  p90 {a['p90_us']:.1f}")
    bw = res["all_to_all"]
    lines.append(f"all_to_all ({bw['backend']})    {bw['nbytes_per_rank'] / 2**20:g} MiB/rank  "
                 f"algbw {bw['algbw_GBps']:.1f} GB/s  busbw {bw['busbw_GBps']:.1f} GB/s")
    p = res["p2p_copy"]
    if p["pairs"]:
        lines.append(f"p2p copy             min {p['min_GBps']:.1f} GB/s  median {p['median_GBps']:.1f} GB/s "
                     f"over {len(p['pairs'])} pairs")
    else:
        lines.append(f"p2p copy             {p['gpus']} GPU(s): no pairs")
    v = res["all_to_all_vdev_2d"]
    if v["available"]:
        lines.append(f"all_to_all_vdev_2d   median {v['median_us']:.1f} us  {v['GBps_sent']:.1f} GB/s sent "
                     f"({v['bins_per_rank']} bins/rank)")
    else:
        lines.append(f"all_to_all_vdev_2d   unavailable: {v['reason']}")
    return "\n".join(lines)


def _run(a: argparse.Namespace, argv: list[str]) -> int:
    rank, W = dist.get_rank(), dist.get_world_size()
    group: Group = None
    if torch.cuda.is_available():
        launch.local_gpu(rank)
        group = dist.new_group(backend="nccl")  # the data path a plain-torch user would take
    dev = _group_device(group)
    dtype = getattr(torch, a.dtype)
    mine = make_inputs(Routing(a.routing), num_tokens=a.tokens, hidden=a.hidden, topk=a.topk, num_experts=a.experts,
                       world_size=W, dtype=dtype, seed=a.seed, device=dev, ranks=[rank])[rank]
    x, idx, w = mine.x, mine.topk_idx, mine.topk_weights

    check = check_against_reference(x, idx, w, a.experts, group, a.seed)
    a2a = time_a2a_baseline(x, idx, w, a.experts, group, a.warmup, a.repeats)
    bw = nccl_all_to_all_bandwidth(group, a.a2a_bytes, a.repeats)
    # The copy matrix uses every GPU from rank 0 while the others wait on the host (the
    # default group is gloo), so no NCCL kernel spins on a GPU being measured.
    _barrier(None)
    p2p = p2p_copy_matrix(a.p2p_bytes, a.repeats) if rank == 0 else None
    _barrier(None)

    per_rank: list[dict[str, Any]] = [{} for _ in range(W)]
    dist.all_gather_object(per_rank, {"rank": rank, "check": check, "a2a": a2a, "all_to_all": bw}, group=None)
    ok = all(r["check"]["bitwise_equal"] for r in per_rank)
    # torch's NVSHMEM op has crashed a process (illegal address inside NVSHMEM's barrier): the
    # JSON is written before it runs, so the other numbers survive, and rewritten after.
    doc = _document(a, argv, dev, W, per_rank, p2p, {"available": False, "reason": "the probe did not finish "
                                                     "(its process died; see the log)"}) if rank == 0 else None
    if doc is not None and a.json:
        _write(doc, a.json)
    vdev = all_to_all_vdev_2d_probe(group, a.tokens, a.hidden, a.topk, a.experts, a.repeats, a.warmup, seed=a.seed)
    if rank != 0:
        return 0 if ok else 1
    doc["results"]["all_to_all_vdev_2d"] = vdev
    if a.json:
        _write(doc, a.json)
    print(_table(doc), flush=True)
    return 0 if ok else 1


def _write(doc: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def _document(a: argparse.Namespace, argv: list[str], dev: torch.device, W: int, per_rank: list[dict[str, Any]],
              p2p: Any, vdev: dict[str, Any]) -> dict[str, Any]:
    checks = [r["check"] for r in per_rank]
    bad = [c for c in checks if not c["bitwise_equal"]]
    doc = {
        **provenance(" ".join(["python -m symmoe.bench.baselines", *argv])), "world_size": W,
        "timing": "CUDA events" if dev.type == "cuda" else "host clock (no CUDA)",
        "shape": {"tokens": a.tokens, "hidden": a.hidden, "topk": a.topk, "experts": a.experts, "dtype": a.dtype,
                  "routing": a.routing, "seed": a.seed, "warmup": a.warmup, "repeats": a.repeats},
        "results": {
            "reference_check": {"bitwise_equal": not bad, "detail": bad[0]["detail"] if bad else "every rank equal",
                                "ranks": checks},
            "a2a": {"dispatch": _slowest([r["a2a"] for r in per_rank], "dispatch"),
                    "combine": _slowest([r["a2a"] for r in per_rank], "combine"),
                    "ranks": [r["a2a"] for r in per_rank]},
            "all_to_all": {**min((r["all_to_all"] for r in per_rank), key=lambda b: b["algbw_GBps"]),
                           "ranks": [r["all_to_all"] for r in per_rank]},
            "p2p_copy": p2p,
            "all_to_all_vdev_2d": vdev,
        },
    }
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m symmoe.bench.baselines", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--routing", default="uniform", choices=[r for r in ROUTINGS if r != "replay"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--a2a-bytes", type=int, default=256 << 20, help="bytes per rank of the equal-split all-to-all")
    p.add_argument("--p2p-bytes", type=int, default=256 << 20, help="bytes per GPU-to-GPU copy")
    p.add_argument("--json", default=None)
    argv = list(argv) if argv is not None else sys.argv[1:]
    a = p.parse_args(argv)
    if dist.is_initialized():  # spawned by symmoe.launch.spawn (tests), or a caller's group
        return _run(a, argv)
    with launch.torchrun_group():  # outside torchrun a single rank of its own
        return _run(a, argv)


if __name__ == "__main__":
    raise SystemExit(main())
