"""push and pull on the GPU: the flow of ``host.py``, run by the CUDA kernels in ``csrc/``.

dispatch (both protocols)
  1. the routing kernel (one launch, one chunk of tokens per block, walked once: a block numbers
     its pairs inside the chunk, then places them once every earlier chunk is counted): routing
     counts and each (token, rank) / (token, slot) position among this rank's tokens, expert ids
     checked; publishes topk (int32), weights and positions in the ``input`` region, stores its
     counts row into every peer, barrier "dispatch.counts", then leaves the whole matrix in
     host-mapped memory. Pull also publishes x there when there are peers (zero-copy notes).
  2. the data kernel is launched right behind, into outputs sized for the worst case, so
     the host's wait for the matrix overlaps the data movement instead of idling the GPU. It
     follows the routing kernel by programmatic dependent launch (common/follow_launch.h):
     its blocks are scheduled while the routing kernel runs and start when it ends.
  3. pull: each receiver fetches the rows meant for it from every source's ``input`` with
     TMA bulk copies (peer global -> shared -> output), barrier "dispatch.done".
     push: each sender bulk-stores its rows into the receivers' ``recv`` pools, barrier
     "dispatch.data"; receivers unpack the pool into the outputs. With ``kernel.push_mode``
     "stream" (the "auto" choice when every rank has a GPU of its own) one kernel does both:
     sender blocks raise a channel's tail word at each peer after every chunk of rows, and
     receiver blocks copy the rows out of the pool as they land.
     Alone (world size 1) both protocols move the rows with ``kernels/alone.cuh``'s kernels,
     as nvshmem does (the rank-major mover, the expert-major phased fan-out), except when
     ``kernel.fan_phases`` is off (expert-major) or a timeline is recording; right behind the
     routing kernel they start on its chunks' placed marks, not on its grid's end.
  4. the host reads the routing kernel's summary of the matrix (its rows, the most any
     receiver gets, its per-expert counts: ``counts.summary_of``), and only when it names bad
     ids (tokens = -1 in a row: nothing moved) or a receiver over capacity reads the matrix to
     raise InputError / CapacityError on every rank; it returns views of the first ``rows``
     rows of the outputs.
cached dispatch (``dispatch(x, handle=...)``)
  the handle keeps the routing's device state: a copy of the published ids, weights and
  positions, and the dispatch's device copy of the counts matrix. They are put back into
  the ``input`` and ``counts`` regions (another dispatch may have overwritten them), then
  barrier "dispatch.counts" and step 3 into outputs of exactly the handle's rows: no routing
  kernels and no host wait (a stall surfaces at the next call, as in combine).
combine (both protocols)
  5. receivers bulk-store each row into its source's ``combine`` region at ``t * S + slot``,
     barrier "combine.data"; 6. sources reduce in fixed order in fp32 and cast once, barrier
     "combine.done". No host synchronisation.

Zero-copy paths:
  * a rank's own rows never go through the symmetric buffer: pull reads them from ``x``
    itself, push writes them straight into the outputs, combine reduces them from ``y``
    where it lies (the data kernels record their rows in the dispatch's ``selfmap``). At
    world size 1 nothing is copied into the buffer at all, and combine is one kernel.
  * with peers, pull must publish ``x`` in the ``input`` region; a caller that builds x in
    ``Buffer.input_view(num_tokens)`` (e.g. as the output of the previous layer) skips that copy.

Errors: every device wait has the configured timeout; on expiry the kernel records the
stage and the missing peer in host-mapped memory and finishes. ``check()`` turns that into
StallError; dispatch checks after its host wait, every call checks on entry, and
``check(synchronize=True)`` waits for the stream first (combine does not wait on the host).
After a StallError the buffer is unusable (the ranks' barrier epochs diverged).
"""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import build, fp8
from ..config import Config
from ..errors import InputError, StallError
from ..fp8 import FP8_DTYPE, Fp8Rows
from ..handle import DispatchHandle
from ..layout import BufferLayout
from ..memory import SymmetricMemory
from ..results import DispatchLayout, RecvResult
from ..launch_shape import GpuSms, LaunchShape, cuda_shape, fan_phases_mode, gpu_sms, may_stream, stream_split
from .base import Protocol, check_combine_slots, stall_detail, stream_handle
from .counts import (SUMMARY_HEAD, Guess, cached_rows, check_summary_head, deferred_error, make_handle,
                     recv_views, summarized_result)
