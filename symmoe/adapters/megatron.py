"""symmoe as Megatron-Core's flex token dispatcher backend.

``MoEFlexTokenDispatcher`` drives a ``_DispatchManager``; with
``--moe-flex-dispatcher-backend deepep`` it builds ``_DeepepManager(group, num_local_experts,
router_topk, num_experts, config)``. ``SymmoeManager`` has that constructor and that
contract, over a ``symmoe.Buffer`` instead of DeepEP:

1. ``setup_metadata(routing_map, probs)``: ``[T, W, L]`` (or ``[T, E]``) multi-hot routing and
   probabilities -> ``token_indices``/``token_probs`` ``[T, topk]`` (the top-k of ``probs``;
   slots that ``routing_map`` does not route, e.g. dropped by a capacity factor, get id -1);
2. ``dispatch(hidden_states)``: the rank-major dispatch (``symmoe.autograd``, so
   ``hidden_states`` and ``token_probs`` get gradients): one row per (source rank, token) with
   an expert here; ``dispatched_indices`` (local ids, -1 elsewhere), ``dispatched_probs``
   (fp32) and ``tokens_per_expert`` (an int64 CPU tensor, as DeepEP's list becomes) are set;
3. ``get_permuted_hidden_states_by_experts(rows)`` -> ``(rows grouped by local expert, their
   probs)``: one row per (received row, local expert), by expert then received row;
4. ``get_restored_hidden_states_by_experts(expert_rows)``: each received row's sum over its
   local experts, in fp32 by ascending expert, one cast;
5. ``combine(rows)``: the rank-major combine (sum over ranks in fp32 in rank order, one cast).

Megatron's experts apply the probabilities (3 returns them beside the rows), so combine adds
rows only. Steps 3 and 4 are each other's backward, so every gradient is a copy or an fp32
sum in a fixed order: the same bits on every backend, protocol and rerun.

``install(config)`` makes Megatron build ``SymmoeManager`` wherever it would build
``_DeepepManager`` (with ``moe_token_dispatcher_type="flex"`` and
``moe_flex_dispatcher_backend="deepep"``); ``uninstall()`` undoes it. Megatron is never
imported unless ``install`` is called.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from .. import autograd
from ..buffer import Buffer
from ..config import Config, load
from ..errors import InputError
from ..handle import DispatchHandle

logger = logging.getLogger(__name__)

_default_config: Config | str | os.PathLike | None = None
_saved_manager: Any = None
_MODULE = "megatron.core.transformer.moe.token_dispatcher"


class SymmoeManager:
    """Megatron-Core's ``_DispatchManager`` over a ``symmoe.Buffer`` (see the module doc).

    ``group``, ``num_local_experts``, ``router_topk``, ``num_experts`` and ``config`` (a
    Megatron ``TransformerConfig``, or None) as ``_DeepepManager`` takes them; the symmoe
    config (backend, sizes) is ``symmoe_config`` or the one ``install`` named. ``buffer``: an
    existing Buffer over ``group`` instead (its config must agree with the sizes)."""

    def __init__(self, group: Any, num_local_experts: int, router_topk: int, num_experts: int, config: Any = None,
                 *, symmoe_config: Config | str | os.PathLike | None = None, buffer: Buffer | None = None):
        if config is not None and getattr(config, "moe_router_padding_for_quantization", False):
            raise InputError("moe_router_padding_for_quantization=True: the symmoe manager does not pad expert "
                             "groups for FP8/FP4 quantization; allowed: False")
        if buffer is None:
            cfg = symmoe_config if symmoe_config is not None else _default_config
            if cfg is None:
                raise InputError("SymmoeManager: no symmoe config; pass symmoe_config= (a Config or a YAML path) "
                                 "or call symmoe.adapters.megatron.install(config) first")
            buffer = Buffer(group, cfg if isinstance(cfg, Config) else load(cfg))
        self.buffer = buffer
        b = buffer.config.buffer
        for name, got, want in (("num_experts", num_experts, b.num_experts), ("router_topk", router_topk, b.topk),
                                ("num_local_experts", num_local_experts, buffer.layout.local_experts)):
            if got != want:
                raise InputError(f"SymmoeManager: {name}={got}, but the symmoe config ({buffer.config.source or 'given'}) "
                                 f"gives {want} at world size {buffer.world_size}; set buffer.num_experts / "
                                 "buffer.topk to the model's (times the tensor-parallel size under TPxEP)")
        self.group = group
        self.config = config
        self.num_local_experts = num_local_experts
        self.router_topk = router_topk
        self.num_experts = num_experts
        self.router_dtype = getattr(config, "moe_router_dtype", None)
        self.token_indices: torch.Tensor | None = None
        self.token_probs: torch.Tensor | None = None
        self.handle: DispatchHandle | None = None
        self.dispatched_indices: torch.Tensor | None = None
        self.dispatched_probs: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None
        self._perm: _Permutation | None = None

    def setup_metadata(self, routing_map: torch.Tensor, probs: torch.Tensor) -> None:
        """The top-k (``router_topk``) slots of each token from its ``num_experts`` probabilities;
        a slot ``routing_map`` leaves unrouted gets id -1."""
        E = self.num_experts
        for name, t in (("routing_map", routing_map), ("probs", probs)):
            if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.shape[1:].numel() != E:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputError(f"setup_metadata: {name} has shape {got}; expected [num_tokens, {E}] or "
                                 f"[num_tokens, world_size, num_local_experts] with {E} experts per token")
        T = routing_map.shape[0]
        if probs.shape[0] != T:
            raise InputError(f"setup_metadata: probs has {probs.shape[0]} tokens, routing_map {T}")
        routing_map = routing_map.reshape(T, E)
        probs = probs.reshape(T, E)
        self.token_probs, idx = torch.topk(probs, self.router_topk, dim=-1)
        self.token_indices = idx.masked_fill(~routing_map.bool().gather(1, idx), -1)

    def dispatch(self, hidden_states: torch.Tensor, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False) -> torch.Tensor:
        """The rank-major dispatch of ``hidden_states`` [T, hidden] (the stream arguments are
        accepted: symmoe runs on the current stream)."""
        if self.token_indices is None or self.token_probs is None:
            raise InputError("dispatch: setup_metadata(routing_map, probs) was not called before dispatch")
        if self.token_probs.dtype != torch.float32:
            logger.warning("symmoe dispatches float32 probs; got %s (set --moe-router-dtype=fp32)",
                           self.token_probs.dtype)
            self.token_probs = self.token_probs.float()
        d = autograd.dispatch(self.buffer, hidden_states, self.token_indices, self.token_probs, output_layout="rank")
        self.handle = d.handle
        self.dispatched_indices = d.topk_idx
        self.dispatched_probs = d.topk_weights
        self.tokens_per_expert = torch.tensor(d.num_recv_tokens_per_expert, dtype=torch.int64)
        return d.x

    def get_number_of_tokens_per_expert(self) -> torch.Tensor:
        """Rows per local expert of the last dispatch (int64, on the CPU)."""
        if self.tokens_per_expert is None:
            raise InputError("get_number_of_tokens_per_expert: no dispatch has run yet")
        return self.tokens_per_expert

    def get_permuted_hidden_states_by_experts(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows grouped by local expert, their probabilities): one row per (received row,
        local expert), ordered by expert then received row; probs fp32 (fp64 with
        ``moe_router_dtype='fp64'``)."""
        if self.dispatched_indices is None or self.dispatched_probs is None:
            raise InputError("get_permuted_hidden_states_by_experts: no dispatch has run yet")
        n = self.dispatched_indices.shape[0]
        if not isinstance(hidden_states, torch.Tensor) or tuple(hidden_states.shape[:1]) != (n,):
            got = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
            raise InputError(f"get_permuted_hidden_states_by_experts: hidden_states has shape {got}; expected the "
                             f"{n} rows dispatch returned")
        self._perm = perm = _Permutation(self.dispatched_indices, self.num_local_experts)
        rows = _Permute.apply(hidden_states, perm)
        probs = self.dispatched_probs[perm.row, perm.slot]
        if self.router_dtype == "fp64":
            probs = probs.to(torch.float64)
        return rows, probs

    def get_restored_hidden_states_by_experts(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each received row: the sum of its experts' rows in fp32 by ascending expert, one cast."""
        if self._perm is None:
            raise InputError("get_restored_hidden_states_by_experts: get_permuted_hidden_states_by_experts was "
                             "not called since the last dispatch")
        p = self._perm.row.numel()
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2 or hidden_states.shape[0] != p:
            got = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
            raise InputError(f"get_restored_hidden_states_by_experts: hidden_states has shape {got}; expected the "
                             f"{p} permuted rows, [{p}, hidden]")
        return _Restore.apply(hidden_states, self._perm)

    def combine(self, hidden_states: torch.Tensor, async_finish: bool = False,
                allocate_on_comm_stream: bool = False) -> torch.Tensor:
        """The rank-major combine of the restored rows; releases the handle."""
        if self.handle is None:
            raise InputError("combine: no dispatch is waiting for its combine (each dispatch is combined once)")
        out = autograd.combine(self.buffer, hidden_states, self.handle)
        self.handle = None
        self._perm = None
        return out


# -- permuting received rows by local expert ---------------------------------------------------------
class _Permutation:
    """Where each (received row, local expert) pair goes: ``row``/``slot``/``expert`` per
    permuted position (ordered by expert, then row) and ``order``, the pair's place among its
    row's experts (ascending), which fixes the order of the fp32 sums."""

    def __init__(self, recv_idx: torch.Tensor, num_local_experts: int):
        n, K = recv_idx.shape
        hit = recv_idx.unsqueeze(2) == torch.arange(num_local_experts, device=recv_idx.device)  # [N, K, L]
        multihot = hit.any(1)  # [N, L]
        expert, row = multihot.t().nonzero(as_tuple=True)
        self.row, self.expert = row, expert
        self.slot = hit.int().argmax(1)[row, expert]
        self.order = (multihot.cumsum(1) - 1)[row, expert]
        self.num_rows = n
        self.depth = int(multihot.sum(1).max()) if n else 0


def _sum_rows(rows: torch.Tensor, perm: _Permutation) -> torch.Tensor:
    """[P, H] permuted rows -> [N, H]: each row's pairs summed in fp32 by ascending expert."""
    acc = torch.zeros((perm.num_rows, rows.shape[1]), dtype=torch.float32, device=rows.device)
    for j in range(perm.depth):  # the j-th expert of every row: rows are distinct within one j
        sel = (perm.order == j).nonzero().flatten()
        acc.index_add_(0, perm.row[sel], rows[sel].float())
    return acc.to(rows.dtype)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, perm):
        ctx.perm = perm
        return x.index_select(0, perm.row)

    @staticmethod
    def backward(ctx, g):
        return _sum_rows(g, ctx.perm), None


