"""push over NVSHMEM: the DeepEP V1 normal-mode flow on the NVSHMEM device API.

Kernels: ``csrc/nvshmem/`` (``device.cuh`` waits and signals, ``notify.cuh`` planning,
``dispatch.cuh``, ``combine.cuh``; bindings in ``nvshmem_ext.cu``: module ``symmoe_nvshmem``, built by
``symmoe.build`` with relocatable device code and a device link against
``libnvshmem_device.a``). Every table is computed on the GPU, as DeepEP's layout and notify
kernels do; the host launches two kernels and waits once, for the counts.

dispatch
  1-2. ``plan_kernel``, one launch: the routing of the CUDA protocols' route_kernel
     (``route_ticketed`` in ``csrc/kernels/route.cuh``: each block a chunk of tokens, walked
     once; routing counts, is_token_in_rank, int32 ids, expert ids checked, each pair's
     position in its column after the earlier chunks'), then the send list (destination d's
     rows from d * T on, by token: one row per (token, destination rank) in both layouts);
     the last block puts this rank's counts row into every peer
     with put-with-signal on ``ready`` and waits for theirs (stage ``dispatch.counts``), then
     leaves the matrix in a device snapshot (this dispatch's own) and in host-mapped memory.
  3. ``dispatch_kernel``, launched right behind into outputs sized for the worst case (by
     programmatic dependent launch: its blocks are scheduled while the plan kernel runs); every
     block derives the offsets from the snapshot; C channels, each one sender block (warp
     puts of rows + metadata into its ring in each receiver's pool, ``tail[c][me]`` signalled
     per chunk, and before reusing a slot a wait on the receiver's head in ``ack[c][d]``)
     and one receiver block (copies the rows a rank keeps straight from x, then waits on
     ``tail[c][s]`` and streams delivered rows into the outputs; expert-major, one copy per
     slot that names a local expert, at the row its sender computed) (stage ``dispatch.data``).
     Bad ids anywhere or a receiver over capacity: no block moves anything.
     Alone (one PE), symmoe_cuda's ``alone`` kernels instead (``csrc/kernels/alone.cuh``,
     compiled whole, not as the NVSHMEM module's relocatable code): rank-major each routed
     token's row to its output row by the CUDA protocols' bulk-copy mover; expert-major, with
     ``kernel.fan_phases`` on, their phased fan-out, whole rows from x into shared memory, then
     bulk-stored to every slot's row (stages ``bulk copy``, ``dispatch.phase``; they record in
     the ErrorWord and its device mirror as these kernels do).
  4. the host waits for the counts (the one host wait, as DeepEP's normal mode; the data
     kernel runs meanwhile), raises InputError / CapacityError on every rank together, and
     returns views of the first ``rows`` rows.
cached dispatch (``dispatch(x, handle=...)``)
  the routing tables of steps 1-2 are per-dispatch tensors the handle keeps: the device barrier
  ``dispatch.counts`` (pools may still be read by an earlier dispatch), then step 3 with them.
combine
  5. after another combine only: the device barrier ``combine.done`` (peers may still be
     reducing from the slots this combine writes; a dispatch in between orders them already)
  6. ``combine_send_kernel`` (with peers only), one block (channel) per SM held, at most
     ``kernel.num_channels`` (the ``head`` words): block c puts channel c of the received rows
     back into their sources' combine slots ``t * S + slot`` (its own rows stay in y, where
     the dispatch kernel recorded them in the dispatch's ``selfmap``), signals ``head[c][me]``
     at every rank and waits for ``head[c][*]`` here (one polling warp; stage ``combine.data``)
  7. ``combine_reduce_kernel``: the reduction the CUDA protocols use
     (``csrc/common/reduce.cuh``), tokens in the fixed order in fp32

No host wait follows a kernel: a wait that timed out is raised by the next call or by
``check()`` / ``Buffer.synchronize()``, as in the CUDA protocols. All 2C blocks of a kernel
must be resident at once (dispatch receivers and combine senders wait for the peers' senders),
so C is capped by the SMs this process holds (``symmoe/launch_shape.py``'s ``nvshmem_shape``).

Each receiver's pool (W * (T + C) rows: a source sends it each token once at most; fewer with a
smaller ``buffer.recv_capacity``) is cut into W * C rings of ``kernel.ring_rows`` rows (0: the
pool split evenly, ceil(T / C) rows or more, a channel's longest share of a source's rows, so
no ring wraps unless recv_capacity shrank the pool), one per (source, channel), as
DeepEP V1's channel buffers: ``tail[c][s]`` at the receiver counts rows delivered, and
``ack[c][d]`` at the sender counts rows receiver d copied out (the ring's head), signalled only
for shares longer than the ring, the only ones whose sender waits. ``head`` marks a channel
finished for combine (separate words, so a fast peer's combine never overwrites a dispatch
signal still being read).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import build
from ..errors import ConfigError, InputError, StallError
from ..results import DispatchLayout, RecvResult
from ..launch_shape import LaunchShape, fan_phases_mode, gpu_sms, nvshmem_shape
from .base import Protocol, check_combine_slots, stream_handle
from .counts import (SUMMARY_HEAD, Guess, cached_rows, check_summary_head, deferred_error, make_handle,
                     recv_views, summarized_result)
from .outputs import SRC_RANK, SRC_SLOT, SRC_TOKEN


def _src_ptrs(out: dict[str, Any]) -> list[int]:
    """Device addresses of a dispatch's source rank, token and slot columns (outputs.dispatch_outputs)."""
    return [out["block"].ptr(i) for i in (SRC_RANK, SRC_TOKEN, SRC_SLOT)]