from .outputs import SRC_RANK, SRC_SLOT, SRC_TOKEN, Int32Block

MAX_LOCAL_EXPERTS = 4096  # the data kernels keep per-expert tables in shared memory


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


# A dispatch's own int32 pieces after the source columns (outputs.Int32Block)
_SELFMAP, _COUNTS, _ROUTING = 3, 4, 5


def _kernel_outputs(out: dict[str, Any], cap: int, selfmap: int) -> dict[str, int]:
    """The data kernels' view of a dispatch's outputs: their pointers and their rows, and
    where they record the rows this rank kept of its own tokens (0: already recorded). The
    outputs hold at least one row each (data_ptr directly: a call less each, on every dispatch)."""
    block, offs = out["block"], out["expert_offsets"]
    return {"x": out["x"].data_ptr(), "idx": out["idx"].data_ptr(), "w": out["w"].data_ptr(),
            "expert_offsets": 0 if offs is None else offs.data_ptr(), "src_rank": block.ptr(SRC_RANK),
            "src_token": block.ptr(SRC_TOKEN), "src_slot": block.ptr(SRC_SLOT), "capacity": cap, "selfmap": selfmap}


def _with_scales(recv: RecvResult, scales: torch.Tensor | None) -> RecvResult:
    """``recv`` of a dispatch whose rows the unpack split (its x: their e4m3 bytes) with x
    paired with their scales, ``(x_e4m3, scales)``; as it is without ``scales``."""
    if scales is None:
        return recv
    # Made directly: dataclasses.replace costs several µs of field introspection per call.
    return RecvResult((recv.x, scales[:recv.x.shape[0]]), recv.topk_idx, recv.topk_weights,
                      recv.num_recv_tokens_per_expert, recv.src_rank, recv.src_token, recv.expert_offsets)


def _gpu_sharing(mem: SymmetricMemory, gpu: GpuSms) -> tuple[int, int]:
    """(most ranks of the group on one GPU, fewest SMs of their GPUs): the same on every rank;
    collective."""
    every = mem.all_gather((str(torch.cuda.get_device_properties(mem.device).uuid), gpu.total))
    gpus = [u for u, _ in every]
    return max(gpus.count(u) for u in gpus), min(n for _, n in every)


class _RoutingState(NamedTuple):
    """What a dispatch's handle keeps on the device (``handle.cache``): device addresses in
    ``block``, which it keeps alive."""

    block: Int32Block
    routing: int        # copy of the published ids, weights and positions (cached dispatch)
    routing_bytes: int
    counts: int         # its counts matrix (unpack, cached dispatch)
    selfmap: int        # output row of each (token, slot) this rank kept (combine)


