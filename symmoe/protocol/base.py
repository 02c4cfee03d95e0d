"""The contract between ``symmoe.Buffer`` and the code that moves the data.

A protocol runs over one SymmetricMemory. ``Buffer`` validates every argument before it
calls in here; a protocol may still raise CapacityError once the counts are exchanged
(every rank sees the same counts matrix, so every rank raises together).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ..config import Config
from ..errors import InputError
from ..handle import DispatchHandle
from ..layout import BufferLayout
from ..memory import SymmetricMemory
from ..results import DispatchLayout, RecvResult
from .counts import NO_GUESS, Guess
from .outputs import dispatch_outputs

if TYPE_CHECKING:
    from ..fp8 import Fp8Rows


MAX_SLOTS = 64  # combine slots per token, max(world_size, topk): csrc/common/reduce.cuh (kMaxSlots)

try:
    from torch._C import _cuda_getCurrentRawStream as _raw_stream  # torch's own (inductor's get_raw_stream)
except ImportError:  # a CPU-only torch, where no GPU protocol runs
    _raw_stream = None


def stream_handle(device: torch.device) -> int:
    """The cudaStream_t of ``device``'s current stream, for a launch. Where only the handle is
    needed this skips building a torch.cuda.Stream: ``torch.cuda.current_stream(device).cuda_stream``
    costs about 5 µs a call on a GPU machine's host, once per call or more."""
    return _raw_stream(device.index)


def stall_detail(stage: str, peer: int, epoch: int) -> str:
    """What an expired device wait recorded at ``stage`` (its ErrorWord's peer and epoch), in words."""
    if stage == "bulk copy":
        return f"a bulk (TMA) load of warp {peer} never completed in the kernel of barrier epoch {epoch}"
    if stage == "dispatch.route":
        return f"chunk {peer} of the routing kernel was never counted (its block did not run) in the dispatch of epoch {epoch}"
    if stage == "dispatch.phase":
        return (f"not every block of the dispatch kernel reached its phase {peer} (grid-wide kernel.fan_phases "
                f"needs them all resident at once) in the call of epoch {epoch}")
    return f"no arrival from rank {peer} at barrier epoch {epoch}"


def check_combine_slots(layout: BufferLayout, protocols: str) -> None:
    if layout.combine_slots > MAX_SLOTS:
        raise InputError(f"max(world_size, topk) = {layout.combine_slots}; at most {MAX_SLOTS} with the {protocols}")


