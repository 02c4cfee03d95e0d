"""The executable definition of symmoe's semantics, in plain torch, on any device.

Every backend and protocol is tested bitwise against these functions. They take a
global view: lists indexed by rank, one entry per rank's inputs, and return one result
per rank (a ``RecvResult`` of ``symmoe.results``, the type the protocols return too).
Ordering and reduction rules that make results bitwise reproducible:

* Expert ``e`` lives on rank ``e // L`` where ``L = num_experts // world_size``; its
  local id there is ``e % L``. ``-1`` in ``topk_idx`` means "no expert".
* Rank-major dispatch: receiver ``r`` gets one row per (source rank ``s``, token ``t``)
  with at least one expert on ``r``, ordered by ``s`` then ``t``. ``recv_topk_idx`` holds
  the local expert id, or -1 for slots whose expert lives elsewhere; the matching weight
  is 0 there.
* Expert-major dispatch: receiver ``r`` gets one row per (source, token, local expert),
  grouped by local expert, inside a group ordered by ``s`` then ``t``; each group is
  padded with zero rows up to a multiple of ``alignment`` (what grouped GEMMs consume).
  Padding rows have expert id -1 and weight 0.
* Worst-case-sized outputs (``num_worst_tokens=N``, DeepEP's name): the same rows, then rows up
  to N with x 0, expert ids -1, weights 0 and sources -1 (``pad_recv``).
* FP8 rows (``xs[s] = (x_e4m3 [T, H], scales [T, S])``, float32 or packed UE8M0 scales):
  the same rows, each token's e4m3 bytes and scale bytes unchanged; padding and worst-case
  rows are zero bytes. ``recv.x`` is then the pair ``(x_e4m3, scales)``, scales row-major.
  ``grouped_layout`` gives DeepGEMM's grouped layout of expert-major rows.
* Combine accumulates in fp32 and casts once. Rank-major: plain sum over destination
  ranks in ascending order (the expert computation applied the weights). Expert-major:
  ``sum_k fp32(w[t, k]) * fp32(y[row(t, k)])`` in ascending ``k``, each product rounded
  to fp32 before it is added (kernels use ``__fmul_rn``/``__fadd_rn`` so no FMA fuses them).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Sequence

import torch

from .results import (DispatchLayout, RecvResult, experts_per_rank, fill_tail, get_dispatch_layout,  # noqa: F401
                      pad_recv, padded_group_offsets)

OutputLayout = Literal["rank", "expert"]


@dataclass(frozen=True)
class DispatchResult:
    recv: list[RecvResult]  # one per receiving rank
    # send_rows[s]: [T_s, W] (rank-major) or [T_s, K] (expert-major) int64 -- the row in the
    # receiver's output that (token, destination) / (token, slot) of source s landed in, -1 if none.
    send_rows: list[torch.Tensor]


def dispatch(
    xs: Sequence[torch.Tensor],
    topk_idxs: Sequence[torch.Tensor],
    topk_weights: Sequence[torch.Tensor],
    num_experts: int,
    layout: OutputLayout = "rank",
    alignment: int = 1,
) -> DispatchResult:
    W = len(xs)
    L = experts_per_rank(num_experts, W)
    if W and isinstance(xs[0], (tuple, list)):
        return _dispatch_fp8(xs, topk_idxs, topk_weights, num_experts, layout, alignment)
    if layout == "rank":
        return _dispatch_rank_major(xs, topk_idxs, topk_weights, W, L)
    if layout == "expert":
        return _dispatch_expert_major(xs, topk_idxs, topk_weights, W, L, alignment)
    raise ValueError(f"layout={layout!r}: expected 'rank' or 'expert'")


def _dispatch_fp8(xs, topk_idxs, topk_weights, num_experts, layout, alignment) -> DispatchResult:
    """Each token's e4m3 bytes and scale bytes side by side, dispatched as one byte row."""
    hidden = xs[0][0].shape[1]
    scale_dtype = xs[0][1].dtype
    rows = [torch.cat([d.view(torch.uint8), s.contiguous().view(torch.uint8)], dim=1) for d, s in xs]
    out = dispatch(rows, topk_idxs, topk_weights, num_experts, layout, alignment)
    recv = [replace(r, x=(r.x[:, :hidden].contiguous().view(torch.float8_e4m3fn),
                          r.x[:, hidden:].contiguous().view(scale_dtype))) for r in out.recv]
    return DispatchResult(recv, out.send_rows)


