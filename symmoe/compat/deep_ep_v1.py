"""DeepEP V1's ``deep_ep.Buffer`` (normal mode, intranode) on top of ``symmoe.Buffer``.

``import symmoe.compat.deep_ep_v1 as deep_ep`` in place of ``import deep_ep`` and the
model code that calls ``get_dispatch_layout`` -> ``dispatch`` -> ``combine`` (and the
cached ``dispatch(x, handle=...)`` of the backward pass) runs unchanged. Which symmoe
backend it runs on comes from a symmoe config: ``Buffer(..., symmoe_config=...)`` or, with
no change to the code that builds the buffer, ``set_default_config(path)`` once at start-up
(else symmoe's default, ``symmoe.Config()``). The config also sizes the buffer
(``buffer.max_tokens_per_rank``, ``hidden``, ``topk``, ``num_experts``, ``dtype``):
DeepEP's ``num_nvl_bytes`` is only a hint here.

Results follow DeepEP V1's intranode kernels (bitwise equal to them in every cell of the side by
side, ``benchmarks/deepep_h100``): rows ordered by (source rank, source token), ``recv_topk_idx`` local to the
receiver with -1 elsewhere and weight 0 there, combine summing the ranks' rows (and
``topk_weights``) in ascending rank order in fp32 with one cast -- which is also symmoe's
rank-major rule, so no conversion is needed beyond rounding the per-expert counts up to
``expert_alignment``.

The low-latency mode (``low_latency_mode=True``) runs symmoe's own low-latency kernels
(``symmoe.Buffer.low_latency_dispatch``, docs/low_latency.md) with DeepEP's signatures, handle
and outputs; ``num_rdma_bytes`` is then only a hint, as ``num_nvl_bytes`` is.

FP8 ``x = (x_e4m3, x_scales)`` (float32 per-128 scales, or UE8M0 packed four to an int32)
dispatches as in DeepEP: ``recv_x`` is then ``(recv_x_e4m3, recv_x_scales)``, the bytes
unchanged (``symmoe.fp8``; buffer.dtype bfloat16); combine takes bfloat16.

What symmoe cannot honour raises ``UnsupportedArgument``/``UnsupportedCall`` (an FP8 ``x`` to
combine, ``num_rdma_bytes > 0`` without the low-latency mode, ``enable_shrink``, an mpi4py
``comm``, ``bias`` in combine, layout-only dispatch without ``topk_idx``, LogFMT low-latency
combine, zero-copy combine, the mask buffer, internode methods). Pure performance hints are accepted and ignored: ``num_nvl_bytes``, ``config``,
``set_num_sms``, ``allocate_on_comm_stream``, ``num_qps_per_rank``,
``allow_nvlink_for_low_latency_mode``, ``allow_mnnvl``, ``explicitly_destroy``; ``async_finish=False``
(the default) returns an event without a CUDA event, as DeepEP does.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import validate
from ..buffer import Buffer as SymmoeBuffer
from ..config import Config as SymmoeConfig
from ..errors import InputError
from ..handle import DispatchHandle
from ..low_latency import LowLatencyHandle as SymmoeLowLatencyHandle
from ..results import get_dispatch_layout
from ._common import (EventHandle, EventOverlap, UnsupportedArgument, UnsupportedCall, Unavailable, align_up,
                      capture, check_int, check_not_fp8, describe, hidden_from_bytes, reject, resolve,
                      rows_for_combine, set_default_config, topk_idx_t, unsupported, wait)

__all__ = ["Buffer", "Config", "EventOverlap", "EventHandle", "Handle", "topk_idx_t", "set_default_config"]

_NO_LL = "symmoe's low-latency mode has no mask buffer (rank masking) nor zero-copy combine buffer"
_API = "deep_ep.Buffer"


@dataclass
class Config:
    """DeepEP's per-call tuning config (SMs and chunk sizes of its ring buffers). symmoe's
    kernels take their launch shape from the symmoe config instead, so these values are
    accepted and ignored; the size hints map onto symmoe's layout."""

    num_sms: int = 20
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of symmetric memory per rank that symmoe allocates for the default config
        (``set_default_config``) at ``num_ranks`` ranks."""
        cfg = resolve(None)
        hidden_from_bytes("deep_ep.Config.get_nvl_buffer_size_hint", cfg, hidden_bytes)
        return SymmoeBuffer.size_hint(cfg, num_ranks)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0: symmoe's one symmetric buffer covers every peer; DeepEP's RDMA buffer (internode
        and low-latency modes) is not used by this shim."""
        return 0


