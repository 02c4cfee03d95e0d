"""``ElasticBuffer``'s decode path on symmoe's low-latency engine: an expanded dispatch without
CPU sync (``do_expand=True, do_cpu_sync=False``) and its combine, with no host wait and no host
epoch, so that a CUDA graph captures them (``ElasticBuffer(..., symmoe_low_latency=True)``).

DeepEP V2 has one dispatch for throughput and latency; symmoe's normal mode takes its barrier
epochs from the host, which a graph replay would repeat, so this path runs the low-latency
engine (``symmoe.low_latency``) instead and reshapes its masked ``[L, W * T_max]`` rows into
V2's expanded layout on the device:

* each engine row carries, behind the token's ``H`` elements, a tail with the token's ``K``
  float32 weights and its source rank (the engine moves whole rows and no weights);
* dispatch gathers expanded row ``r`` of expert ``e`` (groups padded to ``expert_alignment``)
  from engine row ``(e, r - start[e])``, zero where ``r`` is padding; its weight is the tail's
  weight at the row's top-k slot;
* combine scatters the expanded rows back to their engine rows and reduces with weight 1 on
  every routed slot: the plain fp32 sum of a token's rows, cast once, as the normal mode's
  expanded combine.

Both engines order an expert's rows by (source rank, token), so the outputs are bitwise the
normal mode's. Every step is a device op that reads nothing back to the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..low_latency import LowLatencyHandle
from ..results import padded_group_offsets
from ._common import align_up


def tail_elems(topk: int) -> int:
    """bfloat16 elements behind each token in the engine's rows: K float32 weights and one
    int32 source rank, in whole 16-byte pieces."""
    return align_up(4 * topk + 4, 16) // 2


@dataclass
class LowLatencyRoute:
    """What the combine of one such dispatch needs (kept on its ``EPHandle``)."""

    ll: LowLatencyHandle
    engine_row: torch.Tensor  # [rows] int64: each expanded row's engine row; a row of its own past them for padding
    unit_weights: torch.Tensor  # [T, K] float32: 1 on routed slots
    hidden: int


@dataclass
class Expanded:
    recv_x: torch.Tensor       # [rows, H]
    recv_weights: torch.Tensor  # [rows] float32
    counts: torch.Tensor       # [L] int64, unaligned
    offsets: torch.Tensor      # [L + 1] int64, aligned group starts
    metadata: torch.Tensor     # [W * T_max, K + 2] int32 (EPHandle.recv_src_metadata)
    per_rank: torch.Tensor     # [W] int64: tokens received from each rank
    route: LowLatencyRoute


def pack_rows(x: torch.Tensor, topk_weights: torch.Tensor, rank: int) -> torch.Tensor:
    """``[T, H + tail]`` bfloat16: each token, then its weights and this rank."""
    T, H = x.shape
    K = topk_weights.shape[1]
    rows = torch.empty((T, H + tail_elems(K)), dtype=x.dtype, device=x.device)
    rows[:, :H] = x
    tail = rows[:, H:].view(torch.float32)
    tail[:, :K] = topk_weights
    tail[:, K].view(torch.int32).fill_(rank)
    return rows


def expand(recv: torch.Tensor, count: torch.Tensor, ll: LowLatencyHandle, topk_idx: torch.Tensor, world_size: int,
           alignment: int, rows: int) -> Expanded:
    """V2's expanded outputs of ``rows`` rows from the engine's ``recv [L, W * T_max, H + tail]``
    and ``count [L]``."""
    L, N, Hp = recv.shape
    H = ll.hidden - tail_elems(ll.topk)
    K, T_max, dev = ll.topk, ll.num_max_dispatch_tokens_per_rank, recv.device
    counts = count.long()
    offsets = padded_group_offsets(counts, alignment)
    r = torch.arange(rows, device=dev)
    e = torch.bucketize(r, offsets[1:], right=True).clamp_(max=L - 1)  # the group each row lies in
    j = r - offsets[e]
    real = (r < offsets[-1]) & (j < counts[e])
    flat = recv.view(L * N, Hp)
    src = torch.where(real, e * N + j, 0)
    recv_x = flat[:, :H].index_select(0, src).masked_fill_(~real.unsqueeze(1), 0)
    tail = flat[:, H:].view(torch.float32).index_select(0, src)
    slot = ll.src_slot.view(-1).index_select(0, src).long().clamp_(0, K - 1)
    weights = tail[:, :K].gather(1, slot.unsqueeze(1)).squeeze(1).masked_fill_(~real, 0.0)
    token = ll.src_info.view(-1).index_select(0, src).long()
    key = tail[:, K].view(torch.int32).long() * T_max + token  # the token's global index
    metadata, per_rank = _metadata(key, slot, real, world_size, T_max, K)
    engine_row = torch.where(real, e * N + j, L * N + r)  # padding: a row of its own, never read
    route = LowLatencyRoute(ll, engine_row, (topk_idx >= 0).float(), H)
    return Expanded(recv_x, weights, counts, offsets, metadata, per_rank, route)


def _metadata(key: torch.Tensor, slot: torch.Tensor, real: torch.Tensor, world_size: int, T_max: int,
              K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``recv_src_metadata`` (one row per received token in global-index order, then -1 rows)
    and the tokens received from each rank, from each expanded row's token key and slot."""
    M, dev = world_size * T_max, key.device
    dump = torch.full_like(key, M)
    at = torch.where(real, key, dump)  # padding rows write into one extra entry, dropped
    got = torch.zeros(M + 1, dtype=torch.int64, device=dev).index_fill_(0, at, 1)[:M]
    pos = got.cumsum(0) - 1
    p = torch.where(real, pos.index_select(0, key.clamp(0, M - 1)), dump)
    meta = torch.full((M + 1, K + 2), -1, dtype=torch.int32, device=dev)
    meta[:, 0].index_copy_(0, p, torch.where(real, key, -1).to(torch.int32))
    rows = torch.arange(key.numel(), device=dev, dtype=torch.int32)
    meta.view(-1).index_copy_(0, p * (K + 2) + 2 + slot, rows)
    first = torch.full((M + 1,), K, dtype=torch.int64, device=dev).scatter_reduce_(0, p, slot, reduce="amin")
    src = meta[:, 0].long() // T_max
    meta[:, 1] = torch.where(first < K, src * K + first, -1).to(torch.int32)
    return meta[:M], got.view(world_size, T_max).sum(1)


def engine_rows(y: torch.Tensor, route: LowLatencyRoute, local_experts: int) -> torch.Tensor:
    """The expanded rows ``y [rows, H]`` put back at their engine rows ``[L, W * T_max, H + tail]``
    (rows no expanded row names, and the tails, are left unset: combine never reads them)."""
    ll, rows = route.ll, route.engine_row.numel()
    N = ll.src_info.shape[1]
    out = y.new_empty((local_experts * N + rows, ll.hidden))
    out[:, :route.hidden].index_copy_(0, route.engine_row, y)
    return out[:local_experts * N].view(local_experts, N, ll.hidden)
