"""symmoe as a TorchTitan expert-parallel token dispatcher.

TorchTitan's ``RoutedExperts.forward`` calls its dispatcher as::

    routed_input, num_tokens_per_local_expert, metadata = dispatcher.dispatch(
        x, topk_scores, topk_expert_ids, num_local_tokens_per_expert)
    routed_output = experts(routed_input, num_tokens_per_local_expert)   # grouped GEMMs
    out = dispatcher.combine(routed_output, metadata, x)

and wires the expert-parallel mesh with ``wire_meshes(ep_mesh=...)`` (which builds the
communication buffer, as its DeepEP dispatcher does). ``SymmoeTokenDispatcher`` keeps that
contract over a ``symmoe.Buffer``:

* ``dispatch``: symmoe's expert-major dispatch. ``routed_input`` holds one row per (source
  rank, token, local expert), grouped by local expert, inside a group by source rank then
  token, each group padded with zero rows to the config's ``buffer.expert_alignment``;
  ``num_tokens_per_local_expert`` (int64, on x's device) are the padded group sizes, so the
  grouped GEMM's offsets (their cumulative sum) fall on the group boundaries. Expert ids of -1
  mean "no expert". ``num_local_tokens_per_expert`` is checked for its shape and otherwise
  unused (symmoe counts on the device).
* ``combine``: ``out[t] = sum_k fp32(score[t, k]) * fp32(row(t, k))`` in ascending k, one
  cast: the scores are applied on the token's own rank, as TorchTitan's dispatchers do.

Gradients (``symmoe.autograd``): x gets the fp32 sum of its rows' gradients (one cast), each
routed row ``score * grad_out`` of its token, each score the fp32 dot product of its row with
``grad_out``: bitwise the same on every backend and protocol. A score's gradient travels in
the rows (``4 * top_k <= hidden`` in 16-bit dtypes; checked when the buffer is built).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .. import autograd
from ..buffer import Buffer
from ..config import Config, load
from ..errors import InputError
from ..handle import DispatchHandle


@dataclass(frozen=True)
class SymmoeDispatchMetadata:
    """What ``dispatch`` hands to ``combine``: the symmoe handle and the scores (with their
    gradient) that weight each token's rows."""

    handle: DispatchHandle
    topk_scores: torch.Tensor  # [T, K] fp32