class Handle(tuple):
    """DeepEP V1's intranode handle, the 6-tuple ``(rank_prefix_matrix,
    channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank,
    send_head)``, carrying the symmoe handle that combine and cached dispatch use.

    ``rank_prefix_matrix`` ([W, W] int32, entry [i][j] = tokens ranks 0..i send to rank j),
    ``recv_src_idx`` ([rows] int32, the source token of each received row) and
    ``is_token_in_rank`` ([T, W] bool, this rank's tokens) hold DeepEP's values. The channel
    and ring-buffer entries describe DeepEP's own kernels; they are placeholders that raise
    if used. ``rank_prefix_matrix`` is computed when first read (indexing, unpacking or the
    property): combine and the cached dispatch never read it, and computing it in every
    dispatch cost launches that DeepEP's own dispatch does not pay."""

    symmoe: DispatchHandle
    num_worst_tokens: int

    def __new__(cls, items: tuple, symmoe_handle: DispatchHandle, num_worst_tokens: int, owner: "Buffer") -> "Handle":
        self = super().__new__(cls, (_PENDING, *items))
        self.symmoe = symmoe_handle
        self.num_worst_tokens = num_worst_tokens
        self._owner = weakref.ref(owner)
        self._prefix: torch.Tensor | None = None
        return self

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(len(self))[i])
        v = tuple.__getitem__(self, i)
        return self.rank_prefix_matrix if v is _PENDING else v

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def rank_prefix_matrix(self) -> torch.Tensor:
        if self._prefix is None:
            owner = self._owner()
            device = owner.symmoe.device if owner is not None else self.symmoe.recv_src_token.device
            W = self.symmoe.is_token_in_rank.shape[1]
            self._prefix = torch.cumsum(self.symmoe.counts[:, 1:1 + W].to(device), 0, dtype=torch.int32)
        return self._prefix

    @property
    def recv_src_idx(self) -> torch.Tensor:
        return self[3]

    @property
    def is_token_in_rank(self) -> torch.Tensor:
        return self[4]


def _internal(name: str) -> Unavailable:
    return Unavailable(f"handle.{name}", "it describes DeepEP's channel/ring-buffer kernels, which symmoe does not "
                       "run; rank_prefix_matrix, recv_src_idx and is_token_in_rank are provided")


class LowLatencyHandle(tuple):
    """DeepEP V1's low-latency handle ``(src_info, layout_range, num_max_dispatch_tokens_per_rank,
    hidden, num_experts)`` with DeepEP's values, carrying symmoe's handle (``.symmoe``)."""

    symmoe: SymmoeLowLatencyHandle

    def __new__(cls, handle: SymmoeLowLatencyHandle) -> "LowLatencyHandle":
        self = super().__new__(cls, handle.as_deep_ep())
        self.symmoe = handle
        return self


_PENDING = object()  # Handle's rank_prefix_matrix before it is first read
_CHANNEL_PREFIX, _RECV_CHANNEL_PREFIX, _SEND_HEAD = (
    _internal(n) for n in ("channel_prefix_matrix", "recv_channel_prefix_matrix", "send_head"))


