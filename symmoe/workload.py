"""Seeded routings and inputs: the workloads tests, benchmarks and A/B runs share.

Every rank can build every rank's inputs from the seed alone, so a test checks its own
outputs against the reference without gathering anything.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

ROUTINGS = ("uniform", "zipf", "group_limited", "masked", "empty_ranks", "one_expert", "replay")


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"
    zipf_s: float = 1.2  # zipf: skew exponent
    mask_prob: float = 0.25  # masked: share of slots set to -1
    masked_tokens: float = 0.0  # masked: share of tokens with every slot -1 (padding, dropped tokens)
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
            if routing.masked_tokens > 0:  # no draw at 0: every seeded routing stays what it was
                idx[torch.rand(T, generator=gen) < routing.masked_tokens] = -1
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


def _rank_generator(seed: int, rank: int) -> torch.Generator:
    """Rank ``rank``'s generator: routing first, then weights, then x are drawn from it."""
    return torch.Generator().manual_seed(seed * 1000003 + rank)


def make_inputs(routing: Routing, *, num_tokens: int | list[int], hidden: int, topk: int, num_experts: int,
                world_size: int, dtype: torch.dtype, seed: int, device: torch.device | str = "cpu",
                ranks: Sequence[int] | None = None) -> list[RankInputs]:
    """Every rank's inputs. ``num_tokens`` may differ per rank (a list).

    ``ranks``: build only these ranks' inputs (the others' entries are None); each rank's
    inputs depend only on the seed and the rank, so a rank can build just its own."""
    counts = num_tokens if isinstance(num_tokens, list) else [num_tokens] * world_size
    wanted = set(range(world_size) if ranks is None else ranks)
    out = []
    for r in range(world_size):
        if r not in wanted:
            out.append(None)
            continue
        gen = _rank_generator(seed, r)
        T = counts[r]
        idx = make_topk_idx(routing, T, topk, num_experts, world_size, r, gen)
        w = torch.softmax(torch.randn(T, topk, generator=gen), dim=1)
        w = torch.where(idx >= 0, w, torch.zeros_like(w))
        x = torch.randn(T, hidden, generator=gen).to(dtype)
        out.append(RankInputs(x.to(device), idx.to(device), w.to(device)))
    return out


def make_topk_idxs(routing: Routing, *, num_tokens: int | list[int], topk: int, num_experts: int, world_size: int,
                   seed: int) -> list[torch.Tensor]:
    """Every rank's ``topk_idx`` exactly as ``make_inputs`` draws it, without building x
    (cheap: what byte accounting needs)."""
    counts = num_tokens if isinstance(num_tokens, list) else [num_tokens] * world_size
    return [make_topk_idx(routing, counts[r], topk, num_experts, world_size, r, _rank_generator(seed, r))
            for r in range(world_size)]


def load_replay(path: str | os.PathLike, *, world_size: int | None = None, num_tokens: int | None = None,
                topk: int | None = None, num_experts: int | None = None) -> torch.Tensor:
    """A saved routing (``torch.save`` of an integer ``[W, T, K]`` topk_idx) for ``Routing(kind="replay")``.

    Raises ValueError saying what does not fit when a given size disagrees with the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: file not found")
    try:
        t = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any unreadable file gets the same clear message
        raise ValueError(f"{path}: cannot be read by torch.load: {e}") from None
    if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.dtype.is_floating_point or t.dtype == torch.bool:
        what = f"a tensor of shape {tuple(t.shape)} and dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{path}: holds {what}; expected an integer tensor [world_size, tokens, topk]")
    W, T, K = t.shape
    for name, have, want in (("world size", W, world_size), ("tokens per rank", T, num_tokens), ("top-k", K, topk)):
        if want is not None and have != want:
            raise ValueError(f"{path}: shape {tuple(t.shape)} has {name} {have}; the workload needs {want}")
    if num_experts is not None and t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < -1 or hi >= num_experts:
            raise ValueError(f"{path}: expert ids span [{lo}, {hi}]; allowed: -1 (none) and [0, {num_experts})")
    return t.long()