# Stage codes, as in csrc/common/layout.cuh (enum Stage).
STAGES = {"dispatch.counts": 1, "dispatch.data": 2, "combine.data": 4, "combine.done": 5, "barrier": 6,
          "bulk copy": 7, "dispatch.phase": 8, "dispatch.route": 9}
_STAGE_NAMES = {v: k for k, v in STAGES.items()}
_ELEM_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
# The plan kernel's routing keeps (8 warps + 1, at the fewest) x (W + E) int32 tables in shared
# memory, the dispatch kernel 2 x E of them (expert-major): the columns fit in 200 KiB and 64 KiB.
MAX_COLUMNS = 4096
# The pointers of the extension's route(), in its order.
_ROUTE_PTRS = ("idx", "w", "scratch", "in_rank", "per_rank", "per_expert", "pub_idx", "pub_w", "pos", "send_ent",
               "counts_snap", "counts_host", "bad_flag", "bad_info", "err", "done", "counts_ready", "summary")


def _include_dirs() -> list[str]:
    return [build.site_include("nvshmem")]


def _lib() -> str:
    return str(build.site_lib_root("nvshmem") / "lib")


SPEC = build.register(build.ExtensionSpec(
    name="symmoe_nvshmem",
    sources=("nvshmem/nvshmem_ext.cu",),
    include_dirs=_include_dirs,
    needs_rdc=True,
    dlink_flags=lambda: [f"-L{_lib()}", "-lnvshmem_device"],
    link_flags=lambda: [f"-L{_lib()}", "-l:libnvshmem_device.a", "-l:libnvshmem_host.so.3",
                        "-Xlinker", f"-rpath,{_lib()}"],
    lib_dists=("nvidia-nvshmem-cu13",),
    description="push kernels on the NVSHMEM device API (nvshmem backend)",
))


def load_extension() -> Any:
    return build.load(SPEC.name)


def raise_if_failed(mem: Any, stage: str) -> None:
    """After a sync: raise StallError if a kernel recorded a timeout in the error word."""
    err = mem.error_word()
    code, peer, epoch, _ = err.tolist()
    if code == 0:
        return
    err.zero_()
    mem.runtime.extension().reset_error()  # the kernels' device mirror of the word
    from ..backends.nvshmem import stall
    raise stall(mem, _STAGE_NAMES.get(int(code), stage), int(peer), int(epoch))