class Buffer:
    """``deep_ep.Buffer`` for normal-mode intranode dispatch/combine, run by ``symmoe.Buffer``.

    Extra keyword: ``symmoe_config`` -- a ``symmoe.Config`` or a YAML path (default: what
    ``set_default_config`` set, else ``symmoe.Config()``). The underlying buffer is ``.symmoe``."""

    num_sms: int = 20  # DeepEP's class-wide SM count; symmoe uses kernel.num_sms of its config

    def __init__(self, group: dist.ProcessGroup | None, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm: Any = None, *,
                 symmoe_config: SymmoeConfig | str | os.PathLike | None = None) -> None:
        api = f"{_API}(...)"
        reject(api, "num_rdma_bytes", num_rdma_bytes, bool(num_rdma_bytes) and not low_latency_mode,
               "only intranode normal mode and the low-latency mode are implemented; normal mode needs "
               "num_rdma_bytes=0 (what Config.get_rdma_buffer_size_hint returns); symmoe reaches every peer "
               "through one symmetric buffer")
        reject(api, "enable_shrink", enable_shrink, bool(enable_shrink),
               "rank masking (the low-latency mask buffer) is not implemented; pass enable_shrink=False")
        reject(api, "comm", comm, comm is not None and group is None,
               "symmoe needs a torch.distributed process group; pass group= instead of an mpi4py communicator")
        # Ignored, documented: num_nvl_bytes (symmoe sizes the buffer from its config),
        # num_qps_per_rank / allow_nvlink_for_low_latency_mode / allow_mnnvl (RDMA and
        # low-latency transport knobs), explicitly_destroy (destroy() works either way).
        self.symmoe = SymmoeBuffer(group, resolve(symmoe_config))
        self.group = group
        self.rank = self.symmoe.rank
        self.group_size = self.symmoe.world_size
        # As given, like DeepEP: code that re-creates the buffer when `num_nvl_bytes` is below
        # its hint must not loop. What symmoe really allocated is `symmoe_bytes`.
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = False
        self._last_layout: tuple | None = None

    @property
    def symmoe_bytes(self) -> int:
        return self.symmoe.layout.total_bytes

    def destroy(self) -> None:
        self.symmoe.close()

    # -- static helpers ------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        """True: FP8 dispatch, DeepEP's SM90-only path, is available (symmoe moves FP8 rows on
        every backend)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Recorded for ``get_dispatch_config``/``get_combine_config``; symmoe launches with
        ``kernel.num_sms`` of its config (a performance setting only)."""
        if new_num_sms % 2:
            raise InputError(f"{_API}.set_num_sms: new_num_sms={new_num_sms}; DeepEP requires an even SM count")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        return capture()

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """A DeepEP-shaped config (ignored by dispatch; kept so tuning code runs)."""
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """Bytes of symmetric memory per rank that symmoe's low-latency mode allocates at its first
        call (for top-8 routing; the buffer is sized by the real top-k then)."""
        return SymmoeBuffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                                           num_experts)

    def get_comm_stream(self) -> torch.Stream:
        raise UnsupportedCall(f"{_API}.get_comm_stream", "symmoe runs every call on the caller's current "
                              "stream; there is no separate communication stream")

    def get_local_buffer_tensor(self, dtype: torch.dtype, size: torch.Size | None = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> torch.Tensor:
        raise UnsupportedCall(f"{_API}.get_local_buffer_tensor", "symmoe's buffer is cut into named regions "
                              "(symmoe.layout); DeepEP's raw buffer layout does not exist here")

    # -- layout --------------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int,
                            previous_event: EventOverlap | None = None, async_finish: bool = False,
                            allocate_on_comm_stream: bool = False
                            ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor, EventOverlap]:
        """``(num_tokens_per_rank [W] int32, None (intranode: no RDMA ranks),
        num_tokens_per_expert [E] int32, is_token_in_rank [T, W] bool, event)``."""
        wait(previous_event)
        per_rank, _, per_expert, in_rank, event = self.symmoe.get_dispatch_layout(topk_idx, num_experts)
        # Remembered so dispatch can skip re-checking a layout it knows came from this topk_idx.
        self._last_layout = (weakref.ref(topk_idx), topk_idx._version,
                             tuple((weakref.ref(t), t._version) for t in (per_rank, per_expert, in_rank)))
        return per_rank, None, per_expert, in_rank, EventOverlap(event)

    def _layout_is_fresh(self, topk_idx: torch.Tensor, tensors: tuple) -> bool:
        if self._last_layout is None:
            return False
        ref, version, outs = self._last_layout
        if ref() is not topk_idx or topk_idx._version != version:
            return False
        return all(r() is t and t._version == v for (r, v), t in zip(outs, tensors))

    def _check_layout(self, topk_idx: torch.Tensor, num_tokens_per_rank: torch.Tensor | None,
                      is_token_in_rank: torch.Tensor | None, num_tokens_per_expert: torch.Tensor | None) -> None:
        """DeepEP routes by ``is_token_in_rank`` and counts by the two count tensors; symmoe
        routes by ``topk_idx``. They agree when the layout came from ``get_dispatch_layout``
        of the same ``topk_idx``; anything else would be routed differently, so it raises."""
        given = {"num_tokens_per_rank": num_tokens_per_rank, "is_token_in_rank": is_token_in_rank,
                 "num_tokens_per_expert": num_tokens_per_expert}
        if all(t is None for t in given.values()):
            return
        if self._layout_is_fresh(topk_idx, (num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank)):
            return
        validate.check_topk_idx(topk_idx, self.symmoe.layout, self.symmoe.device)
        want = get_dispatch_layout(topk_idx, self.symmoe.num_experts, self.group_size)
        wanted = {"num_tokens_per_rank": want.num_tokens_per_rank, "is_token_in_rank": want.is_token_in_rank,
                  "num_tokens_per_expert": want.num_tokens_per_expert}
        checks = []
        for name, t in given.items():
            if t is None:
                continue
            w = wanted[name]
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(w.shape):
                raise InputError(f"{_API}.dispatch: {name} is {describe(t)}; expected shape {tuple(w.shape)} "
                                 f"(what get_dispatch_layout(topk_idx, {self.symmoe.num_experts}) returns)")
            checks.append((name, (t.to(w.dtype) != w).any()))
        bad = torch.stack([c for _, c in checks]).tolist()  # one device sync
        for (name, _), b in zip(checks, bad):
            if b:
                raise InputError(f"{_API}.dispatch: {name} does not match topk_idx. DeepEP would route by the "
                                 f"layout tensors, symmoe routes by topk_idx; pass what get_dispatch_layout("
                                 f"topk_idx, {self.symmoe.num_experts}) returned for this topk_idx")

    # -- dispatch / combine ----------------------------------------------------------------------
    def dispatch(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], handle: Handle | None = None,
                 num_tokens_per_rank: torch.Tensor | None = None, num_tokens_per_rdma_rank: torch.Tensor | None = None,
                 is_token_in_rank: torch.Tensor | None = None, num_tokens_per_expert: torch.Tensor | None = None,
                 topk_idx: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                 expert_alignment: int = 1, num_worst_tokens: int = 0, config: Config | None = None,
                 previous_event: EventOverlap | None = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, list[int] | None,
                            Handle | None, EventOverlap]:
        """``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle,
        event)``; with ``handle=`` (cached dispatch, e.g. the backward of combine)
        ``(recv_x, None, None, None, None, event)``. FP8 ``x = (x_e4m3, x_scales)``: ``recv_x``
        is ``(recv_x_e4m3, recv_x_scales)``, scales row-major.

        ``async_finish=False`` (DeepEP's default): the event holds no CUDA event, as DeepEP's.
        Ignored (performance only): ``config``, ``allocate_on_comm_stream``,
        ``num_tokens_per_rdma_rank`` (intranode DeepEP ignores it too)."""
        api = f"{_API}.dispatch"
        check_int(api, "expert_alignment", expert_alignment, 1)
        check_int(api, "num_worst_tokens", num_worst_tokens, 0)
        wait(previous_event)
        if handle is not None:
            self._check_handle(api, handle)
            if topk_idx is not None or topk_weights is not None:
                raise InputError(f"{api}: a cached dispatch (handle=...) takes no topk_idx/topk_weights; it reuses "
                                 "the routing of the dispatch that made the handle")
            # symmoe's own cached dispatch: the same rows in the same order, no routing.
            # As many rows as the handle's dispatch returned (DeepEP sizes by its recv_src_idx).
            recv_x, _, _, _, _, event = self.symmoe.dispatch(x, handle=handle.symmoe,
                                                             num_worst_tokens=handle.num_worst_tokens,
                                                             record_event=async_finish)
            return recv_x, None, None, None, None, EventOverlap(event)
        if topk_idx is None or topk_weights is None:
            missing = "topk_idx" if topk_idx is None else "topk_weights"
            raise UnsupportedArgument(api, missing, None,
                                      "symmoe routes by expert id and needs both topk_idx and topk_weights "
                                      "(layout-only dispatch by is_token_in_rank is not implemented); "
                                      "a cached re-dispatch with handle= is supported")
        for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
        self._check_layout(topk_idx, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert)
        # DeepEP's handle does not hold topk_idx/topk_weights, so the caller may change them
        # before the backward pass runs: copies go to symmoe only where its handle would read
        # them later (the GPU backends' rank-major handles keep their own routing).
        if not self.symmoe.handle_keeps_routing("rank"):
            topk_idx, topk_weights = topk_idx.clone(), topk_weights.clone()
        # num_worst_tokens: worst-case-sized outputs straight from symmoe (no copy); every rank
        # raises CapacityError when some rank receives more.
        recv_x, recv_idx, recv_w, per_expert, sh, event = self.symmoe.dispatch(
            x, topk_idx, topk_weights, output_layout="rank", expert_alignment=1, num_worst_tokens=num_worst_tokens,
            record_event=async_finish)
        # DeepEP counts each local expert's tokens rounded up to expert_alignment (the rows
        # themselves are not padded: recv_x is rank-major); symmoe reports them unpadded.
        # (per_expert is a fresh list; a call per expert cost ~20 µs a dispatch at 128 experts per rank)
        if num_worst_tokens:
            per_expert_list = []
        elif expert_alignment == 1:
            per_expert_list = per_expert
        else:
            per_expert_list = [align_up(c, expert_alignment) for c in per_expert]
        # With num_worst_tokens symmoe's handle covers the worst-case rows, sources -1 past the
        # received ones, as DeepEP's recv_src_idx (whose rows there it leaves uninitialised).
        new_handle = Handle((_CHANNEL_PREFIX, _RECV_CHANNEL_PREFIX, sh.recv_src_token, sh.is_token_in_rank, _SEND_HEAD),
                            sh, num_worst_tokens, self)
        return recv_x, recv_idx, recv_w, per_expert_list, new_handle, EventOverlap(event)

    def combine(self, x: torch.Tensor, handle: Handle, topk_weights: torch.Tensor | None = None,
                bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None, config: Config | None = None,
                previous_event: EventOverlap | None = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """``(combined_x, combined_topk_weights, event)``: each token's rows from the ranks it
        went to, summed in fp32 in ascending rank order and cast once (no weights applied);
        ``combined_topk_weights`` the same sum of ``topk_weights``."""
        api = f"{_API}.combine"
        self._check_handle(api, handle)
        check_not_fp8(api, x)
        reject(api, "bias", bias, bias is not None,
               "symmoe's combine has no bias term; DeepEP adds it in fp32 before the one cast, so adding it "
               "to combined_x afterwards would round differently. Pass bias=None")
        sh = handle.symmoe
        allocated = handle.num_worst_tokens or sh.num_recv_rows
        x = rows_for_combine(api, "x", x, sh.num_recv_rows, allocated)
        topk_weights = rows_for_combine(api, "topk_weights", topk_weights, sh.num_recv_rows, allocated)
        wait(previous_event)
        out, out_w, event = self.symmoe.combine(x, sh, topk_weights, record_event=async_finish)
        return out, out_w, EventOverlap(event)

    def _check_handle(self, api: str, handle: Any) -> None:
        if not isinstance(handle, Handle):
            raise InputError(f"{api}: handle is {describe(handle)}; pass the handle this Buffer's dispatch returned")
        if handle._owner() is not self:
            raise InputError(f"{api}: handle was made by another Buffer; use the Buffer that dispatched")

    # -- what normal-mode intranode DeepEP has and symmoe does not ------------------------------
    # -- low-latency mode ----------------------------------------------------------------------
    def _check_low_latency(self, api: str) -> None:
        if not self.low_latency_mode:
            raise UnsupportedCall(api, "this Buffer was made with low_latency_mode=False, as DeepEP requires for "
                                  "the low-latency calls; construct it with low_latency_mode=True")

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats: torch.Tensor | None = None,
                             dispatch_wait_recv_cost_stats: torch.Tensor | None = None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                             return_recv_hook: bool = False
                             ) -> tuple[Any, torch.Tensor, "LowLatencyHandle", EventOverlap, Any]:
        """``(recv_x, recv_count [L] int32, handle, event, hook)``, as DeepEP's: ``recv_x`` is
        ``[L, W * T_max, H]`` bfloat16, or with ``use_fp8`` (DeepEP's default) the tuple of e4m3
        data and column-major scales (``symmoe.Buffer.low_latency_dispatch``).
        ``cumulative_local_expert_recv_stats`` gets recv_count added once the rows are in (after
        the hook with ``return_recv_hook``)."""
        api = f"{_API}.low_latency_dispatch"
        self._check_low_latency(api)
        reject(api, "dispatch_wait_recv_cost_stats", dispatch_wait_recv_cost_stats,
               dispatch_wait_recv_cost_stats is not None, "symmoe does not time its waits per rank; pass None")
        stats = cumulative_local_expert_recv_stats
        recv_x, count, sh, event, hook = self.symmoe.low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=use_fp8, round_scale=round_scale,
            use_ue8m0=use_ue8m0, async_finish=async_finish, return_recv_hook=return_recv_hook)
        if stats is not None:
            if hook is None:
                stats.add_(count)
            else:
                inner = hook

                def hook() -> None:
                    inner()
                    stats.add_(count)
        return recv_x, count, LowLatencyHandle(sh), EventOverlap(event), hook

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                            handle: "LowLatencyHandle", use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False,
                            out: torch.Tensor | None = None, combine_wait_recv_cost_stats: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, EventOverlap, Any]:
        """``(combined_x [T, H] bfloat16, event, hook)``: each token's expert rows times its
        ``topk_weights``, summed in fp32 in ascending top-k slot order and cast once."""
        api = f"{_API}.low_latency_combine"
        self._check_low_latency(api)
        reject(api, "use_logfmt", use_logfmt, bool(use_logfmt), "LogFMT rows are not implemented; pass False")
        reject(api, "zero_copy", zero_copy, bool(zero_copy),
               "there is no get_next_low_latency_combine_buffer; pass zero_copy=False")
        reject(api, "combine_wait_recv_cost_stats", combine_wait_recv_cost_stats,
               combine_wait_recv_cost_stats is not None, "symmoe does not time its waits per rank; pass None")
        if not isinstance(handle, LowLatencyHandle):
            raise InputError(f"{api}: handle is {describe(handle)}; pass the handle low_latency_dispatch returned")
        combined, event, hook = self.symmoe.low_latency_combine(x, topk_idx, topk_weights, handle.symmoe,
                                                                async_finish=async_finish,
                                                                return_recv_hook=return_recv_hook, out=out)
        return combined, EventOverlap(event), hook

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Collective. symmoe's flags carry sequence numbers, so switching from normal mode needs no
        cleaning; this resets them (after a StallError or an abandoned hook)."""
        self._check_low_latency(f"{_API}.clean_low_latency_buffer")
        self.symmoe.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    get_next_low_latency_combine_buffer = unsupported(_API, "get_next_low_latency_combine_buffer", _NO_LL)
    low_latency_update_mask_buffer = unsupported(_API, "low_latency_update_mask_buffer", _NO_LL)
    low_latency_query_mask_buffer = unsupported(_API, "low_latency_query_mask_buffer", _NO_LL)
    low_latency_clean_mask_buffer = unsupported(_API, "low_latency_clean_mask_buffer", _NO_LL)
    internode_dispatch = unsupported(_API, "internode_dispatch", "call dispatch(); symmoe picks the transport per peer")
    internode_combine = unsupported(_API, "internode_combine", "call combine(); symmoe picks the transport per peer")
