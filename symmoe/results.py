"""What a dispatch gives, shared by the protocols, the compat shims and the reference.

``DispatchLayout`` (the counts one rank derives from its own ``topk_idx``, DeepEP's
``get_dispatch_layout``) and ``RecvResult`` (what one receiving rank gets), with the helpers
that compute and size them: which rank owns an expert, expert-major group offsets, and the
tail of worst-case-sized outputs. ``symmoe.reference`` defines the semantics on top of these.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class DispatchLayout:
    """Counts one rank derives from its own ``topk_idx`` (DeepEP's ``get_dispatch_layout``)."""

    num_tokens_per_rank: torch.Tensor  # [W] int32: tokens with >= 1 expert on each rank
    num_tokens_per_expert: torch.Tensor  # [E] int32: (token, slot) pairs per expert
    is_token_in_rank: torch.Tensor  # [T, W] bool


@dataclass(frozen=True)
class RecvResult:
    """What one receiving rank gets from dispatch."""

    x: torch.Tensor  # [N, H] rank-major, [M_padded, H] expert-major; FP8: (x_e4m3, scales)
    topk_idx: torch.Tensor  # [N, K] int64 (rank-major) or [M_padded] int64 (expert-major)
    topk_weights: torch.Tensor  # [N, K] float32 or [M_padded] float32
    num_recv_tokens_per_expert: torch.Tensor  # [L] int32, unpadded
    src_rank: torch.Tensor  # [rows] int32, -1 on padding
    src_token: torch.Tensor  # [rows] int32, -1 on padding
    expert_offsets: torch.Tensor | None  # [L + 1] int64 padded group starts (expert-major)


def fill_tail(recv: RecvResult, rows: int) -> None:
    """The rows of ``recv`` from ``rows`` on, in place: x 0, expert ids -1, weights 0, sources -1."""
    for x in (recv.x if isinstance(recv.x, tuple) else (recv.x,)):
        x[rows:].zero_()
    recv.topk_idx[rows:].fill_(-1)
    recv.topk_weights[rows:].zero_()
    recv.src_rank[rows:].fill_(-1)
    recv.src_token[rows:].fill_(-1)


def pad_recv(recv: RecvResult, n: int) -> RecvResult:
    """``recv`` grown to ``n`` rows (worst-case-sized outputs; ``n`` >= its rows)."""
    rows = recv.topk_idx.shape[0]
    if n <= rows:
        return recv

    def grow(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_empty((n - rows, *t.shape[1:]))])

    x = tuple(grow(t) for t in recv.x) if isinstance(recv.x, tuple) else grow(recv.x)
    out = replace(recv, x=x, topk_idx=grow(recv.topk_idx), topk_weights=grow(recv.topk_weights),
                  src_rank=grow(recv.src_rank), src_token=grow(recv.src_token))
    fill_tail(out, rows)
    return out


def experts_per_rank(num_experts: int, world_size: int) -> int:
    if num_experts % world_size:
        raise ValueError(f"num_experts={num_experts} is not divisible by world_size={world_size}")
    return num_experts // world_size


def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, world_size: int) -> DispatchLayout:
    L = experts_per_rank(num_experts, world_size)
    valid = topk_idx >= 0
    owner = torch.where(valid, topk_idx // L, torch.full_like(topk_idx, -1))
    ranks = torch.arange(world_size, device=topk_idx.device)
    is_token_in_rank = (owner.unsqueeze(-1) == ranks).any(dim=1)  # [T, W]
    per_expert = torch.bincount(topk_idx[valid].long(), minlength=num_experts)
    return DispatchLayout(
        num_tokens_per_rank=is_token_in_rank.sum(0).to(torch.int32),
        num_tokens_per_expert=per_expert.to(torch.int32),
        is_token_in_rank=is_token_in_rank,
    )


def padded_group_offsets(counts: torch.Tensor, alignment: int) -> torch.Tensor:
    """[L] counts -> [L + 1] int64 starts of groups padded to a multiple of ``alignment``."""
    padded = (counts.long() + alignment - 1) // alignment * alignment
    return torch.cat([padded.new_zeros(1), padded.cumsum(0)])