class _CudaProtocol(Protocol):
    checks_topk_values = True  # the routing kernel checks the expert ids (counts.bad_input_error)

    def handle_keeps_routing(self, output_layout: str) -> bool:
        # The cached dispatch reads the routing kernel's copy (handle.cache); the rank-major
        # combine reads only the handle's is_token_in_rank, the expert-major one the caller's
        # topk_idx and topk_weights.
        return output_layout == "rank"

    def __init__(self, mem: SymmetricMemory, layout: BufferLayout, config: Config, buffer_id: int):
        super().__init__(mem, layout, config, buffer_id)
        if not mem.maps_every_peer:
            raise InputError(f"backend '{mem.name}' does not reach every peer by load/store, which the shared "
                             "CUDA kernels need")
        if layout.local_experts > MAX_LOCAL_EXPERTS:
            raise InputError(f"{layout.local_experts} experts per rank; the CUDA protocols handle at most "
                             f"{MAX_LOCAL_EXPERTS} (num_experts / world_size)")
        check_combine_slots(layout, "CUDA protocols")
        self.device = mem.device
        self.rank, self.world_size = mem.rank, mem.world_size
        self.timeout_s = config.kernel.timeout_s
        self.mod = build.load("symmoe_cuda")
        self._stage_names = {v: k for k, v in self.mod.STAGES.items()}
        self._err = self.mod.host_alloc_mapped(64)  # (host, device) pointers of the ErrorWord
        self._err_dev = torch.zeros(8, dtype=torch.int64, device=self.device)  # the copy kernels poll
        self._counters = torch.zeros(8, dtype=torch.int32, device=self.device)
        args = layout.kernel_args()
        gpu = gpu_sms(self.device)
        # may_stream is the same on every rank: so is the collective gather.
        sharing = _gpu_sharing(mem, gpu) if may_stream(config.kernel, self.name, self.world_size) else None
        self.shape: LaunchShape = cuda_shape(config.kernel, gpu, sharing)
        # Peers by the pointers in peer_bases (torch, nccl's LSA team, nvshmem_ptr on one node).
        self.ctx = self.mod.Context(args, self.rank, mem.local.data_ptr(), mem.peer_bases.data_ptr(),
                                    self._err_dev.data_ptr(), self._err[1], self.timeout_s, self.shape.kernel_args(),
                                    self._counters.data_ptr())
        self.ctx.set_copy_bytes(config.kernel.copy_bytes)
        self.ctx.set_copy_depth(config.kernel.copy_depth)
        self.ctx.set_fan_phases(fan_phases_mode(config, self.world_size, gpu))
        # How the data kernels move rows (csrc/bindings/ctx_dispatch_call.cuh's ctx_move), fixed here.
        modes = self.mod.MOVE_MODES
        if self.name == "pull":
            self._move_mode = (modes["pull"], 0, 0)
        elif self.shape.stream:
            self._move_mode = (modes["push_stream"],
                               *stream_split(self.shape.stream, layout.num_channels, config.kernel.stream_receivers))
        else:
            self._move_mode = (modes["push"], 0, 0)
        # Only the push with peers has an unpack, which writes an FP8 dispatch's rows split.
        self._splits_fp8 = self._move_mode[0] == modes["push"] and self.world_size > 1
        self._epoch = 0
        W, E = layout.world_size, layout.num_experts
        self._published: _RoutingState | None = None  # whose routing copy is now in the input region
        # zeroed: route_kernel's chunk marks start below every epoch
        self._route_scratch = torch.zeros(self.ctx.layout_scratch_bytes() // 4, dtype=torch.int32, device=self.device)
        self._scratch_ptr = self._route_scratch.data_ptr()
        # The routing kernel leaves the exchanged counts matrix in host-mapped memory (and, for
        # push, a device snapshot): no copy launches between the routing and the data kernels.
        cells = W * (1 + W + E)
        self._counts_mapped = self.mod.host_alloc_mapped(4 * cells)
        self._counts_np = np.ctypeslib.as_array((ctypes.c_int32 * cells).from_address(self._counts_mapped[0])).reshape(W, 1 + W + E)
        check_summary_head(self.mod.__name__, self.mod.SUMMARY_HEAD)
        # Beside the matrix, what the host reads of it after its wait (counts.summary_of).
        words = SUMMARY_HEAD + layout.local_experts
        self._summary = self.mod.host_alloc_mapped(4 * words)
        self._summary_np = np.ctypeslib.as_array((ctypes.c_int32 * words).from_address(self._summary[0]))
        self._counts_ready = self.mod.host_alloc_mapped(8)  # the dispatch's epoch once the matrix is in
        self._counts_shape = (W, 1 + W + E)
        self._bad_flag = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._bad_info = self.mod.host_alloc_mapped(32)  # kind, token, slot, value (int64 each)
        self.ctx.set_input_check(self._bad_flag.data_ptr(), self._bad_info[1])
        self._deferred = self.mod.host_alloc_mapped(64)  # DeferredError of a dispatch without the host wait
        # check()'s views of the two host-mapped records, made once: every dispatch runs it
        self._deferred_rec = (ctypes.c_int64 * 6).from_address(self._deferred[0])
        self._err_rec = (ctypes.c_int64 * 4).from_address(self._err[0])
        self._counts_wait = self.mod.CountsWait(self._counts_ready[0], self._err[0], self._deferred[0], self._summary[0],
                                                SUMMARY_HEAD, self._counts_mapped[0], cells, layout.local_experts,
                                                layout.recv_rows)
        self._filled = self.mod.COUNTS_FILLED
        offs = layout.offsets()
        self._offs = offs
        self._base = mem.local.data_ptr()
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------
    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _region(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return self.mem.view(self._offs[name], dtype, shape)

    def check(self, synchronize: bool = False) -> None:
        """Raise StallError if a device wait of an earlier call expired; InputError or
        CapacityError (once) for an earlier num_worst_tokens dispatch that did not wait."""
        if synchronize:
            self._stream().synchronize()
        record = self._deferred_rec
        if record[0]:
            error = deferred_error(self.layout, list(record), self.rank, self.mod.DEFERRED, self._bad_record)
            record[0] = 0  # raised once: the buffer stays usable (the kernels kept inside their capacity)
            raise error
        word = self._err_rec
        if word[0]:
            stage = self._stage_names.get(int(word[0]), f"stage {int(word[0])}")
            what = stall_detail(stage, int(word[1]), int(word[2]))
            self.mem.mark_broken()
            raise StallError(self.rank, stage, self.timeout_s, f"{what}; this Buffer is unusable now")

    def host_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The last exact-size dispatch's counts matrix and its summary as the routing kernel
        left them in host-mapped memory (views: the next dispatch rewrites them)."""
        return self._counts_np, self._summary_np

    def _bad_record(self) -> tuple[int, ...]:
        """This rank's record of the first bad expert id (kind, token, slot, value), host-mapped."""
        return tuple((ctypes.c_int64 * 4).from_address(self._bad_info[0]))

    def barrier_on_stream(self) -> None:
        self.check()
        self.ctx.barrier(self._offs["barrier"], self._next_epoch(), self.mod.STAGES["barrier"],
                         stream_handle(self.device))

    def _check_aligned(self, name: str, t: torch.Tensor) -> None:
        if t.numel() and t.data_ptr() % 16:
            raise InputError(f"{name} starts at an address that is not 16-byte aligned ({t.data_ptr():#x}); "
                             "bulk copies need 16-byte alignment (use a fresh or .clone()d tensor)")

    # -- routing ---------------------------------------------------------------------------
    def _layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, publish: bool,
                per_rank: torch.Tensor | None, per_expert: torch.Tensor | None, in_rank: torch.Tensor, sp: int) -> None:
        epoch = self._next_epoch() if publish else 0
        self.ctx.layout(_ptr(topk_idx), topk_idx.dtype == torch.int64, _ptr(topk_weights), topk_idx.shape[0],
                        _ptr(self._route_scratch), _ptr(in_rank), _ptr(per_rank), _ptr(per_expert), publish, epoch, sp)

    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        self.check()
        W, E, T = self.layout.world_size, self.layout.num_experts, topk_idx.shape[0]
        per_rank = torch.empty(W, dtype=torch.int32, device=self.device)
        per_expert = torch.empty(E, dtype=torch.int32, device=self.device)
        in_rank = torch.empty((T, W), dtype=torch.bool, device=self.device)  # the kernel writes every entry
        self._layout(topk_idx.contiguous(), None, False, per_rank, per_expert, in_rank, stream_handle(self.device))
        return DispatchLayout(per_rank, per_expert, in_rank)

    # -- dispatch --------------------------------------------------------------------------
    def fp8_split(self, worst: int) -> bool:
        # The tail kernel that fills worst-case rows writes whole rows: not split.
        return self._splits_fp8 and not worst

    def _row_shape(self, x: torch.Tensor, split: Fp8Rows | None) -> tuple[torch.dtype, int]:
        """The x output's dtype and columns: an FP8 dispatch split by the unpack gets e4m3 rows."""
        return (FP8_DTYPE, self.layout.hidden) if split is not None else (x.dtype, x.shape[1])

    def _fp8_rows(self, x: torch.Tensor, args: dict[str, int], out: dict[str, Any], split: Fp8Rows | None,
                  worst: int) -> tuple[int, torch.Tensor | None]:
        """(the kernels' x, the scales output). Without ``split``: x's rows, none. With it (an
        FP8 dispatch; ``out["x"]`` made as its e4m3 rows [cap, H]): the unpack writes the rows
        split, into those and a scale output [cap, S] made here (csrc/bindings/ctx_dispatch.cuh's
        outputs), and the push reads them from the caller's two tensors where they allow it
        (``Fp8Rows.two_sources``: the kernels' x is then the e4m3 rows, MoveCfg::x_tail the
        scales), else from x [T, row bytes], packed here (``fp8.pack``)."""
        if split is None:
            return x.data_ptr(), None
        if not self.fp8_split(worst):
            raise ValueError(f"{self.name} protocol at world size {self.world_size}, worst={worst}: no split rows")
        fmt = split.format
        scales = torch.empty((out["x"].shape[0], fmt.scale_cols), dtype=fmt.scale_dtype, device=self.device)
        args.update(fp8_data=args["x"], fp8_scales=scales.data_ptr(), fp8_h=self.layout.hidden, fp8_s=fmt.scale_cols)
        if split.two_sources():
            args.update(x_tail=split.scales.data_ptr(), x_head=self.layout.hidden)
            return split.data.data_ptr(), scales
        fp8.pack(split.data, split.scales, x)
        return x.data_ptr(), scales

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 output_layout: str, alignment: int, worst: int = 0,
                 split: Fp8Rows | None = None) -> tuple[RecvResult, DispatchHandle]:
        self.check()
        lay, me = self.layout, self.rank
        W, T = lay.world_size, x.shape[0]
        expert_major = output_layout == "expert"
        self._check_aligned("x", x)
        topk_idx = topk_idx.contiguous()
        topk_weights = topk_weights.float().contiguous()
        self._publish_x(x)
        rows_dtype, cols = self._row_shape(x, split)
        # Allocate everything first: the launches below then follow each other closely.
        cap = self._capacity(output_layout)  # what the kernels may write; `worst` rows are returned
        if worst:  # kept inside those rows too: outputs of exactly `worst` rows, returned whole (no slices)
            cap = min(cap, worst)
        # Besides the outputs, int32 pieces of one allocation:
        # - selfmap: the output row of each (token, slot) this rank keeps; combine reduces those
        #   rows in place (written by the data kernels; entries of other ranks' slots are never read);
        # - counts_dev: this dispatch's own device copy of the counts matrix (unpack reads it after
        #   peers may have moved on; a cached dispatch reuses it), written by the routing kernel;
        # - routing: the published routing, for a cached dispatch after other dispatches overwrote
        #   it; the routing kernel stores this copy as it publishes (no copy launch).
        # The int32 pieces are only pointers here (outputs.Int32Block).
        routing_bytes, cells = self._routing_bytes(T), W * self._counts_shape[1]
        out = self._outputs(max(cap, worst), output_layout, rows_dtype, max(1, T * lay.combine_slots), cells,
                            routing_bytes // 4, cols=cols, in_rank_tokens=T)
        block = out["block"]
        selfmap, counts_dev, routing = block.ptr(_SELFMAP), block.ptr(_COUNTS), block.ptr(_ROUTING)
        args = _kernel_outputs(out, cap, selfmap)
        x_ptr, scales = self._fp8_rows(x, args, out, split, worst)
        in_rank = out["in_rank"]  # the routing kernel writes every entry
        sp = stream_handle(self.device)
        per_expert = self._per_expert() if worst else None
        # The routing kernel publishing at `epoch` (it writes it to _counts_ready after the counts
        # matrix), then the data kernels at the next epoch: one call. num_worst_tokens: no host
        # wait, so no host copy of the counts either.
        epoch = self._epoch + 1
        self._epoch += 2
        self.ctx.dispatch(0 if worst else self._counts_mapped[1], counts_dev, routing,
                          0 if worst else self._counts_ready[1], 0 if worst else self._summary[1],
                          topk_idx.data_ptr(), topk_idx.dtype == torch.int64, topk_weights.data_ptr(), T,
                          self._scratch_ptr, in_rank.data_ptr(), epoch, x_ptr, args, expert_major,
                          alignment, *self._move_mode, epoch + 1, sp, self.row_bytes(x))
        cache = self._published = _RoutingState(block, routing, routing_bytes, counts_dev, selfmap)
        if worst:  # DeepEP's num_worst_tokens: the device finishes what the host would read
            recv = self._tail(out, counts_dev, worst, expert_major, alignment, self.row_bytes(x), per_expert)
            counts = block.piece(_COUNTS, cells).view(self._counts_shape)  # the handle's, on the device
            return recv, make_handle(output_layout, topk_idx, topk_weights, in_rank, counts, out, recv,
                                     self.buffer_id, alignment, cache, worst)

        # The data kernel keeps the GPU busy meanwhile; what needs no counts is done before.
        topk_idx = topk_idx.long()  # the handle's (a launch for int32 ids)
        guess = Guess.of(lay, output_layout, alignment, out, topk_idx, topk_weights, in_rank, self.buffer_id, cache)
        if self._wait_counts(epoch, guess):
            return _with_scales(guess.recv, scales), guess.handle  # the wait found nothing to raise
        self.check()
        recv, handle = summarized_result(lay, self._summary_np, self._counts_np, me, output_layout, alignment,
                                         self._bad_record, out, topk_idx, topk_weights, in_rank, self.buffer_id, cache)
        return _with_scales(recv, scales), handle

    def _tail(self, out: dict[str, Any], counts_dev: int, worst: int, expert_major: bool,
              alignment: int, row_bytes: int, per_expert: torch.Tensor | None = None) -> RecvResult:
        """The ``worst`` rows of a dispatch that does not wait on the host: after the data
        kernels, a kernel fills the rows past the received ones (of ``row_bytes``, as the data
        kernels') and counts the rows per local expert (into ``per_expert``) from the device's
        counts matrix; errors come back at a later call (check)."""
        if per_expert is None:
            per_expert = self._per_expert()
        self.ctx.recv_tail(counts_dev, _kernel_outputs(out, worst, 0), worst, expert_major,
                           alignment, per_expert.data_ptr(), self._deferred[1], self._epoch, stream_handle(self.device),
                           row_bytes)
        return recv_views(out, worst, per_expert)  # the tail's kernel filled what the host would

    def _publish_x(self, x: torch.Tensor) -> None:
        """pull with peers: x into the input region, where they read it (own rows are read
        from x itself); nothing when x was built there (Buffer.input_view)."""
        if self.name == "pull" and self.world_size > 1 and x.shape[0] and not self._in_input_region(x):
            self.input_view(x.shape[0], x.dtype, x.shape[1]).copy_(x)

    def _move(self, x: torch.Tensor, args: dict[str, Any], expert_major: bool, alignment: int,
              counts_dev: int, after_route: bool, sp: int, x_ptr: int = 0) -> None:
        """The data kernels, after the routing (or its republication) and the counts barrier
        (``ctx_move`` in csrc/bindings/ctx_dispatch_call.cuh). Alone, the alone kernels where
        they apply (``ctx_alone``), as nvshmem runs them; ``after_route`` (right behind this
        dispatch's routing kernel): they start on the routing's placed chunks, before its last
        block hands the counts over (the expert-major one loads its first rows even before
        that). ``sp``: the current stream's handle. Rows of x's width (``row_bytes``: an FP8
        dispatch's are narrower), read from ``x_ptr`` where given (``_fp8_rows``)."""
        self.ctx.move(x_ptr or _ptr(x), args, expert_major, alignment, counts_dev, after_route, *self._move_mode,
                      self._next_epoch(), sp, self.row_bytes(x))

    def _routing_bytes(self, T: int) -> int:
        """Bytes of the input region, from ``in_idx`` on, that the routing kernel publishes (ids,
        weights, then the positions of T tokens; whole 16-byte vectors): what the data kernels
        read besides x and the counts."""
        start, pos = self._offs["in_idx"], self._offs["in_pos"]
        n = pos - start + 4 * T * (self.world_size + self.layout.topk)
        return (n + 15) // 16 * 16

    def dispatch_cached(self, x: torch.Tensor, handle: DispatchHandle, worst: int = 0,
                        split: Fp8Rows | None = None) -> RecvResult:
        """The routing of ``handle`` put back (its published ids, weights and positions, and
        its counts matrix: another dispatch may have overwritten them) and the barrier in one
        kernel, then the data kernels into outputs of exactly the handle's rows. No routing,
        no host wait."""
        self.check()
        lay = self.layout
        self._check_aligned("x", x)
        cache = handle.cache
        worst = max(worst, handle.num_worst_tokens)
        counted = not handle.counts.is_cuda  # else the dispatch never waited: its counts are on the device
        if counted:
            _, rows, per_expert = cached_rows(lay, handle, self.rank, worst)  # raises before any launch
        else:
            # what the kernels may write (the received rows are fewer), never past recv_rows
            rows = min(handle.num_recv_rows, self._capacity(handle.output_layout))
        self._publish_x(x)
        rows_dtype, cols = self._row_shape(x, split)
        out = self._outputs(max(rows, 1, worst), handle.output_layout, rows_dtype, cols=cols)
        args = _kernel_outputs(out, max(rows, 1), 0)  # same routing: the handle's selfmap holds
        x_ptr, scales = self._fp8_rows(x, args, out, split, worst)
        # Then the counts barrier: peers read what was just republished (pull) and may refill
        # pools this rank still unpacks from an earlier dispatch (push). Alone, with this
        # routing still in place, there is nothing to put back and no one to wait for.
        sp = stream_handle(self.device)
        if self.world_size > 1 or self._published is not cache:
            self.ctx.republish(cache.routing, cache.routing_bytes, cache.counts, self._next_epoch(), sp)
            self._published = cache
        self._move(x, args, handle.output_layout == "expert", handle.alignment, cache.counts, False, sp, x_ptr)
        if not counted:
            return self._tail(out, cache.counts, worst, handle.output_layout == "expert", handle.alignment,
                              self.row_bytes(x))
        return _with_scales(recv_views(out, rows, per_expert, worst), scales)

    # -- combine ---------------------------------------------------------------------------
    def combine(self, y: torch.Tensor, handle: DispatchHandle,
                recv_topk_weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.check()
        lay = self.layout
        self._check_aligned("x", y)
        T, rows = handle.num_tokens, handle.num_recv_rows
        expert_major = handle.output_layout == "expert"
        sp = stream_handle(self.device)
        rw = recv_topk_weights.float().contiguous() if recv_topk_weights is not None else None
        out, out_w = build.load("symmoe_host").combine_outputs(T, lay.hidden, y.dtype, lay.topk if rw is not None else 0,
                                                               self.device)
        # The send (with peers) and the reduction, at consecutive epochs: one call.
        epoch = self._next_epoch()
        if self.world_size > 1:
            self._next_epoch()  # the reduction's (ctx_combine: epoch + 1 after a send)
        self.ctx.combine(y.element_size(), y.dtype == torch.bfloat16, _ptr(y), _ptr(rw), _ptr(handle.recv_src_rank),
                         _ptr(handle.recv_src_token), _ptr(handle.recv_src_slot), rows, _ptr(handle.is_token_in_rank),
                         _ptr(handle.topk_idx), _ptr(handle.topk_weights), T, handle.cache.selfmap, _ptr(out),
                         _ptr(out_w), expert_major, epoch, sp)
        return out, out_w

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass
        for h in (self._err[0], *(getattr(self, a, (0, 0))[0]
                                  for a in ("_counts_mapped", "_bad_info", "_counts_ready", "_deferred", "_summary"))):
            try:
                self.mod.host_free(h)
            except Exception:
                pass
        super().close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class CudaPull(_CudaProtocol):
    """Mega MoE style: sources publish, receivers pull with TMA bulk copies."""

    name = "pull"


class CudaPush(_CudaProtocol):
    """DeepEP style: senders store rows into the receivers' pools."""

    name = "push"
