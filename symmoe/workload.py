"""Seeded routings and inputs: the workloads tests, benchmarks and A/B runs share.

Every rank can build every rank's inputs from the seed alone, so a test checks its own
outputs against the reference without gathering anything.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTINGS = ("uniform", "zipf", "group_limited", "masked", "empty_ranks", "one_expert", "replay")


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"
    zipf_s: float = 1.2  # zipf: skew exponent
    mask_prob: float = 0.25  # masked: share of slots set to -1
    num_groups: int = 8  # group_limited: DeepSeek-V3's node-limited routing
    topk_groups: int = 4
    empty_ranks: tuple[int, ...] = (1,)  # empty_ranks: ranks that receive nothing
    expert: int = 0  # one_expert: the expert every token goes to
    replay: torch.Tensor | None = None  # replay: [W, T, K] saved topk_idx


def _distinct_sample(probs: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k distinct experts per row, without replacement, with row probabilities ``probs``."""
    return torch.multinomial(probs, k, replacement=False, generator=gen)


def make_topk_idx(routing: Routing, num_tokens: int, topk: int, num_experts: int, world_size: int, rank: int,
                  gen: torch.Generator) -> torch.Tensor:
    T, K, E = num_tokens, topk, num_experts
    kind = routing.kind
    if kind == "replay":
        if routing.replay is None:
            raise ValueError("routing 'replay' needs a saved topk_idx tensor")
        return routing.replay[rank].long().clone()
    if kind in ("uniform", "masked"):
        idx = _distinct_sample(torch.ones(T, E), K, gen)
        if kind == "masked":
            idx[torch.rand(T, K, generator=gen) < routing.mask_prob] = -1
        return idx
    if kind == "zipf":
        weights = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** routing.zipf_s
        perm = torch.randperm(E, generator=gen)  # which experts are hot differs per seed
        return _distinct_sample(weights[perm].float().expand(T, E).contiguous(), K, gen)
    if kind == "group_limited":
        G, TG = routing.num_groups, routing.topk_groups
        if E % G or TG * (E // G) < K:
            raise ValueError(f"group_limited: {E} experts in {G} groups, {TG} groups per token cannot give top-{K}")
        groups = _distinct_sample(torch.ones(T, G), TG, gen)
        allowed = torch.zeros(T, G)
        allowed.scatter_(1, groups, 1.0)
        probs = allowed.repeat_interleave(E // G, dim=1)
        return _distinct_sample(probs, K, gen)
    if kind == "empty_ranks":
        L = E // world_size
        probs = torch.ones(E)
        for r in routing.empty_ranks:
            if r < world_size:
                probs[r * L:(r + 1) * L] = 0
        live = int((probs > 0).sum())
        idx = _distinct_sample(probs.expand(T, E).contiguous(), min(K, live), gen)
        if idx.shape[1] < K:
            idx = torch.cat([idx, idx.new_full((T, K - idx.shape[1]), -1)], 1)
        return idx
    if kind == "one_expert":
        idx = torch.full((T, K), -1, dtype=torch.int64)
        idx[:, 0] = routing.expert
        return idx
    raise ValueError(f"routing kind {kind!r}; known: {', '.join(ROUTINGS)}")


@dataclass
class RankInputs:
    x: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor


def make_inputs(routing: Routing, *, num_tokens: int | list[int], hidden: int, topk: int, num_experts: int,
                world_size: int, dtype: torch.dtype, seed: int, device: torch.device | str = "cpu") -> list[RankInputs]:
    """Every rank's inputs. ``num_tokens`` may differ per rank (a list)."""
    counts = num_tokens if isinstance(num_tokens, list) else [num_tokens] * world_size
    out = []
    for r in range(world_size):
        gen = torch.Generator().manual_seed(seed * 1000003 + r)
        T = counts[r]
        idx = make_topk_idx(routing, T, topk, num_experts, world_size, r, gen)
        w = torch.softmax(torch.randn(T, topk, generator=gen), dim=1)
        w = torch.where(idx >= 0, w, torch.zeros_like(w))
        x = torch.randn(T, hidden, generator=gen).to(dtype)
        out.append(RankInputs(x.to(device), idx.to(device), w.to(device)))
    return out
