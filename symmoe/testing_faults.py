"""Per-rank scenarios for the fault tests (importable by spawned processes)."""
from __future__ import annotations

import os
from typing import Any

import torch

from .buffer import Buffer
from .config import from_dict
from .errors import CapacityError, ConfigMismatch, StallError
from .workload import Routing, make_inputs


def mismatched_configs(rank: int, world_size: int, config: dict[str, Any]) -> str:
    cfg = from_dict(config)
    if rank == 1:
        cfg = cfg.replace(**{"buffer.hidden": cfg.buffer.hidden * 2, "kernel.timeout_s": 5.0})
    try:
        Buffer(None, cfg)
    except ConfigMismatch as e:
        return str(e)
    return "no error"


def _own_inputs(cfg, routing: Routing, num_tokens: int, rank: int, world_size: int, seed: int):
    b = cfg.buffer
    return make_inputs(routing, num_tokens=num_tokens, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                       world_size=world_size, dtype=torch.bfloat16, seed=seed, ranks=[rank])[rank]


def absent_rank(rank: int, world_size: int, config: dict[str, Any]) -> str:
    """The last rank never calls dispatch; the others must raise StallError."""
    cfg = from_dict(config)
    buf = Buffer(None, cfg)
    inp = _own_inputs(cfg, Routing("uniform"), 8, rank, world_size, seed=3)
    if rank == world_size - 1:
        import time
        time.sleep(cfg.kernel.timeout_s * 3)
        return "absent"
    try:
        buf.dispatch(inp.x, inp.topk_idx, inp.topk_weights)
    except StallError as e:
        return str(e)
    return "no error"


def overflow(rank: int, world_size: int, config: dict[str, Any]) -> str:
    """Every token goes to rank 0, whose pool is too small: every rank must raise."""
    cfg = from_dict(config)
    b = cfg.buffer
    with Buffer(None, cfg) as buf:
        inp = _own_inputs(cfg, Routing("one_expert", expert=0), b.max_tokens_per_rank, rank, world_size, seed=4)
        try:
            buf.dispatch(inp.x, inp.topk_idx, inp.topk_weights)
        except CapacityError as e:
            return str(e)
    return "no error"


def raise_after_alloc(rank: int, world_size: int, config: dict[str, Any]) -> list[str]:
    Buffer(None, from_dict(config))
    if rank == 0:
        raise RuntimeError("rank 0 fails on purpose")
    return sorted(os.listdir("/dev/shm"))