class _Restore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, perm):
        ctx.perm = perm
        return _sum_rows(rows, perm)

    @staticmethod
    def backward(ctx, g):
        return g.index_select(0, ctx.perm.row), None


# -- making Megatron build it ---------------------------------------------------------------------------
def install(symmoe_config: Config | str | os.PathLike) -> None:
    """Megatron-Core's flex dispatcher builds ``SymmoeManager`` (on ``symmoe_config``) where it
    would build ``_DeepepManager``. Needs ``megatron-core`` importable."""
    global _default_config, _saved_manager
    import importlib

    try:
        mod = importlib.import_module(_MODULE)
    except ImportError as e:
        raise InputError(f"install: {_MODULE} does not import here ({e}); install megatron-core") from None
    if not hasattr(mod, "_DeepepManager"):
        raise InputError(f"install: this megatron-core ({mod.__file__}) has no _DeepepManager to replace")
    _default_config = symmoe_config
    if mod._DeepepManager is not SymmoeManager:
        _saved_manager = mod._DeepepManager
        mod._DeepepManager = SymmoeManager


def uninstall() -> None:
    """Undo ``install``: Megatron builds its own ``_DeepepManager`` again."""
    global _default_config, _saved_manager
    import sys

    mod = sys.modules.get(_MODULE)
    if mod is not None and _saved_manager is not None:
        mod._DeepepManager = _saved_manager
    _default_config = _saved_manager = None
