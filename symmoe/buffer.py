"""symmoe.Buffer: DeepEP-shaped dispatch/combine over any backend."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import backends, fp8, protocol, validate
from .config import Config, check_world_size, diff, load
from .errors import CapacityError, ConfigMismatch, InputError
from .event import EventOverlap
from .handle import DispatchHandle
from .layout import DTYPES
from .low_latency import LowLatencyHandle, LowLatencyLayout
from . import low_latency as lowlat


def _resolve(config: Config | str | os.PathLike | None) -> Config:
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    return load(config)


class Buffer:
    """One symmetric buffer and the protocol that moves rows through it.

    ``Buffer(group, config)`` is collective over ``group`` (None: the default group, or a
    single process when torch.distributed is not initialised)."""

    def __init__(self, group: dist.ProcessGroup | None = None, config: Config | str | os.PathLike | None = None):
        self.config = cfg = _resolve(config)
        self.group = group
        self._closed = False
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        check_world_size(cfg, self.world_size)
        self._check_same_config()
        self.layout = cfg.layout(self.world_size)
        self.dtype = DTYPES[cfg.buffer.dtype]
        self.memory = backends.create(cfg, group, self.layout.total_bytes)
        # (sizes, memory, engine) of the low-latency mode, made by its first call; sizes is
        # (T_max, hidden, num_experts, topk)
        self._ll: Any = None
        try:
            self._protocol = protocol.make(self.memory, self.layout, cfg, id(self))
        except BaseException:
            self.memory.close()
            raise

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, group: dist.ProcessGroup | None = None) -> "Buffer":
        return cls(group, load(path))

    def _check_same_config(self) -> None:
        if self.world_size == 1:
            return
        mine = (self.config.digest(), self.config.to_dict())
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, mine, group=self.group)
        differ = {r: diff(mine[1], d) for r, (h, d) in enumerate(every) if h != mine[0]}
        if differ:
            r, keys = next(iter(differ.items()))
            raise ConfigMismatch(
                f"rank {self.rank}: ranks started with different configs (digests "
                f"{sorted({h for h, _ in every})}); rank {r} differs from rank {self.rank} in: {', '.join(keys)}")

    # -- properties --------------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.layout.num_experts

    @property
    def device(self) -> torch.device:
        return self.memory.device

    @property
    def protocol(self) -> str:
        return self._protocol.name

    # -- API -------------------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self._closed:
            raise InputError(f"{call}: this Buffer is closed (Buffer.close() or the end of its `with` block); "
                             "create a new Buffer")

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int | None = None):
        """(num_tokens_per_rank, num_tokens_per_rdma_rank=None, num_tokens_per_expert, is_token_in_rank, event)."""
        self._check_open("get_dispatch_layout")
        if num_experts is not None and num_experts != self.num_experts:
            raise InputError(f"num_experts={num_experts}; this Buffer was sized for {self.num_experts}")
        validate.check_topk_idx(topk_idx, self.layout, self.device)
        lay = self._protocol.get_dispatch_layout(topk_idx)
        return (lay.num_tokens_per_rank, None, lay.num_tokens_per_expert, lay.is_token_in_rank,
                EventOverlap.record(self.device))

    def dispatch(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None, *, handle: DispatchHandle | None = None,
                 output_layout: str | None = None, expert_alignment: int | None = None,
                 num_worst_tokens: int = 0, previous_event: EventOverlap | None = None, record_event: bool = True,
                 scale_layout: str = "row"):
        """Send each token to the ranks holding its experts.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, event)`` with the meaning ``symmoe.reference`` defines for ``output_layout``
        ('rank' or 'expert'; default from ``buffer.output_layout``).

        ``num_worst_tokens`` > 0 (DeepEP's name): the three tensors have that many rows, the
        received ones first, then rows with x 0, expert ids -1 and weights 0
        (``reference.pad_recv``); the GPU protocols return their worst-case outputs as they
        are, with no copy. ``num_recv_tokens_per_expert_list`` is then an int32 tensor on the
        outputs' device instead of a list, and the handle covers all N rows (its sources are
        -1 past the received rows): combine takes N rows and ignores those. Every rank raises
        CapacityError when some rank receives more. A cached dispatch with such a handle
        returns worst-case-sized outputs too.

        ``handle=`` (a cached dispatch, instead of ``topk_idx``/``topk_weights``): x moves
        along the routing of the dispatch that returned the handle, into the same rows, and
        the same handle comes back. Every rank passes its handle of that same dispatch. The
        GPU protocols skip the routing and never wait on the host (DeepEP's cached dispatch,
        e.g. the backward of combine).

        ``record_event=False``: the returned ``event`` holds no CUDA event (DeepEP's
        ``async_finish=False``). Every call runs on the current stream, so later work there
        is ordered after it anyway; recording one costs about 30 µs of host time.

        FP8 ``x = (x_e4m3 [T, H], scales)`` (``symmoe.fp8``; float32 scales [T, H/128] or UE8M0
        packed four to an int32 [T, H/512]; buffer.dtype bfloat16): the bytes of both move
        unchanged, in either layout, and ``recv_x`` is the pair ``(recv_x_e4m3, recv_scales)``,
        the scales row-major or, with ``scale_layout="mn_major"``, in DeepGEMM's TMA-aligned
        MN-major layout. Each token's e4m3 and scale bytes are packed into one row of this rank's
        input region first (what ``input_view`` holds is overwritten), and rows of only
        ``Fp8Format.row_bytes(H)`` = H + scale bytes rounded up to 16 move (7392 bytes at
        H = 7168 with float32 scales, against 14336 for bfloat16). Every rank of one dispatch must
        pass the same kind of x, all FP8 (with the same scale format) or all ``buffer.dtype``:
        the row size is not exchanged, and ranks that differ read each other's rows wrongly.
        Combine takes ``buffer.dtype`` rows."""
        self._check_open("dispatch")
        self._refuse_capture("dispatch")
        validate.check_num_worst_tokens(num_worst_tokens)
        fp8_format = data = scales = None
        x_dtype, cols = self.dtype, 0
        if fp8.is_fp8(x):
            data, scales, fp8_format = fp8.check(x, self.layout.hidden, self.dtype, self.device, scale_layout)
            x_dtype, cols = torch.uint8, fp8_format.row_bytes(self.layout.hidden)
            x = self._protocol.input_view(data.shape[0], x_dtype, cols)  # validated below, packed after
        else:
            fp8.check_scale_layout(scale_layout)
        if handle is not None:
            validate.check_cached_dispatch(x, handle, topk_idx, topk_weights, self.layout, x_dtype, self.device,
                                           output_layout, expert_alignment, id(self), cols)
            if previous_event is not None:
                previous_event.current_stream_wait()
            split = self._fp8_rows(fp8_format, data, scales, x, scale_layout,
                                   max(num_worst_tokens, handle.num_worst_tokens))
            recv = self._protocol.dispatch_cached(x, handle, num_worst_tokens, split)
        else:
            output_layout = output_layout or self.config.buffer.output_layout
            alignment = self.config.buffer.expert_alignment if expert_alignment is None else expert_alignment
            validate.check_dispatch(x, topk_idx, topk_weights, self.layout, x_dtype, self.device,
                                    output_layout, alignment, values=not self._protocol.checks_topk_values, cols=cols)
            if previous_event is not None:
                previous_event.current_stream_wait()
            split = self._fp8_rows(fp8_format, data, scales, x, scale_layout, num_worst_tokens)
            recv, handle = self._protocol.dispatch(x, topk_idx, topk_weights, output_layout, alignment,
                                                   num_worst_tokens, split)
        per_expert = recv.num_recv_tokens_per_expert
        if num_worst_tokens or handle.num_worst_tokens:
            if not per_expert.is_cuda and recv.topk_idx.is_cuda:  # else already there: no host wait counted it
                per_expert = per_expert.to(recv.topk_idx.device)
        else:
            per_expert = per_expert.tolist()
        recv_x = recv.x if fp8_format is None or split else fp8.unpack(recv.x, self.layout.hidden, fp8_format,
                                                                        scale_layout)
        return recv_x, recv.topk_idx, recv.topk_weights, per_expert, handle, self._event(record_event)

    def _fp8_rows(self, fp8_format: fp8.Fp8Format | None, data: torch.Tensor | None, scales: torch.Tensor | None,
                  x: torch.Tensor, scale_layout: str, worst: int) -> fp8.Fp8Rows | None:
        """An FP8 dispatch's rows for a protocol that packs and splits them itself (row-major
        scales; its push reads them, its unpack writes them split), else None: an FP8 dispatch's
        rows are then packed here into ``x`` (fp8.pack) and split after (fp8.unpack)."""
        if fp8_format is None:
            return None
        if scale_layout == "row" and self._protocol.fp8_split(worst):
            return fp8.Fp8Rows(fp8_format, data, scales)
        fp8.pack(data, scales, x)
        return None

    def grouped_layout(self, handle: DispatchHandle, psum: bool = False) -> torch.Tensor:
        """DeepGEMM's grouped layout of an expert-major dispatch's rows, for
        ``deep_gemm.m_grouped_fp8_gemm_nt_contiguous`` (``reference.grouped_layout``): int32
        [rows], each row's local expert, -1 on padding; or ``psum=True``: int32 [local experts],
        where each expert's real rows end. On the outputs' device, with no host wait."""
        self._check_open("grouped_layout")
        validate.check_grouped_layout(handle, id(self))
        return fp8.grouped_layout(handle.expert_offsets, handle.recv_src_rank, psum)

    def handle_keeps_routing(self, output_layout: str) -> bool:
        """True when the handles of this Buffer's dispatches in ``output_layout`` keep their own
        copy of the routing: the caller may then change ``topk_idx``/``topk_weights`` between
        dispatch and its combine or cached dispatch. False: keep them unchanged until then."""
        return self._protocol.handle_keeps_routing(output_layout)

    def input_view(self, num_tokens: int) -> torch.Tensor:
        """x [num_tokens, hidden] inside this rank's symmetric buffer. Dispatching it publishes
        nothing: pull's peers read the rows where they lie (the Mega MoE way: the layer before
        writes its output here), and no protocol copies it first. Its contents belong to the
        caller until the next dispatch, which may read them until its queued work ends: write
        the next x on the same stream (or after ``synchronize()``)."""
        self._check_open("input_view")
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool):
            raise InputError(f"input_view({num_tokens!r}): num_tokens must be an int, got {type(num_tokens).__name__}")
        if not 0 <= num_tokens <= self.layout.max_tokens:
            raise CapacityError(f"input_view({num_tokens}): the input region holds 0 to "
                                f"max_tokens_per_rank={self.layout.max_tokens} tokens")
        return self._protocol.input_view(num_tokens, self.dtype)

    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None, *,
                previous_event: EventOverlap | None = None, record_event: bool = True):
        """Bring expert outputs back to the tokens' ranks and reduce them.

        Returns ``(combined_x, combined_topk_weights, event)`` (``record_event`` as in dispatch)."""
        self._check_open("combine")
        self._refuse_capture("combine")
        validate.check_combine(x, handle, topk_weights, self.layout, self.dtype, self.device, id(self))
        if previous_event is not None:
            previous_event.current_stream_wait()
        out, out_w = self._protocol.combine(x, handle, topk_weights)
        return out, out_w, self._event(record_event)

    def _refuse_capture(self, api: str) -> None:
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InputError(f"Buffer.{api} inside CUDA graph capture: the normal mode's barrier epochs are counted "
                             "on the host, so a replayed graph would repeat them and its waits would pass on stale "
                             "flags. Capture low_latency_dispatch / low_latency_combine instead (docs/low_latency.md)")

    def _event(self, record: bool) -> EventOverlap:
        return EventOverlap.record(self.device) if record else EventOverlap(None)

    def synchronize(self) -> None:
        """Wait for this rank's queued calls; raise StallError naming the stage if a device
        wait expired (combine returns before its waits finish, so a stall surfaces here or
        at the next call)."""
        self._check_open("synchronize")
        self._protocol.check(synchronize=True)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the symmetric memory; later calls raise InputError. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._close_low_latency()
        self._protocol.close()
        self.memory.close()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low-latency mode (DeepEP V1's form; docs/low_latency.md) ------------------------------
    def _low_latency(self, T_max: int, hidden: int, num_experts: int, topk: int):
        key = (T_max, hidden, num_experts, topk)
        if self._ll is not None and self._ll[0] == key:  # every call: no layout object made
            return self._ll[2]
        lay = LowLatencyLayout(T_max, hidden, num_experts, self.world_size, topk)
        # First call, or new sizes: a collective allocation (every rank makes the same call).
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise InputError(f"low_latency_dispatch: the first call with these sizes (T_max={T_max}, hidden={hidden}, "
                             f"num_experts={num_experts}, topk={topk}) allocates the symmetric buffer, which cannot "
                             "happen inside CUDA graph capture; make one eager call before capturing")
        self._close_low_latency()
        from .protocol.low_latency import make_engine
        mem = backends.create(self.config, self.group, lay.total_bytes)
        try:
            engine = make_engine(mem, lay, self.config)
        except BaseException:
            mem.close()
            raise
        self._ll = (key, mem, engine)
        return engine

    def _close_low_latency(self) -> None:
        if self._ll is not None:
            _, mem, engine = self._ll
            self._ll = None
            engine.close()
            mem.close()

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, use_fp8: bool = False, round_scale: bool = False,
                             use_ue8m0: bool = False, async_finish: bool = False, return_recv_hook: bool = False
                             ) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], torch.Tensor, LowLatencyHandle,
                                        EventOverlap, Callable[[], None] | None]:
        """Masked expert-major dispatch with no host wait (DeepEP V1's ``low_latency_dispatch``).

        Returns ``(recv_x [L, W * T_max, H] bfloat16, recv_count [L] int32, handle, event, hook)``:
        ``recv_x[j]`` holds local expert ``j``'s rows, source rank 0's first, each source's in its
        token order; only the first ``recv_count[j]`` rows are defined (DeepGEMM's masked_m).
        ``return_recv_hook=True``: the call only sends; ``hook()`` receives (a second kernel), and
        recv_x/recv_count are defined after it; no SM waits in between. Collective; every rank
        passes the same ``num_max_dispatch_tokens_per_rank`` and ``num_experts``. The first call
        (and one with new sizes) allocates this mode's symmetric buffer, so make it eagerly before
        capturing a CUDA graph; later calls allocate only their outputs and are capturable.

        ``use_fp8=True``: x (bfloat16) is cast to e4m3 per token and 128 channels
        (``symmoe.fp8.quantize``: scale = amax / 448, ``round_scale``: rounded up to a power of
        two) and only the e4m3 bytes and scales move; ``recv_x`` is then DeepEP's ``(data e4m3
        [L, W * T_max, H], scales)`` with column-major float32 scales ``[L, W * T_max, H / 128]``
        or, with ``use_ue8m0`` (needs ``round_scale``), UE8M0 exponents packed four to an int32
        ``[L, W * T_max, ceil(H / 512)]``. ``data`` is a view whose rows lie 2H bytes apart."""
        self._check_open("low_latency_dispatch")
        lowlat.check_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, self.world_size, self.device)
        lowlat.check_fp8(x.shape[1], use_fp8, round_scale, use_ue8m0)
        engine = self._low_latency(num_max_dispatch_tokens_per_rank, x.shape[1], num_experts, topk_idx.shape[1])
        if not use_fp8:
            recv_x, count, handle, hook = engine.dispatch(x, topk_idx, return_recv_hook)
            return recv_x, count, handle, self._event(async_finish), hook
        rows, count, handle, hook = engine.dispatch(engine.fp8_rows(x, round_scale), topk_idx, return_recv_hook,
                                                    lowlat.fp8_row_bytes(x.shape[1]))
        recv_data, recv_scales, finish = lowlat.fp8_outputs(rows, use_ue8m0)
        if hook is None:
            finish()
        else:
            receive = hook

            def hook() -> None:
                receive()
                finish()
        return (recv_data, recv_scales), count, handle, self._event(async_finish), hook

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                            handle: LowLatencyHandle, zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, EventOverlap, Callable[[], None] | None]:
        """Bring the experts' rows back and reduce them with the weights (DeepEP V1's
        ``low_latency_combine``): ``combined[t] = sum_k w[t, k] * x[row(t, k)]`` in fp32 in
        ascending k, cast once to bfloat16. ``x`` is shaped like recv_x; ``topk_idx`` and
        ``topk_weights`` are the dispatch's. Returns ``(combined_x [T, H], event, hook)``;
        ``out=`` receives the result in place."""
        self._check_open("low_latency_combine")
        if zero_copy:
            from .compat._common import UnsupportedArgument
            raise UnsupportedArgument("low_latency_combine", "zero_copy", True,
                                      "symmoe has no get_next_low_latency_combine_buffer; pass zero_copy=False "
                                      "(the send kernel reads x where it lies)")
        engine = self._ll[2] if self._ll is not None else None
        lowlat.check_combine(x, topk_idx, topk_weights, handle, out, self.world_size, id(engine), self.device)
        assert engine is not None
        result, hook = engine.combine(x, topk_idx, topk_weights, handle, out, return_recv_hook)
        return result, self._event(async_finish), hook

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Collective: zero the low-latency flags and sequence numbers (needed only after a
        StallError or an abandoned hook; the mode never needs cleaning between calls). Handles of
        earlier dispatches stay valid for nothing."""
        self._check_open("clean_low_latency_buffer")
        if self._ll is not None:
            self._ll[2].clean()

    def check_low_latency(self, synchronize: bool = False) -> None:
        """Raise StallError if a low-latency receive timed out (rank and stage named), or
        InputError for expert ids out of range in an earlier dispatch (checked on the device, so
        reported by the next call or here)."""
        if self._ll is not None:
            self._ll[2].check(synchronize)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int, num_topk: int = 8) -> int:
        """Bytes of symmetric memory per rank that the low-latency mode allocates."""
        return lowlat.size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts, num_topk)

    @staticmethod
    def size_hint(config: Config, world_size: int) -> int:
        """Bytes of symmetric memory each rank needs for ``config`` at ``world_size``."""
        check_world_size(config, world_size)
        return config.layout(world_size).total_bytes