def grouped_layout(recv: RecvResult, psum: bool = False) -> torch.Tensor:
    """DeepGEMM's grouped layout of an expert-major result (``m_grouped_fp8_gemm_nt_contiguous``):
    int32 [rows], each row's local expert and -1 on padding; or ``psum``: int32 [L], where each
    expert's real rows end (its padded group's start plus its count)."""
    if recv.expert_offsets is None:
        raise ValueError("grouped_layout needs an expert-major result")
    if not psum:
        return recv.topk_idx.to(torch.int32)
    return (recv.expert_offsets[:-1] + recv.num_recv_tokens_per_expert.long()).to(torch.int32)


def _dispatch_rank_major(xs, topk_idxs, topk_weights, W, L) -> DispatchResult:
    layouts = [get_dispatch_layout(idx, W * L, W) for idx in topk_idxs]
    send_rows = [torch.full((idx.shape[0], W), -1, dtype=torch.int64, device=idx.device) for idx in topk_idxs]
    recv = []
    for r in range(W):
        parts_x, parts_idx, parts_w, parts_rank, parts_tok = [], [], [], [], []
        row = 0
        for s in range(W):
            tokens = layouts[s].is_token_in_rank[:, r].nonzero().flatten()
            n = tokens.numel()
            send_rows[s][tokens, r] = torch.arange(row, row + n, device=tokens.device)
            row += n
            idx = topk_idxs[s][tokens].long()
            local = torch.where((idx >= 0) & (idx // L == r), idx - r * L, torch.full_like(idx, -1))
            w = topk_weights[s][tokens].float()
            parts_x.append(xs[s][tokens])
            parts_idx.append(local)
            parts_w.append(torch.where(local >= 0, w, torch.zeros_like(w)))
            parts_rank.append(torch.full((n,), s, dtype=torch.int32, device=tokens.device))
            parts_tok.append(tokens.to(torch.int32))
        recv_idx = torch.cat(parts_idx)
        per_expert = torch.bincount(recv_idx[recv_idx >= 0], minlength=L).to(torch.int32)
        recv.append(RecvResult(torch.cat(parts_x), recv_idx, torch.cat(parts_w), per_expert,
                               torch.cat(parts_rank), torch.cat(parts_tok), None))
    return DispatchResult(recv, send_rows)


def _dispatch_expert_major(xs, topk_idxs, topk_weights, W, L, alignment) -> DispatchResult:
    device = xs[0].device
    hidden = xs[0].shape[1]
    K = topk_idxs[0].shape[1]
    send_rows = [torch.full((idx.shape[0], K), -1, dtype=torch.int64, device=idx.device) for idx in topk_idxs]
    t_max = max([idx.shape[0] for idx in topk_idxs] + [1])
    recv = []
    for r in range(W):
        keys, srcs = [], []
        for s in range(W):
            idx = topk_idxs[s].long()
            t, k = ((idx >= 0) & (idx // L == r)).nonzero(as_tuple=True)
            j = idx[t, k] - r * L
            keys.append((j * W + s) * t_max + t)  # unique: expert ids are distinct within a row
            srcs.append(torch.stack([torch.full_like(t, s), t, k, j], dim=1))
        key = torch.cat(keys)
        src = torch.cat(srcs)[key.argsort()]
        counts = torch.bincount(src[:, 3], minlength=L)
        offsets = padded_group_offsets(counts, alignment)
        rank_in_group = torch.arange(src.shape[0], device=device) - torch.cat([counts.new_zeros(1), counts.cumsum(0)])[src[:, 3]]
        rows = offsets[src[:, 3]] + rank_in_group
        m = int(offsets[-1])
        out_x = torch.zeros((m, hidden), dtype=xs[0].dtype, device=device)
        out_idx = torch.full((m,), -1, dtype=torch.int64, device=device)
        out_w = torch.zeros((m,), dtype=torch.float32, device=device)
        out_rank = torch.full((m,), -1, dtype=torch.int32, device=device)
        out_tok = torch.full((m,), -1, dtype=torch.int32, device=device)
        for s in range(W):
            sel = src[:, 0] == s
            t, k, rr = src[sel, 1], src[sel, 2], rows[sel]
            out_x[rr] = xs[s][t]
            out_w[rr] = topk_weights[s][t, k].float()
            out_rank[rr] = s
            out_tok[rr] = t.to(torch.int32)
            send_rows[s][t, k] = rr
        out_idx[rows] = src[:, 3]
        recv.append(RecvResult(out_x, out_idx, out_w, counts.to(torch.int32), out_rank, out_tok, offsets))
    return DispatchResult(recv, send_rows)


def combine(
    ys: Sequence[torch.Tensor],
    dispatched: DispatchResult,
    topk_idxs: Sequence[torch.Tensor],
    topk_weights: Sequence[torch.Tensor],
    num_experts: int,
    layout: OutputLayout = "rank",
    recv_topk_weights: Sequence[torch.Tensor] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Return, per source rank, ``(combined_x, combined_topk_weights)``.

    ``ys[r]`` holds one row per row that rank ``r`` received. ``combined_topk_weights`` is
    the fp32 sum over ranks of ``recv_topk_weights`` (rank-major only, when given)."""
    W = len(ys)
    L = experts_per_rank(num_experts, W)
    out = []
    for s in range(W):
        rows = dispatched.send_rows[s]
        T = rows.shape[0]
        hidden = ys[0].shape[1]
        acc = torch.zeros((T, hidden), dtype=torch.float32, device=ys[0].device)
        acc_w = None
        if layout == "rank":
            if recv_topk_weights is not None:
                acc_w = torch.zeros((T, topk_idxs[s].shape[1]), dtype=torch.float32, device=ys[0].device)
            for r in range(W):
                t = (rows[:, r] >= 0).nonzero().flatten()
                acc[t] = acc[t] + ys[r][rows[t, r]].float()
                if acc_w is not None:
                    acc_w[t] = acc_w[t] + recv_topk_weights[r][rows[t, r]].float()
        else:
            idx = topk_idxs[s].long()
            for k in range(idx.shape[1]):
                t = (rows[:, k] >= 0).nonzero().flatten()
                owner = idx[t, k] // L
                vals = torch.empty((t.numel(), hidden), dtype=torch.float32, device=ys[0].device)
                for r in range(W):
                    sel = owner == r
                    vals[sel] = ys[r][rows[t[sel], k]].float()
                prod = topk_weights[s][t, k].float().unsqueeze(1) * vals
                acc[t] = acc[t] + prod
        out.append((acc.to(ys[0].dtype), acc_w))
    return out


# -- low-latency mode (DeepEP V1's low_latency_dispatch / low_latency_combine) ------------------
@dataclass(frozen=True)
class LowLatencyRecv:
    """What one rank receives from a low-latency dispatch. ``recv_x[j]`` holds the rows of local
    expert ``j``: source rank 0's first, then rank 1's, ..., each source's in its token order;
    only the first ``recv_count[j]`` rows are defined (here: zeros past them)."""

    recv_x: torch.Tensor        # [L, W * T_max, H]
    recv_count: torch.Tensor    # [L] int32 (DeepGEMM's masked_m)
    src_info: torch.Tensor      # [L, W * T_max] int32: source token of each row, -1 past recv_count
    layout_range: torch.Tensor  # [L, W] int64: (first row << 32) | rows, per source rank


@dataclass(frozen=True)
class LowLatencyDispatch:
    recv: list[LowLatencyRecv]
    # send_rows[s]: [T_s, K] int64 -- row j * W * T_max + q of the expert's rank that slot (t, k)
    # of source s landed in, -1 for masked slots; a token sent twice to one expert lands once.
    send_rows: list[torch.Tensor]


def _first_slots(idx: torch.Tensor) -> torch.Tensor:
    """[T, K] int64: for each slot, the first slot of its token naming the same expert."""
    K = idx.shape[1]
    src = torch.arange(K).expand(idx.shape).clone()
    for k in range(K - 1, -1, -1):
        for k2 in range(k - 1, -1, -1):
            src[:, k] = torch.where(idx[:, k2] == idx[:, k], torch.full_like(src[:, k], k2), src[:, k])
    return src


def low_latency_dispatch(xs: Sequence[torch.Tensor], topk_idxs: Sequence[torch.Tensor], num_experts: int,
                         num_max_dispatch_tokens_per_rank: int) -> LowLatencyDispatch:
    """Masked expert-major dispatch: every (token, distinct expert) pair becomes one row of that
    expert, after the rows of lower source ranks, in token order within its source."""
    W, T_max = len(xs), num_max_dispatch_tokens_per_rank
    L = experts_per_rank(num_experts, W)
    H, dev = xs[0].shape[1], xs[0].device
    recv_x = torch.zeros((W, L, W * T_max, H), dtype=xs[0].dtype)
    src_info = torch.full((W, L, W * T_max), -1, dtype=torch.int32)
    counts = torch.zeros((num_experts, W), dtype=torch.int64)  # [expert, source]
    send_rows = []
    for s in range(W):
        idx = topk_idxs[s].long().cpu()
        T = idx.shape[0]
        first = _first_slots(idx)
        own = (idx >= 0) & (first == torch.arange(idx.shape[1]))  # one pair per (token, expert)
        t, k = own.nonzero(as_tuple=True)
        e = idx[t, k]
        order = torch.argsort(e * max(T, 1) + t)  # by expert, then token
        t, k, e = t[order], k[order], e[order]
        per_e = torch.bincount(e, minlength=num_experts)
        q = counts.sum(1)[e] + torch.arange(e.numel()) - (per_e.cumsum(0) - per_e)[e]  # after lower sources
        counts[:, s] = per_e
        r, j = e // L, e % L
        recv_x[r, j, q] = xs[s].cpu()[t]
        src_info[r, j, q] = t.to(torch.int32)
        rows = torch.full(tuple(idx.shape), -1, dtype=torch.int64)
        rows[t, k] = j * W * T_max + q
        valid = idx >= 0
        rows = torch.where(valid, rows.gather(1, first), rows)  # a repeated expert: its first slot's row
        send_rows.append(rows.to(dev))
    recv = []
    for r in range(W):
        cnt = counts[r * L:(r + 1) * L]  # [L, W]
        begin = cnt.cumsum(1) - cnt
        recv.append(LowLatencyRecv(recv_x[r].to(dev), cnt.sum(1).to(torch.int32).to(dev), src_info[r].to(dev),
                                   ((begin << 32) | cnt).to(dev)))
    return LowLatencyDispatch(recv, send_rows)


def low_latency_combine(ys: Sequence[torch.Tensor], dispatched: LowLatencyDispatch,
                        topk_idxs: Sequence[torch.Tensor], topk_weights: Sequence[torch.Tensor],
                        num_experts: int) -> list[torch.Tensor]:
    """Per source rank ``[T, H]``: ``sum_k fp32(w[t, k]) * fp32(y[row(t, k)])`` in ascending ``k``
    over the unmasked slots, each product rounded to fp32 before it is added, cast once."""
    W = len(ys)
    L = experts_per_rank(num_experts, W)
    flat = [y.reshape(-1, y.shape[-1]) for y in ys]
    out = []
    for s in range(W):
        idx, rows = topk_idxs[s].long(), dispatched.send_rows[s]
        T, H = idx.shape[0], ys[0].shape[-1]
        acc = torch.zeros((T, H), dtype=torch.float32, device=ys[0].device)
        for k in range(idx.shape[1]):
            t = (rows[:, k] >= 0).nonzero().flatten()
            owner = idx[t, k] // L
            vals = torch.empty((t.numel(), H), dtype=torch.float32, device=ys[0].device)
            for r in range(W):
                sel = owner == r
                vals[sel] = flat[r][rows[t[sel], k]].float()
            acc[t] = acc[t] + topk_weights[s][t, k].float().unsqueeze(1) * vals
        out.append(acc.to(ys[0].dtype))
    return out
