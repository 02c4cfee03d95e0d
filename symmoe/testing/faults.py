"""Per-rank scenarios for the fault tests (importable by spawned processes)."""
from __future__ import annotations

import os
from typing import Any

import torch

from ..buffer import Buffer
from ..config import from_dict
from ..errors import CapacityError, ConfigMismatch, InputError, StallError
from ..layout import DTYPES
from ..workload import Routing, make_inputs
from .checks import _check_one


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
        dev = buf.device
        try:
            buf.dispatch(inp.x.to(dev), inp.topk_idx.to(dev), inp.topk_weights.to(dev))
        except CapacityError as e:
            return str(e)
    return "no error"


def raise_after_alloc(rank: int, world_size: int, config: dict[str, Any]) -> list[str]:
    Buffer(None, from_dict(config))
    if rank == 0:
        raise RuntimeError("rank 0 fails on purpose")
    return sorted(os.listdir("/dev/shm"))


def bad_expert_id(rank: int, world_size: int, config: dict[str, Any], kind: str, seed: int,
                  worst: int = 0) -> str:
    """The last rank's topk_idx holds an out-of-range (kind 'range') or a repeated ('duplicate')
    expert id. Returns the InputError this rank got, once the next valid dispatch + combine on
    the same Buffer was bitwise equal to the reference (it raises otherwise). ``worst`` > 0:
    the dispatch asks for num_worst_tokens and may return before the device checked the ids;
    the error comes by ``synchronize()`` at the latest."""
    cfg = from_dict(config)
    b = cfg.buffer
    with Buffer(None, cfg) as buf:
        dev = buf.device
        inp = _own_inputs(cfg, Routing("uniform"), 16, rank, world_size, seed=seed)
        idx = inp.topk_idx.clone()
        if rank == world_size - 1:
            if kind == "range":
                idx[3, 1] = b.num_experts + 7
            else:
                idx[5, 2] = idx[5, 0]
        try:
            buf.dispatch(inp.x.to(dev), idx.to(dev), inp.topk_weights.to(dev), num_worst_tokens=worst)
            buf.synchronize()
            msg = "no error"
        except InputError as e:
            msg = str(e)
        inputs = make_inputs(Routing("uniform"), num_tokens=[24] * world_size, hidden=b.hidden, topk=b.topk,
                             num_experts=b.num_experts, world_size=world_size, dtype=DTYPES[b.dtype], seed=seed + 1)
        _check_one(buf, inputs, rank, world_size, cfg, "rank", dev, f"rank {rank} after bad input", seed + 1)
        return msg


def expect_bad_expert_id_errors(out: list[str], kind: str, num_experts: int) -> None:
    """What ``bad_expert_id`` at two ranks must give: rank 1 (the bad one) names the id and
    token, rank 0 names rank 1, both say nothing moved, and both then dispatched exactly."""
    msg0, msg1 = out
    if kind == "range":
        assert f"expert id {num_experts + 7} (token 3)" in msg1, msg1
    else:
        assert "row 5 names expert" in msg1 and "twice" in msg1, msg1
    assert "rank 1 passed an invalid topk_idx" in msg0, msg0
    assert "moved nothing on any rank" in msg0 and "moved nothing on any rank" in msg1


def abort_at_exit(rank: int, world_size: int, bad_rank: int) -> int:
    """Returns normally; ``bad_rank`` then aborts at interpreter exit, as a library's
    finalisation might."""
    if rank == bad_rank:
        import atexit
        atexit.register(os._exit, 3)
    return rank