def ring_rows(requested: int, pool_rows: int, world_size: int, channels: int) -> int:
    """Rows of each (source, channel) ring of the receive pool: ``kernel.ring_rows``, or with
    0 the pool split evenly. Every one of the W * C rings must fit in the pool."""
    even = pool_rows // (world_size * channels)
    rows = requested or even
    if rows < 1 or rows > even:
        raise ConfigError(
            "kernel.ring_rows", requested,
            f"{world_size} sources x {channels} channels of rings of {rows} rows need "
            f"{world_size * channels * rows} rows, the receive pool holds {pool_rows} (allowed: 1..{even}, or 0 "
            f"for {even}; the pool holds W * (max_tokens_per_rank + num_channels) rows, or buffer.recv_capacity when "
            "that is set and less)")
    return rows


class NvshmemPush(Protocol):
    name = "push"
    checks_topk_values = True  # the routing kernel checks the expert ids (counts.bad_input_error)

    def handle_keeps_routing(self, output_layout: str) -> bool:
        # The cached dispatch reads the routing kernel's copy (handle.cache); the rank-major
        # combine reads only the handle's is_token_in_rank, the expert-major one the caller's
        # topk_idx and topk_weights.
        return output_layout == "rank"

    def __init__(self, mem, layout, config, buffer_id):
        super().__init__(mem, layout, config, buffer_id)
        W, E = layout.world_size, layout.num_experts
        if W + E > MAX_COLUMNS:
            raise InputError(f"world_size + num_experts = {W + E}; the nvshmem routing keeps per-column tables in "
                             f"shared memory and handles at most {MAX_COLUMNS}")
        check_combine_slots(layout, "nvshmem protocol")
        self.ext = mem.runtime.extension()
        self.args = layout.kernel_args()
        self._row_args: dict[int, list[int]] = {0: self.args}  # by row bytes (row_args)
        self.offs = layout.offsets()
        mem.use_layout(self.args, self.offs["barrier"])
        k = config.kernel
        # The blocks of every kernel (launch_shape.nvshmem_shape): the dispatch's channels (a
        # sender and a receiver block each) and the combine's send blocks all resident at once
        # on the SMs this process holds, or the ranks deadlock.
        gpu = gpu_sms(mem.device)
        self.shape: LaunchShape = nvshmem_shape(k, gpu, layout.num_channels)
        self.ring_rows = ring_rows(k.ring_rows, layout.pool_rows, W, self.shape.channels)
        # Alone, the dispatch runs symmoe_cuda's alone kernels (kernels/alone.cuh): the mode of
        # the expert-major phased fan-out and the grid counter grid-wide phases meet on. The
        # module is loaded (built) only when it will run.
        self.fan_phases = fan_phases_mode(config, W, gpu) if W == 1 else 0
        self._alone_done = torch.zeros(1, dtype=torch.int32, device=mem.device)
        self._alone_mod: Any = None
        self.timeout_ns = int(k.timeout_s * 1e9)
        self.err = mem.error_word()
        self.me, self.W = mem.rank, W
        self.device = dev = mem.device
        self._dispatches = 0
        self._combines = 0
        self._last_op = ""  # "dispatch" | "combine": a combine right after a combine needs a barrier
        # zeroed: the plan's chunk marks start below every epoch, its ticket at 0
        self._route_scratch = torch.zeros(self.ext.route_scratch_ints(self.args, self.shape.route), dtype=torch.int32,
                                          device=dev)
        self._done = torch.zeros(1, dtype=torch.int32, device=dev)  # grid completion counter of the routing
        self._bad_flag = torch.zeros(1, dtype=torch.int32, device=dev)
        # Pinned host memory is device-accessible at the same address (unified addressing):
        # the plan kernel writes the matrix and the bad-id record straight into it.
        self._bad_info = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        self._counts_host = torch.zeros((W, 1 + W + E), dtype=torch.int32, pin_memory=True)
        self._counts_ready = torch.zeros(1, dtype=torch.int64, pin_memory=True)  # epoch once the matrix is in
        check_summary_head("symmoe_nvshmem", self.ext.SUMMARY_HEAD)
        # Beside the matrix, what the host reads of it after its wait (counts.summary_of).
        self._summary = torch.zeros(SUMMARY_HEAD + layout.local_experts, dtype=torch.int32, pin_memory=True)
        # numpy views of the two, made once: a dispatch reads them right after its host wait
        self._counts_np, self._summary_np = self._counts_host.numpy(), self._summary.numpy()
        # The wait reads the error word as raise_if_failed does after it; the deferred record
        # is _raise_if_failed's at the call's start.
        self._counts_wait = self.ext.CountsWait(self._counts_ready.data_ptr(), self.err.data_ptr(), 0,
                                                self._summary.data_ptr(), SUMMARY_HEAD, self._counts_host.data_ptr(),
                                                self._counts_host.numel(), layout.local_experts, layout.recv_rows)
        self._filled = self.ext.COUNTS_FILLED
        # DeferredError of a dispatch without the host wait (num_worst_tokens; kernels/tail.cuh)
        self._deferred = torch.zeros(8, dtype=torch.int64, pin_memory=True)
        # Peers reachable by load/store get plain stores; the others puts, which read their
        # source from symmetric memory (IBGDA needs registered memory).
        from ..backends.nvshmem import puts_forced
        forced = puts_forced()
        self.direct = int(not forced)
        self.stage_inputs = (not mem.all_peers_mapped) or forced
        self._stage_x = self._stage_w = None
        if any(mem.all_gather(self.stage_inputs)):  # a collective allocation: on every rank or none
            # The combine's input (up to recv_rows expert-major rows, more than the pool holds)
            # is staged in symmetric memory of its own.
            R, row = layout.recv_rows, layout.hidden * layout.elem_size
            stage = mem.symmetric_bytes(layout.stage_bytes)
            self._stage_x = stage[:R * row].view(R, row)
            self._stage_w = stage[R * row:].view(torch.float32).view(R, layout.topk)

    # -- helpers ---------------------------------------------------------------------------
    def row_args(self, x: torch.Tensor) -> list[int]:
        """The layout for a dispatch of x: its rows' bytes where they are narrower than the
        layout's (an FP8 dispatch's), which the dispatch and tail kernels move and stride by."""
        rb = self.row_bytes(x)
        args = self._row_args.get(rb)
        if args is None:
            args = self._row_args[rb] = self.layout.kernel_args(rb)
        return args

    def _raise_if_failed(self, stage: str) -> None:
        """StallError for an expired wait; InputError / CapacityError (once) left by an
        earlier num_worst_tokens dispatch that did not wait (the buffer stays usable)."""
        if int(self._deferred[0]):
            error = deferred_error(self.layout, self._deferred.tolist(), self.me, self.ext.DEFERRED, self._bad_info.tolist)
            self._deferred[0] = 0
            raise error
        raise_if_failed(self.mem, stage)

    def host_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The last exact-size dispatch's counts matrix and its summary as the plan kernel left
        them in pinned memory (views: the next dispatch rewrites them)."""
        return self._counts_np, self._summary_np

    def _route(self, topk_idx: torch.Tensor, plan: bool, epoch: int, ptrs: dict[str, int],
               sp: int, alignment: int = 1) -> None:
        """Routing kernels (``plan``: the whole dispatch planning); ``ptrs`` by name, absent = null;
        ``alignment``: the expert-major group padding the host summary's rows count."""
        ptrs = {"idx": topk_idx.data_ptr(), "scratch": self._route_scratch.data_ptr(), "err": self.err.data_ptr(),
                "done": self._done.data_ptr(), **ptrs}
        self.ext.route(self.mem.local.data_ptr(), self.args, self.me, topk_idx.dtype == torch.int64, topk_idx.shape[0],
                       plan, epoch, self.timeout_ns, [ptrs.get(n, 0) for n in _ROUTE_PTRS],
                       sp, alignment, self.shape.route)

    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        self._raise_if_failed("dispatch")
        W, E, T = self.W, self.layout.num_experts, topk_idx.shape[0]
        per_rank = torch.empty(W, dtype=torch.int32, device=self.device)
        per_expert = torch.empty(E, dtype=torch.int32, device=self.device)
        in_rank = torch.empty((T, W), dtype=torch.bool, device=self.device)
        self._route(topk_idx.contiguous(), False, 0,
                    {"in_rank": in_rank.data_ptr(), "per_rank": per_rank.data_ptr(), "per_expert": per_expert.data_ptr()},
                    stream_handle(self.device))
        return DispatchLayout(per_rank, per_expert, in_rank)

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, output_layout, alignment, worst=0, split=None):
        self._raise_if_failed("dispatch")  # a wait of an earlier call expired
        lay, me, W = self.layout, self.me, self.W
        K = lay.topk
        dev = self.device
        stream = torch.cuda.current_stream(dev)
        T = x.shape[0]
        em = output_layout == "expert"
        topk_idx = topk_idx.contiguous()
        topk_weights = topk_weights.float().contiguous()
        # Outputs sized for the worst case, allocated before the launches so they follow each
        # other closely; the host's wait for the counts overlaps the data kernel.
        cap = self._capacity(output_layout)  # what the kernel may write; `worst` rows are returned
        # The routing's outputs, which only this rank reads: int32 pieces of the outputs' one
        # allocation (the handle keeps them for a cached dispatch); the weights' piece as float32.
        # selfmap: the output row of each (token, slot) this rank keeps (combine reduces it in place).
        sizes = (max(1, T * K), max(1, T * K), max(1, T * (W + K)), max(1, T * W), W * (1 + W + lay.num_experts),
                 max(1, T * lay.combine_slots))
        out = self._outputs(max(cap, worst), output_layout, x.dtype, *sizes, cols=x.shape[1], in_rank_tokens=T)
        pub_idx, pub_w, pos, send_ent, counts, selfmap = (out["block"].piece(3 + i, n) for i, n in enumerate(sizes))
        in_rank = out["in_rank"]
        plan = {"pub_idx": pub_idx, "pub_w": pub_w.view(torch.float32), "pos": pos, "send_ent": send_ent,
                "counts": counts.view(W, 1 + W + lay.num_experts), "selfmap": selfmap}
        src = self._source(x)
        self._dispatches += 1
        self._last_op = "dispatch"
        epoch = self._dispatches
        # num_worst_tokens: no host wait, so no host copy of the counts either.
        host = {} if worst else {"counts_host": self._counts_host.data_ptr(),
                                 "counts_ready": self._counts_ready.data_ptr(), "summary": self._summary.data_ptr()}
        per_expert = self._per_expert() if worst else None
        self._route(topk_idx, True, epoch, {
            "w": topk_weights.data_ptr(), "in_rank": in_rank.data_ptr(), "pub_idx": plan["pub_idx"].data_ptr(),
            "pub_w": plan["pub_w"].data_ptr(), "pos": plan["pos"].data_ptr(), "send_ent": plan["send_ent"].data_ptr(),
            "counts_snap": plan["counts"].data_ptr(), **host,
            "bad_flag": self._bad_flag.data_ptr(), "bad_info": self._bad_info.data_ptr()}, stream.cuda_stream,
            alignment)
        self._send(src, plan, out, cap, em, alignment, epoch, plan["selfmap"])
        if worst:  # DeepEP V1's num_worst_tokens: the device finishes what the host would read
            recv = self._tail(out, plan["counts"], worst, em, alignment, self.row_args(x), per_expert)
            return recv, make_handle(output_layout, topk_idx, topk_weights, in_rank, plan["counts"], out, recv,
                                     self.buffer_id, alignment, plan, worst)

        # The one host wait; the data kernel runs meanwhile. What needs no counts is done before.
        topk_idx = topk_idx.long()  # the handle's (a launch for int32 ids)
        guess = Guess.of(lay, output_layout, alignment, out, topk_idx, topk_weights, in_rank, self.buffer_id, plan)
        if self._wait_counts(epoch, guess):
            return guess.recv, guess.handle  # the wait found nothing to raise
        raise_if_failed(self.mem, "dispatch.counts")
        return summarized_result(lay, self._summary_np, self._counts_np, me, output_layout, alignment,
                                 self._bad_info.tolist, out, topk_idx, topk_weights, in_rank, self.buffer_id, plan)

    def _tail(self, out: dict[str, Any], counts: torch.Tensor, worst: int, em: bool,
              alignment: int, args: list[int], per_expert: torch.Tensor | None = None) -> RecvResult:
        """The ``worst`` rows of a dispatch that does not wait on the host: kernels/tail.cuh
        after the dispatch kernel fills the rows past the received ones (rows of ``args``, the
        dispatch's ``row_args``) and counts the rows per local expert (into ``per_expert``);
        errors come back at a later call (_raise_if_failed)."""
        if per_expert is None:
            per_expert = self._per_expert()
        self.ext.tail(args, self.me, int(em), alignment, worst, self._dispatches,
                      [counts.data_ptr(), *(out[k].data_ptr() for k in ("x", "idx", "w")), *_src_ptrs(out),
                       per_expert.data_ptr(), self._deferred.data_ptr()],
                      self.shape.tail, stream_handle(self.device))
        return recv_views(out, worst, per_expert)  # the tail's kernel filled what the host would

    def _source(self, x: torch.Tensor) -> torch.Tensor:
        """Where the puts read x: the input region when some peer is reached by puts."""
        if self.stage_inputs and x.shape[0] and not self._in_input_region(x):
            return self.input_view(x.shape[0], x.dtype, x.shape[1]).copy_(x)
        return x

    def _alone(self) -> Any:
        """symmoe_cuda, whose alone kernels the dispatch runs at one PE (built on first use)."""
        if self._alone_mod is None:
            self._alone_mod = build.load("symmoe_cuda")
        return self._alone_mod

    @staticmethod
    def _alone_ptrs(src: torch.Tensor, plan: dict[str, torch.Tensor], o: dict[str, Any], em: bool,
                    selfmap: torch.Tensor | None) -> list[int]:
        """The 13 pointers of symmoe_cuda's ``alone``."""
        return [src.data_ptr(), plan["pub_idx"].data_ptr(), plan["pub_w"].data_ptr(), plan["pos"].data_ptr(),
                plan["counts"].data_ptr(), o["x"].data_ptr(), o["idx"].data_ptr(), o["w"].data_ptr(),
                *_src_ptrs(o), o["expert_offsets"].data_ptr() if em else 0,
                selfmap.data_ptr() if selfmap is not None else 0]

    def _send(self, src: torch.Tensor, plan: dict[str, torch.Tensor], o: dict[str, Any], cap: int, em: bool,
              alignment: int, epoch: int, selfmap: torch.Tensor | None) -> None:
        """The dispatch kernel from the routing tables ``plan`` into ``o`` (``cap`` rows),
        recording the rows this rank keeps in ``selfmap`` (None: the same routing recorded them).
        Alone, symmoe_cuda's alone kernels instead (expert-major with kernel.fan_phases on,
        where a row fits in shared memory). Rows of ``src``'s width (``row_args``)."""
        stream = stream_handle(self.device)
        args = self.row_args(src)
        if self.W == 1 and (not em or self.fan_phases):
            if self._alone().alone(args, em, alignment, cap, epoch, self.timeout_ns,
                                   self._alone_ptrs(src, plan, o, em, selfmap), self.fan_phases, self.shape.alone,
                                   self.shape.sms, self._alone_done.data_ptr(), self.ext.error_mirror(),
                                   self.err.data_ptr(), stream):
                return
        self.ext.dispatch(self.mem.local.data_ptr(), args, self.me, self.shape.channels, self.ring_rows, int(em),
                          self.direct, alignment, cap, epoch, self.timeout_ns,
                          [src.data_ptr(), plan["pub_idx"].data_ptr(), plan["pub_w"].data_ptr(),
                           plan["send_ent"].data_ptr(), plan["pos"].data_ptr(), plan["counts"].data_ptr(),
                           o["x"].data_ptr(), o["idx"].data_ptr(), o["w"].data_ptr(), *_src_ptrs(o),
                           o["expert_offsets"].data_ptr() if em else 0, self.err.data_ptr(),
                           selfmap.data_ptr() if selfmap is not None else 0],
                          stream)

    def dispatch_cached(self, x, handle, worst=0, split=None):
        """The handle's routing tables (send list, positions, counts: this rank's device
        memory, nothing to republish), one barrier (receivers may still be reading their
        pools from an earlier dispatch), then the dispatch kernel; this rank's rows are
        returned. No routing, no host wait."""
        self._raise_if_failed("dispatch")
        # The kernel's capacity must be the same on every rank (each checks every receiver).
        worst = max(worst, handle.num_worst_tokens)
        counted = not handle.counts.is_cuda  # else the dispatch never waited: its counts are on the device
        if counted:
            most, mine, per_expert = cached_rows(self.layout, handle, self.me, worst)
            cap = max(most, 1)
        else:  # the same on every rank, as the handles' N is
            cap = max(1, min(handle.num_recv_rows, self._capacity(handle.output_layout)))
        out = self._outputs(max(cap, worst), handle.output_layout, x.dtype, cols=x.shape[1])
        src = self._source(x)
        if self.W > 1:
            self.mem.barrier_on_stream("dispatch.counts")
        self._dispatches += 1
        self._last_op = "dispatch"
        self._send(src, handle.cache, out, cap, handle.output_layout == "expert", handle.alignment,
                   self._dispatches, None)
        if not counted:
            return self._tail(out, handle.cache["counts"], worst, handle.output_layout == "expert", handle.alignment,
                              self.row_args(x))
        return recv_views(out, mine, per_expert, worst)

    def barrier_on_stream(self) -> None:
        self._raise_if_failed("barrier")
        self.mem.barrier_on_stream("barrier")

    def check(self, synchronize: bool = False) -> None:
        """Raise StallError if a device wait of an earlier call expired."""
        if synchronize:
            torch.cuda.current_stream(self.device).synchronize()
        self._raise_if_failed("barrier")

    # -- combine ---------------------------------------------------------------------------
    def combine(self, y, handle, recv_topk_weights):
        self._raise_if_failed("combine")
        lay, me = self.layout, self.me
        H, K = lay.hidden, lay.topk
        dev = self.device
        T, rows = handle.num_tokens, handle.num_recv_rows
        src, src_w = y, recv_topk_weights
        if src_w is not None:
            src_w = src_w.float().contiguous()
        if self.stage_inputs and rows:
            # A num_worst_tokens handle may cover more rows than recv_rows; past the received
            # ones (at most recv_rows) its sources are -1 and the kernel reads nothing there.
            n = min(rows, lay.recv_rows)
            src = self._stage_x[:n].view(y.dtype)
            src.copy_(y[:n])
            if src_w is not None:
                src_w = self._stage_w[:n]
                src_w.copy_(recv_topk_weights[:n])
        out_x = torch.empty((T, H), dtype=y.dtype, device=dev)
        out_w = torch.empty((T, K), dtype=torch.float32, device=dev) if recv_topk_weights is not None else None
        if self._last_op == "combine" and self.W > 1:
            # Two combines in a row (e.g. a repeated combine on one handle): a peer may still be
            # reducing the previous one from the combine slots this one writes into. Between a
            # dispatch and a combine the counts exchange already orders them.
            self.mem.barrier_on_stream("combine.done")
        self._last_op = "combine"
        self._combines += 1
        ptrs = [src.data_ptr(), src_w.data_ptr() if src_w is not None else 0, handle.recv_src_rank.data_ptr(),
                handle.recv_src_token.data_ptr(), handle.recv_src_slot.data_ptr(), handle.cache["selfmap"].data_ptr(),
                handle.is_token_in_rank.data_ptr(), handle.topk_idx.data_ptr(), handle.topk_weights.data_ptr(),
                out_x.data_ptr(), out_w.data_ptr() if out_w is not None else 0, self.err.data_ptr()]
        self.ext.combine(self.mem.local.data_ptr(), self.args, me, self.shape.combine,
                         int(handle.output_layout == "expert"), self.direct, T, rows, _ELEM_KIND[y.dtype],
                         self.shape.reduce, self._combines, self.timeout_ns, ptrs, stream_handle(dev))
        return out_x, out_w


__all__ = ["NvshmemPush", "STAGES", "SPEC", "load_extension", "raise_if_failed", "StallError"]