class SymmoeTokenDispatcher:
    """A TorchTitan token dispatcher over symmoe (see the module doc). Build it from its
    ``Config`` (``num_experts``, ``top_k`` and the symmoe config: a YAML path or Config), wire
    the mesh with ``wire_meshes(ep_mesh=...)`` (a DeviceMesh or a ProcessGroup), or hand it a
    Buffer with ``from_buffer``."""

    @dataclass(kw_only=True)
    class Config:
        num_experts: int
        top_k: int
        symmoe_config: "Config | str | os.PathLike"

        def build(self) -> "SymmoeTokenDispatcher":
            return SymmoeTokenDispatcher(self)

    def __init__(self, config: "SymmoeTokenDispatcher.Config"):
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.symmoe_config = config.symmoe_config
        self.ep_mesh: Any = None
        self.buffer: Buffer | None = None

    @classmethod
    def from_buffer(cls, buffer: Buffer) -> "SymmoeTokenDispatcher":
        """A dispatcher over an existing Buffer (sizes from its config)."""
        b = buffer.config.buffer
        self = cls(cls.Config(num_experts=b.num_experts, top_k=b.topk, symmoe_config=buffer.config))
        self._use(buffer, owned=False)
        return self

    def wire_meshes(self, *, ep_mesh: Any) -> None:
        """Install the expert-parallel mesh and build the Buffer over its group (collective)."""
        if ep_mesh is None:
            raise InputError("wire_meshes: ep_mesh=None; SymmoeTokenDispatcher needs expert parallelism (an EP "
                             "DeviceMesh or ProcessGroup); without EP use TorchTitan's LocalTokenDispatcher")
        self.ep_mesh = ep_mesh
        self.init_buffer()

    def init_buffer(self) -> None:
        """Build the Buffer over the EP group from the symmoe config (collective; no mesh: the
        default group, or this process alone without torch.distributed)."""
        group = self.ep_mesh.get_group() if hasattr(self.ep_mesh, "get_group") else self.ep_mesh
        cfg = self.symmoe_config
        self._use(Buffer(group, cfg if isinstance(cfg, Config) else load(cfg)), owned=True)

    def _use(self, buffer: Buffer, owned: bool) -> None:
        b = buffer.config.buffer
        try:
            for name, got, want in (("num_experts", self.num_experts, b.num_experts), ("top_k", self.top_k, b.topk)):
                if got != want:
                    raise InputError(f"SymmoeTokenDispatcher: {name}={got}, but the symmoe config "
                                     f"({buffer.config.source or 'given'}) has buffer.{'topk' if name == 'top_k' else name}"
                                     f"={want}; set it to the model's")
            pieces = 1 if buffer.dtype == torch.float32 else 4
            if pieces * b.topk > b.hidden:
                raise InputError(f"SymmoeTokenDispatcher: top_k={b.topk} x {pieces} > hidden={b.hidden} "
                                 f"({buffer.dtype}): the scores' gradients travel in {pieces} columns per slot of the rows")
        except InputError:
            if owned:
                buffer.close()
            raise
        self.buffer = buffer

    def dispatch(self, x_TD: torch.Tensor, topk_scores_TK: torch.Tensor, topk_expert_ids_TK: torch.Tensor,
                 num_local_tokens_per_expert_E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, SymmoeDispatchMetadata]:
        """``(routed_input [R, D], num_tokens_per_local_expert [L] int64, metadata)``."""
        buf = self._buffer("dispatch")
        n = num_local_tokens_per_expert_E
        if not isinstance(n, torch.Tensor) or n.numel() != self.num_experts:
            got = tuple(n.shape) if isinstance(n, torch.Tensor) else type(n).__name__
            raise InputError(f"dispatch: num_local_tokens_per_expert_E has shape {got}; expected "
                             f"({self.num_experts},), one count per expert")
        if not isinstance(topk_scores_TK, torch.Tensor) or not topk_scores_TK.is_floating_point():
            got = topk_scores_TK.dtype if isinstance(topk_scores_TK, torch.Tensor) else type(topk_scores_TK).__name__
            raise InputError(f"dispatch: topk_scores_TK has dtype {got}; expected a floating-point tensor [T, top_k]")
        scores = topk_scores_TK.float()
        d = autograd.dispatch(buf, x_TD, topk_expert_ids_TK, scores.detach(), output_layout="expert")
        sizes = torch.diff(d.handle.expert_offsets).to(device=x_TD.device, dtype=torch.int64)
        return d.x, sizes, SymmoeDispatchMetadata(d.handle, scores)

    def combine(self, routed_output_RD: torch.Tensor, metadata: SymmoeDispatchMetadata,
                x_TD: torch.Tensor | None = None) -> torch.Tensor:
        """``out [T, D]``: each token's rows weighted by its scores, summed in fp32, one cast.
        ``x_TD`` (the dispatched tokens) is only checked against the handle."""
        buf = self._buffer("combine")
        if not isinstance(metadata, SymmoeDispatchMetadata):
            raise InputError(f"combine: metadata is a {type(metadata).__name__}; expected the "
                             "SymmoeDispatchMetadata this dispatcher's dispatch returned")
        h = metadata.handle
        if x_TD is not None and (not isinstance(x_TD, torch.Tensor) or x_TD.shape[0] != h.num_tokens):
            got = tuple(x_TD.shape) if isinstance(x_TD, torch.Tensor) else type(x_TD).__name__
            raise InputError(f"combine: x_TD has shape {got}; the dispatch took {h.num_tokens} tokens")
        return autograd.combine(buf, routed_output_RD, h, metadata.topk_scores)

    def _buffer(self, call: str) -> Buffer:
        if self.buffer is None:
            raise InputError(f"{call}: no Buffer yet; call wire_meshes(ep_mesh=...) first (or build the "
                             "dispatcher with SymmoeTokenDispatcher.from_buffer)")
        return self.buffer

    def close(self) -> None:
        """Free the Buffer (after the last backward)."""
        if self.buffer is not None:
            self.buffer.close()