class Protocol(ABC):
    name: str  # "push" | "pull"
    # True: dispatch checks the expert ids (range, duplicates) inside its routing kernel and
    # raises InputError on every rank, so Buffer skips its host-side check (a device sync).
    checks_topk_values: bool = False

    def handle_keeps_routing(self, output_layout: str) -> bool:
        """True when a handle of ``output_layout`` holds its own copy of every part of the
        routing that later calls (cached dispatch, combine) read, so the caller may change
        ``topk_idx``/``topk_weights`` after dispatch; False: the handle reads the caller's tensors
        (the host protocols re-dispatch from them)."""
        return False
    # Host clock (time.perf_counter) just before and after the last dispatch's wait for the
    # counts (GPU protocols; None before the first): the bench splits a dispatch's host time there.
    wait_marks: tuple[float, float] | None = None
    # GPU protocols: their extension's CountsWait over the mapped words, and its COUNTS_FILLED
    # (_wait_counts).
    _counts_wait: Any
    _filled: int

    def __init__(self, mem: SymmetricMemory, layout: BufferLayout, config: Config, buffer_id: int):
        self.mem, self.layout, self.config, self.buffer_id = mem, layout, config, buffer_id
        self._input_views: dict[tuple[int, torch.dtype, int], torch.Tensor] = {}  # input_view's, by shape

    def _wait_counts(self, epoch: int, guess: Guess | None) -> bool:
        """The one host wait of a GPU dispatch, with its marks; True when the wait filled
        ``guess`` (its result is complete, nothing is to be raised), False when the host must
        read the counts. ``self._counts_wait`` (host_wait.h's CountsWait, the protocol's) spins
        on the host-mapped word the routing kernel sets once the counts matrix is in host memory
        (ready also when a device wait failed: the caller checks the error word). Every ms
        without it the current stream is asked, where the data kernel was the last launch: a
        fault raises there, and a finished data kernel means the routing's matrix is in place.
        (An event recorded for this cost every dispatch ~8 µs of host time; the stream is asked
        only on the slow path.) Spinning wakes within a microsecond; ``event.synchronize()``
        woke tens of µs after the kernel."""
        target = guess.target if guess is not None else NO_GUESS
        wait = self._counts_wait.wait
        t0 = time.perf_counter()
        stream = None
        while not (got := wait(epoch, 1e-3, *target)):
            stream = stream or self._stream()
            if stream.query():
                break
        self.wait_marks = (t0, time.perf_counter())
        return got == self._filled

    def _stream(self) -> torch.cuda.Stream:
        """The current stream of this protocol's device (the GPU protocols' launches go there)."""
        return torch.cuda.current_stream(self.mem.device)

    @abstractmethod
    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        """Counts of this rank's own routing; no communication."""

    @abstractmethod
    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 output_layout: str, alignment: int, worst: int = 0,
                 split: Fp8Rows | None = None) -> tuple[RecvResult, DispatchHandle]:
        """Collective. Returns this rank's received rows (as ``symmoe.reference`` defines them);
        ``worst`` > 0: outputs of that many rows (``results.pad_recv``), CapacityError on
        every rank when some rank receives more. ``split``: an FP8 dispatch whose rows the
        protocol packs into x (or reads where they lie) and returns split, ``recv.x =
        (x_e4m3, scales)`` with row-major scales; only where ``fp8_split`` said so."""

    def fp8_split(self, worst: int) -> bool:
        """Whether this protocol's dispatch (``worst`` rows, 0: exact) returns packed FP8 rows
        split (``dispatch(..., split=...)``); else the caller splits them after (``fp8.unpack``)."""
        return False

    def dispatch_cached(self, x: torch.Tensor, handle: DispatchHandle, worst: int = 0,
                        split: Fp8Rows | None = None) -> RecvResult:
        """Collective: ``x`` along the routing of ``handle`` (every rank passes its handle of
        the same earlier dispatch); the rows land where that dispatch put them. This default
        runs the whole dispatch again from the handle's routing; the GPU protocols keep the
        routing's device state in ``handle.cache`` and skip the routing and the host wait."""
        return self.dispatch(x, handle.topk_idx, handle.topk_weights, handle.output_layout, handle.alignment,
                             max(worst, handle.num_worst_tokens), split)[0]

    @abstractmethod
    def combine(self, y: torch.Tensor, handle: DispatchHandle,
                recv_topk_weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Collective. Returns (combined_x [T, H], combined_topk_weights [T, K] or None)."""

    def _capacity(self, output_layout: str) -> int:
        """Rows of a GPU dispatch's worst-case outputs: ``recv_rows`` (buffer.recv_capacity),
        or fewer when the layout cannot produce that many."""
        return min(self.layout.recv_rows, self.layout.worst_case_rows(output_layout))

    def _outputs(self, cap: int, output_layout: str, dtype: torch.dtype, *extra: int, cols: int = 0,
                 in_rank_tokens: int = -1) -> dict[str, Any]:
        """A GPU dispatch's outputs of ``cap`` rows, which its data kernels fill: tensors "x"
        (rows of ``cols`` elements of ``dtype``; 0: hidden, an FP8 dispatch's byte rows are
        narrower), "idx", "w", "expert_offsets" (expert-major, else None), and "block", an
        ``Int32Block`` whose pieces 0-2 are the source rank, token and slot columns and then one
        piece of each ``extra`` size (the protocol's own state of the dispatch); with
        ``in_rank_tokens`` >= 0 also "in_rank", the dispatch's is_token_in_rank of that many tokens."""
        return dispatch_outputs(self.layout, cap, output_layout, dtype, self.mem.device, *extra, cols=cols,
                                in_rank_tokens=in_rank_tokens)

    def _per_expert(self) -> torch.Tensor:
        """A num_worst_tokens dispatch's per-local-expert row counts, which the device writes."""
        return torch.empty(self.layout.local_experts, dtype=torch.int32, device=self.mem.device)

    def input_view(self, num_tokens: int, dtype: torch.dtype, cols: int = 0) -> torch.Tensor:
        """This rank's ``input`` region as x [num_tokens, cols] (0: hidden; Buffer.input_view),
        rows ``cols`` elements apart: narrower rows (an FP8 dispatch's) lie packed. Made once per
        shape (three tensor ops that every FP8 and pull dispatch paid): the same memory each time."""
        key = (num_tokens, dtype, cols)
        view = self._input_views.get(key)
        if view is None:
            view = self._input_views[key] = self.mem.view(self.layout.offsets()["in_x"], dtype,
                                                          (num_tokens, cols or self.layout.hidden))
        return view

    def row_bytes(self, x: torch.Tensor) -> int:
        """What the kernels take as ``row_bytes`` for x: its row bytes where they are fewer than
        the layout's (an FP8 dispatch's packed rows), else 0 (full rows)."""
        rb = x.shape[1] * x.element_size()
        return 0 if rb == self.layout.x_row_bytes else rb

    def _in_input_region(self, x: torch.Tensor) -> bool:
        """x is the input region itself (built there by the caller): nothing to publish."""
        return x.data_ptr() == self.mem.local.data_ptr() + self.layout.offsets()["in_x"]

    def barrier_on_stream(self) -> None:
        """Queue a device barrier of all ranks on the current stream (no host wait): the
        ranks' streams leave it together. A wait past the timeout is raised by the next call
        (stage "barrier"). The GPU benchmark lines up the ranks' starts with it."""
        raise NotImplementedError(f"{type(self).__name__} has no stream-ordered barrier")

    def check(self, synchronize: bool = False) -> None:
        """Raise StallError if a device wait of an earlier call expired (after waiting for the
        stream when ``synchronize``). Host protocols finish inside each call: nothing to check."""

    def close(self) -> None:
        """Release what the protocol holds besides the SymmetricMemory (streams, modules), and its
        views of that memory (which would keep it alive)."""
        self._input_views.clear()
