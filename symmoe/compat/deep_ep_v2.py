"""DeepEP V2's ``deep_ep.ElasticBuffer`` (expert-parallel dispatch/combine) on top of
``symmoe.Buffer``.

``import symmoe.compat.deep_ep_v2 as deep_ep`` in place of ``import deep_ep``; the
README's ``dispatch_forward`` / ``combine_forward`` / their backward passes and the
cached-handle decoding loop run unchanged, in both layouts: ``do_expand=False`` (one row per
token and receiving rank -- symmoe's rank-major output) and ``do_expand=True`` (one row per
token and local expert, grouped by expert, each group padded to ``expert_alignment`` --
symmoe's expert-major output). The symmoe config picks the backend and sizes the buffer
(``symmoe_config=`` or ``set_default_config``); the constructor's ``num_max_tokens_per_rank``,
``hidden`` and ``num_topk`` override its ``buffer.*`` values when > 0.

What you get is DeepEP V2 with ``deterministic=True`` and ``do_zero_padding=True`` on a
single scale-up domain, with these documented differences (each cannot be made identical
without moving more data or changing symmoe's reduction rule):

* ``recv_topk_weights`` (``do_expand=False``) is 0 where ``recv_topk_idx`` is -1; DeepEP V2
  leaves the sender's weight there (its own tests mask those slots).
* ``do_expand=False`` combine adds the ranks' rows in ascending rank order; DeepEP V2 adds
  them in top-k slot order. Both add in fp32 and cast once, so the bits agree whenever a
  token reaches at most two ranks and may differ in the last place otherwise.
* ``do_expand=True`` combine sums a token's slots once, in fp32, in top-k order -- what
  DeepEP V2 gives with ``allow_multiple_reduction=False``. With DeepEP's default (True) it
  first rounds each rank's partial sum to bf16; a warning says so on the first such combine.

FP8 ``x = (x_e4m3, sf)`` (float32 per-128 scales, or UE8M0 packed four to an int32)
dispatches with its bytes unchanged and ``recv_x = (recv_x_e4m3, recv_sf)``;
``use_tma_aligned_col_major_sf=True`` gives ``recv_sf`` in DeepGEMM's TMA-aligned MN-major
layout, and with ``do_expand`` the handle's ``psum_num_recv_tokens_per_expert`` is DeepGEMM's
psum grouped layout (``symmoe.fp8``). ``use_fp8_dispatch`` changes nothing (FP8 rows fit the
bfloat16 buffer).

Raise: an FP8 ``x`` to combine, ``num_cpu_bytes > 0``, ``bias`` in combine,
``topk_weights`` in an expanded combine, a cached dispatch whose ``do_expand`` /
``num_experts`` / ``expert_alignment`` differ from its handle's, Engram, PP and AGRS calls.
Ignored (performance or transport only): ``num_bytes``, ``deterministic`` (always on),
``allow_hybrid_mode``, ``prefer_overlap_with_compute``, ``sl_idx``, ``num_allocated_qps``,
the timeouts (symmoe's is ``kernel.timeout_s``), ``num_sms``, ``num_qps``,
``async_with_compute_stream``, ``allocate_on_comm_stream``, ``use_fp8_dispatch``.
``symmoe_low_latency=True`` (constructor): a dispatch with ``do_expand=True, do_cpu_sync=False``
(DeepEP V2's decode path), a cached dispatch of its handle and its combine run on symmoe's
low-latency engine, with no host wait and no host epoch, so a CUDA graph can capture them (make
one such dispatch eagerly first: it allocates that engine's buffer, sized by
``num_max_tokens_per_rank``). Same outputs, bitwise, as without it (bfloat16 ``x``). Every other
call, and every call of a buffer without it, runs symmoe's normal mode, which raises inside
CUDA graph capture (its barrier epochs come from the host).

Supported as in DeepEP: ``do_expand``, ``expert_alignment``, ``do_cpu_sync=False`` (worst-case
sizes), ``do_handle_copy``, ``do_zero_padding`` (padding is always zero),
``cumulative_local_expert_recv_stats``, cached ``handle=`` dispatch.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist

from ..buffer import Buffer as SymmoeBuffer
from ..config import Config as SymmoeConfig
from ..errors import CapacityError, InputError
from ..handle import DispatchHandle
from ..results import padded_group_offsets
from .elastic_low_latency import LowLatencyRoute, expand, engine_rows, pack_rows
from ._common import (EventHandle, EventOverlap, UnsupportedCall, Unavailable, align_up, unsupported,
                      check_int, check_not_fp8, describe, pad_rows, reject, resolve, rows_for_combine,
                      set_default_config, topk_idx_t, wait)

__all__ = ["ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "topk_idx_t", "set_default_config"]

_API = "deep_ep.ElasticBuffer"


@dataclasses.dataclass(eq=False)
class EPHandle:
    """DeepEP V2's ``EPHandle``, filled with DeepEP's values for a single scale-up domain:

    * ``num_recv_tokens`` / ``num_expanded_tokens``: rows of the dispatch outputs (the
      worst case, as in DeepEP, when ``do_cpu_sync=False``)
    * ``num_recv_tokens_per_expert_list``: per local expert, rounded up to ``expert_alignment``
      (empty without CPU sync, as in DeepEP)
    * ``psum_num_recv_tokens_per_scaleup_rank``: inclusive prefix sum of the tokens received
      from each rank
    * ``psum_num_recv_tokens_per_expert``: inclusive prefix sum of the aligned counts; with
      ``do_expand`` the aligned start of each expert's group plus its real count
    * ``num_unaligned_recv_tokens_per_expert``: real counts per local expert
    * ``recv_src_metadata`` [tokens, 2 + K] int32: source token's global index
      (``src_rank * num_max_tokens_per_rank + token``), ``src_rank * K + first local slot``,
      then for ``do_expand`` the expanded row of each slot (-1 where none), else -1
    * ``token_metadata_at_forward`` / ``channel_linked_list``: None (hybrid mode only)
    * ``dst_buffer_slot_idx``: DeepEP's buffer slots; a placeholder that raises if used
    """

    do_expand: bool
    num_experts: int
    expert_alignment: int
    num_max_tokens_per_rank: int
    num_sms: int
    topk_idx: torch.Tensor
    num_recv_tokens: int
    num_expanded_tokens: int
    num_recv_tokens_per_expert_list: list[int]
    psum_num_recv_tokens_per_scaleup_rank: torch.Tensor
    psum_num_recv_tokens_per_expert: torch.Tensor
    num_unaligned_recv_tokens_per_expert: torch.Tensor
    recv_src_metadata: torch.Tensor
    symmoe: DispatchHandle | None  # None for a low-latency dispatch (``_ll``)
    _recv_topk_idx: torch.Tensor | None  # rank-major, unpadded: which slots are local
    _padded: bool
    owner: dataclasses.InitVar["ElasticBuffer"]
    _ll: LowLatencyRoute | None = None  # the dispatch ran on the low-latency engine (symmoe_low_latency)
    dst_buffer_slot_idx: Unavailable = dataclasses.field(init=False, default=Unavailable(
        "handle.dst_buffer_slot_idx", "it indexes DeepEP's own buffer slots"))
    token_metadata_at_forward: None = dataclasses.field(init=False, default=None)
    channel_linked_list: None = dataclasses.field(init=False, default=None)
    cached_recv_src_metadata_before_sort: None = dataclasses.field(init=False, default=None)
    _unit_weights: DispatchHandle | None = dataclasses.field(init=False, default=None)

    def __post_init__(self, owner: "ElasticBuffer") -> None:
        self._owner = weakref.ref(owner)

    @property
    def allocated_rows(self) -> int:
        """Rows of this handle's dispatch outputs (what combine's ``x`` may have)."""
        return self.num_expanded_tokens if self.do_expand else self.num_recv_tokens

    def deterministic_sort(self, *args: Any, **kwargs: Any) -> None:
        """No-op: symmoe's rows are already in (source rank, source token) order."""

    def unit_weight_handle(self) -> DispatchHandle:
        """The symmoe handle with every routed slot weighted 1.0. symmoe's expert-major combine
        computes sum_k fp32(w[t,k]) * fp32(y) in top-k order; with w = 1 the product is exact, so
        this is DeepEP's plain sum of the expanded rows. Combine reads the source-side weights
        from the handle (DispatchHandle.topk_weights), so only the copy is changed."""
        if self._unit_weights is None:
            sh = self.symmoe
            self._unit_weights = dataclasses.replace(sh, topk_weights=(sh.topk_idx >= 0).float().contiguous())
        return self._unit_weights


def _worst_rows(do_expand: bool, W: int, nmax: int, K: int, L: int, alignment: int) -> int:
    """DeepEP's worst-case output rows without CPU sync: every rank's every token, expanded
    to its local experts (at most min(K, L) each) plus each group's padding."""
    return align_up(W * nmax * min(K, L) + (alignment - 1) * L, alignment) if do_expand else W * nmax


def _unsupported(name: str, why: str, static: bool = False) -> Any:
    return unsupported(_API, name, why, static)


def _sized(cfg: SymmoeConfig, num_max_tokens_per_rank: int, hidden: int, num_topk: int) -> SymmoeConfig:
    """The config with DeepEP's MoE settings (when > 0) in place of its buffer.* values."""
    over = {k: v for k, v in (("buffer.max_tokens_per_rank", num_max_tokens_per_rank), ("buffer.hidden", hidden),
                              ("buffer.topk", num_topk)) if v}
    return cfg.replace(**over) if over else cfg


def _world(group: dist.ProcessGroup | None) -> int:
    if group is not None:
        return group.size()
    return dist.get_world_size() if dist.is_initialized() else 1


class ElasticBuffer:
    """``deep_ep.ElasticBuffer`` dispatch/combine, run by ``symmoe.Buffer`` (``.symmoe``).

    Extra keywords: ``symmoe_config`` -- a ``symmoe.Config`` or a YAML path (default: what
    ``set_default_config`` set, else ``symmoe.Config()``); ``symmoe_low_latency`` -- run
    expanded dispatches without CPU sync and their combines on the low-latency engine, which
    a CUDA graph can capture (module docstring)."""

    def __init__(self, group: dist.ProcessGroup | None, num_bytes: int | None = None, num_cpu_bytes: int = 0,
                 num_max_tokens_per_rank: int = 0, hidden: int = 0, num_topk: int = 0,
                 use_fp8_dispatch: bool = False, deterministic: bool = False, allow_hybrid_mode: bool = True,
                 allow_multiple_reduction: bool = True, prefer_overlap_with_compute: bool = True, sl_idx: int = 3,
                 num_allocated_qps: int = 0, num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100,
                 explicitly_destroy: bool = False, *,
                 symmoe_config: SymmoeConfig | str | os.PathLike | None = None,
                 symmoe_low_latency: bool = False) -> None:
        api = f"{_API}(...)"
        if not isinstance(symmoe_low_latency, bool):
            raise InputError(f"{api}: symmoe_low_latency={symmoe_low_latency!r}; expected True or False")
        reject(api, "num_cpu_bytes", num_cpu_bytes, bool(num_cpu_bytes),
               "CPU (Engram) storage is not implemented; pass num_cpu_bytes=0")
        # Ignored, documented: num_bytes (symmoe sizes from its config), deterministic (symmoe
        # is always deterministic), allow_hybrid_mode / sl_idx / num_allocated_qps (RDMA
        # transport), prefer_overlap_with_compute (SM count), the timeouts (symmoe's is
        # kernel.timeout_s), explicitly_destroy. allow_multiple_reduction: see combine.
        cfg = _sized(resolve(symmoe_config), num_max_tokens_per_rank, hidden, num_topk)
        self.symmoe = SymmoeBuffer(group, cfg)
        self.group = group
        self.rank_idx = self.symmoe.rank
        self.num_ranks = self.symmoe.world_size
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        self.num_bytes = num_bytes if num_bytes is not None else self.symmoe.layout.total_bytes
        self.num_max_tokens_per_rank = cfg.buffer.max_tokens_per_rank
        self.num_allocated_qps = num_allocated_qps
        self.explicitly_destroy = explicitly_destroy
        # One scale-up domain holds every rank (symmoe's buffer reaches every peer).
        self.num_scaleout_ranks, self.num_scaleup_ranks = 1, self.num_ranks
        self.scaleout_rank_idx, self.scaleup_rank_idx = 0, self.rank_idx
        self.num_rdma_ranks, self.num_nvlink_ranks = 1, self.num_ranks
        self._warned_reduction = False
        self.symmoe_low_latency = symmoe_low_latency

    def destroy(self) -> None:
        self.symmoe.close()

    # -- sizing and runtime facts ------------------------------------------------------------------
    @staticmethod
    def get_buffer_size_hint(group: dist.ProcessGroup | None, num_max_tokens_per_rank: int, hidden: int,
                             num_topk: int = 0, use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        """Bytes per rank symmoe allocates for the default config with these MoE settings."""
        cfg = _sized(resolve(None), num_max_tokens_per_rank, hidden, num_topk)
        return SymmoeBuffer.size_hint(cfg, _world(group))

    @staticmethod
    def capture() -> EventHandle:
        return EventHandle()

    def get_comm_stream(self) -> torch.Stream:
        raise UnsupportedCall(f"{_API}.get_comm_stream", "symmoe runs every call on the caller's current "
                              "stream; there is no separate communication stream")

    def get_physical_domain_size(self) -> tuple[int, int]:
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self) -> tuple[int, int]:
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, *args: Any, **kwargs: Any) -> int:
        """symmoe's ``kernel.num_sms`` (its launch width comes from the config)."""
        return self.symmoe.config.kernel.num_sms

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        """0: symmoe opens no RDMA queue pairs of its own."""
        return 0

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True) -> None:
        if self.symmoe.device.type == "cuda":
            torch.cuda.synchronize(self.symmoe.device)
        if dist.is_initialized() and self.num_ranks > 1:
            dist.barrier(group=self.group)

    # -- dispatch ----------------------------------------------------------------------------------
    def dispatch(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None,
                 cumulative_local_expert_recv_stats: torch.Tensor | None = None, num_experts: int | None = None,
                 num_max_tokens_per_rank: int | None = None, expert_alignment: int | None = None,
                 num_sms: int = 0, num_qps: int = 0, previous_event: Any = None,
                 previous_event_before_epilogue: Any = None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle: EPHandle | None = None,
                 do_handle_copy: bool = True, do_cpu_sync: bool | None = None, do_expand: bool = False,
                 do_zero_padding: bool = False, use_tma_aligned_col_major_sf: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, EPHandle, EventOverlap]:
        """``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``.

        ``do_expand=False``: recv_x [tokens, H], recv_topk_idx [tokens, K] (local ids, -1
        elsewhere), recv_topk_weights [tokens, K]. ``do_expand=True``: recv_x [rows, H]
        grouped by local expert and padded with zero rows, recv_topk_idx None,
        recv_topk_weights [rows]. With ``handle=`` the routing of that handle is reused and
        the same handle is returned.

        FP8 ``x = (x_e4m3, sf)``: ``recv_x = (recv_x_e4m3, recv_sf)``, ``recv_sf`` in DeepGEMM's
        TMA-aligned MN-major layout with ``use_tma_aligned_col_major_sf``.

        Ignored (performance only): num_sms, num_qps, async_with_compute_stream,
        allocate_on_comm_stream; both events are waited for before the call."""
        api = f"{_API}.dispatch"
        scale_layout = "mn_major" if use_tma_aligned_col_major_sf else "row"
        if do_zero_padding and not do_expand:
            raise InputError(f"{api}: do_zero_padding=True needs do_expand=True (padding exists only there)")
        cached = handle is not None
        if cached:
            self._check_handle(api, handle)
            if topk_idx is not None:
                raise InputError(f"{api}: a cached dispatch (handle=...) takes no topk_idx; it reuses the handle's")
            if do_cpu_sync:
                raise InputError(f"{api}: do_cpu_sync=True with handle=...; a cached dispatch never syncs "
                                 "(its sizes come from the handle)")
            for name, given, have in (("num_experts", num_experts, handle.num_experts),
                                      ("expert_alignment", expert_alignment, handle.expert_alignment),
                                      ("num_max_tokens_per_rank", num_max_tokens_per_rank,
                                       handle.num_max_tokens_per_rank), ("do_expand", do_expand, handle.do_expand)):
                if given is not None and given != have:
                    raise InputError(f"{api}: {name}={given!r} but the handle was made with {name}={have!r}")
            topk_idx, num_experts, alignment = handle.topk_idx, handle.num_experts, handle.expert_alignment
            nmax, padded = handle.num_max_tokens_per_rank, handle._padded
        else:
            if not isinstance(topk_idx, torch.Tensor):
                raise InputError(f"{api}: topk_idx is {describe(topk_idx)}; pass the [tokens, topk] expert ids "
                                 "(or handle= for a cached dispatch)")
            if num_experts is not None and num_experts != self.symmoe.num_experts:
                raise InputError(f"{api}: num_experts={num_experts}; this buffer's symmoe config has "
                                 f"buffer.num_experts={self.symmoe.num_experts}")
            num_experts = self.symmoe.num_experts
            alignment = check_int(api, "expert_alignment", 1 if expert_alignment is None else expert_alignment, 1)
            nmax = check_int(api, "num_max_tokens_per_rank", num_max_tokens_per_rank or self.num_max_tokens_per_rank, 1)
            padded = do_cpu_sync is False
        if topk_weights is not None and not isinstance(topk_weights, torch.Tensor):
            raise InputError(f"{api}: topk_weights is {describe(topk_weights)}; pass a float32 tensor or None")
        if topk_idx.dim() == 2 and topk_idx.shape[0] > nmax:
            raise CapacityError(f"{api}: {topk_idx.shape[0]} tokens > num_max_tokens_per_rank={nmax}")
        wait(previous_event)
        wait(previous_event_before_epilogue)
        if handle._ll is not None if cached else (self.symmoe_low_latency and do_expand and padded):
            return self._ll_dispatch(api, x, topk_idx, topk_weights, handle, num_experts, nmax, alignment,
                                     do_handle_copy, cumulative_local_expert_recv_stats)

        # symmoe needs weights; without them they only travel, so zeros stand in.
        weights = topk_weights if topk_weights is not None else torch.zeros(
            topk_idx.shape, dtype=torch.float32, device=topk_idx.device)
        routing = topk_idx.clone() if (do_handle_copy and not cached) else topk_idx
        layout = "expert" if do_expand else "rank"
        # Without CPU sync DeepEP returns worst-case-sized outputs; their tail rows are
        # unspecified there (zeros, -1 expert ids and zero weights here, no copy: symmoe's
        # num_worst_tokens).
        worst = _worst_rows(do_expand, self.num_ranks, nmax, topk_idx.shape[1], num_experts // self.num_ranks,
                            alignment) if padded else 0
        if cached and topk_weights is None:
            # symmoe's own cached dispatch (no routing); new weights need the full dispatch.
            recv_x, recv_idx, recv_w, per_expert, sh, event = self.symmoe.dispatch(x, handle=handle.symmoe,
                                                                                   num_worst_tokens=worst,
                                                                                   scale_layout=scale_layout)
        else:
            recv_x, recv_idx, recv_w, per_expert, sh, event = self.symmoe.dispatch(
                x, routing, weights, output_layout=layout, expert_alignment=alignment if do_expand else 1,
                num_worst_tokens=worst, scale_layout=scale_layout)
        # a list, or with worst-case sizes a tensor on the outputs' device (Buffer.dispatch):
        # without CPU sync it stays there
        unaligned = torch.as_tensor(per_expert, dtype=torch.int64)
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(unaligned.to(cumulative_local_expert_recv_stats.device,
                                                                 cumulative_local_expert_recv_stats.dtype))
        if not cached:  # the handle keeps the received rows' ids, not the worst-case tail
            handle = self._make_handle(sh, routing, recv_idx[:sh.num_recv_rows], unaligned, do_expand, num_experts,
                                       alignment, nmax,
                                       num_sms or self.get_theoretical_num_sms(num_experts, topk_idx.shape[1]),
                                       padded)
        if do_expand:
            recv_idx = None  # DeepEP's expanded layout carries the expert in the row's group
        return recv_x, recv_idx, recv_w if topk_weights is not None else None, handle, EventOverlap(event)

    def _ll_dispatch(self, api: str, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None,
                     handle: EPHandle | None, num_experts: int, nmax: int, alignment: int, do_handle_copy: bool,
                     stats: torch.Tensor | None) -> tuple[torch.Tensor, None, torch.Tensor | None, EPHandle,
                                                          EventOverlap]:
        """The expanded dispatch without CPU sync on the low-latency engine (elastic_low_latency):
        no host read anywhere, so a CUDA graph captures it."""
        if isinstance(x, tuple):
            raise UnsupportedCall(api, "an FP8 x on symmoe_low_latency's path: it moves bfloat16 rows; construct the "
                                  "ElasticBuffer without symmoe_low_latency to dispatch FP8 rows")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
            raise InputError(f"{api}: x is {describe(x)}; expected a torch.bfloat16 tensor [num_tokens, hidden]")
        W, K = self.num_ranks, topk_idx.shape[1]
        weights = topk_weights if topk_weights is not None else torch.zeros(
            topk_idx.shape, dtype=torch.float32, device=topk_idx.device)
        if weights.shape != topk_idx.shape:
            raise InputError(f"{api}: topk_weights is {describe(weights)}; expected shape {tuple(topk_idx.shape)}")
        routing = topk_idx.long()
        if handle is None and do_handle_copy and routing is topk_idx:
            routing = routing.clone()
        rows = pack_rows(x, weights.float(), self.rank_idx)
        recv, count, ll, event, _ = self.symmoe.low_latency_dispatch(rows, routing.contiguous(), nmax, num_experts)
        worst = _worst_rows(True, W, nmax, K, num_experts // W, alignment)
        ex = expand(recv, count, ll, routing, W, alignment, worst)
        if stats is not None:
            stats.add_(ex.counts.to(stats.device, stats.dtype))
        if handle is None:
            handle = EPHandle(
                do_expand=True, num_experts=num_experts, expert_alignment=alignment, num_max_tokens_per_rank=nmax,
                num_sms=self.get_theoretical_num_sms(num_experts, K), topk_idx=routing, num_recv_tokens=W * nmax,
                num_expanded_tokens=worst, num_recv_tokens_per_expert_list=[],
                psum_num_recv_tokens_per_scaleup_rank=ex.per_rank.cumsum(0).to(torch.int32),
                psum_num_recv_tokens_per_expert=(ex.offsets[:-1] + ex.counts).to(torch.int32),
                num_unaligned_recv_tokens_per_expert=ex.counts.to(torch.int32), recv_src_metadata=ex.metadata,
                symmoe=None, _recv_topk_idx=None, _padded=True, owner=self, _ll=ex.route)
        else:
            handle._ll = ex.route  # same routing, same rows: the newest engine handle serves the combine
        return ex.recv_x, None, ex.recv_weights if topk_weights is not None else None, handle, EventOverlap(event)

    def _make_handle(self, sh: DispatchHandle, routing: torch.Tensor, recv_idx: torch.Tensor,
                     unaligned: torch.Tensor, do_expand: bool, num_experts: int, alignment: int, nmax: int,
                     num_sms: int, padded: bool) -> EPHandle:
        dev, W, K = self.symmoe.device, self.num_ranks, routing.shape[1]
        L = num_experts // W
        # The counts are on the device when the dispatch did not wait (num_worst_tokens on the
        # GPU backends): without CPU sync nothing below reads them on the host, except the
        # expanded layout's metadata (its unique/nonzero wait for the device).
        per_src = sh.counts[:, 1 + self.rank_idx].long()  # tokens each rank sent here
        aligned = (unaligned + alignment - 1) // alignment * alignment
        if do_expand:
            offsets = padded_group_offsets(unaligned, alignment)
            psum_expert = offsets[:-1] + unaligned
            meta = self._expanded_metadata(sh, int(per_src.sum()), K, nmax)
        else:
            psum_expert = aligned.cumsum(0)
            meta = self._rank_metadata(sh, recv_idx, K, nmax)
        if padded:
            # DeepEP's worst-case sizes without CPU sync (and no per-expert list then).
            num_recv = _worst_rows(False, W, nmax, K, L, alignment)
            num_expanded = _worst_rows(True, W, nmax, K, L, alignment)
            per_expert_list = []
            meta = pad_rows(meta, num_recv, -1)
        else:
            num_recv, num_expanded, per_expert_list = int(per_src.sum()), int(aligned.sum()), aligned.tolist()
        return EPHandle(
            do_expand=do_expand, num_experts=num_experts, expert_alignment=alignment, num_max_tokens_per_rank=nmax,
            num_sms=num_sms, topk_idx=routing, num_recv_tokens=num_recv, num_expanded_tokens=num_expanded,
            num_recv_tokens_per_expert_list=per_expert_list,
            psum_num_recv_tokens_per_scaleup_rank=per_src.cumsum(0).to(torch.int32).to(dev),
            psum_num_recv_tokens_per_expert=psum_expert.to(torch.int32).to(dev),
            num_unaligned_recv_tokens_per_expert=unaligned.to(torch.int32).to(dev), recv_src_metadata=meta,
            symmoe=sh, _recv_topk_idx=None if do_expand else recv_idx, _padded=padded, owner=self)

    @staticmethod
    def _rank_metadata(sh: DispatchHandle, recv_idx: torch.Tensor, K: int, nmax: int) -> torch.Tensor:
        src, tok = sh.recv_src_rank.long(), sh.recv_src_token.long()
        meta = torch.full((src.shape[0], K + 2), -1, dtype=torch.int32, device=recv_idx.device)
        real = src >= 0  # rows past the received ones (num_worst_tokens) keep -1
        meta[:, 0] = torch.where(real, src * nmax + tok, -1).to(torch.int32)
        first_local = (recv_idx >= 0).to(torch.int8).argmax(1)  # every received row has one
        meta[:, 1] = torch.where(real, src * K + first_local, -1).to(torch.int32)
        return meta

    @staticmethod
    def _expanded_metadata(sh: DispatchHandle, tokens: int, K: int, nmax: int) -> torch.Tensor:
        """One row per received token, in (source rank, token) order, naming the expanded
        row of each of its slots (DeepEP fills rows in arrival order; any order is valid)."""
        rows = (sh.recv_src_rank >= 0).nonzero().flatten()
        src, tok = sh.recv_src_rank[rows].long(), sh.recv_src_token[rows].long()
        slot = sh.recv_src_slot[rows].long()
        keys, inv = torch.unique(src * nmax + tok, sorted=True, return_inverse=True)
        assert keys.numel() == tokens, (keys.numel(), tokens)
        meta = torch.full((tokens, K + 2), -1, dtype=torch.int32, device=rows.device)
        meta[:, 0] = keys.to(torch.int32)
        first = torch.full((tokens,), K, dtype=torch.int64, device=rows.device).scatter_reduce(
            0, inv, slot, reduce="amin")
        meta[:, 1] = (keys // nmax * K + first).to(torch.int32)
        meta[inv, 2 + slot] = rows.to(torch.int32)
        return meta

    # -- combine -----------------------------------------------------------------------------------
    def combine(self, x: torch.Tensor, handle: EPHandle, topk_weights: torch.Tensor | None = None,
                bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None, num_sms: int = 0,
                num_qps: int = 0, previous_event: Any = None, previous_event_before_epilogue: Any = None,
                async_with_compute_stream: bool = False, allocate_on_comm_stream: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """``(combined_x [T, H], combined_topk_weights [T, K] or None, event)``: each token's
        rows summed in fp32 and cast once (no weights applied). ``combined_topk_weights[t, k]``
        is the value the rank owning expert ``topk_idx[t, k]`` sent back (0 for -1 slots)."""
        api = f"{_API}.combine"
        self._check_handle(api, handle)
        check_not_fp8(api, x)
        reject(api, "bias", bias, bias is not None,
               "symmoe's combine has no bias term; DeepEP adds it in fp32 before the one cast, so adding it "
               "to combined_x afterwards would round differently. Pass bias=None")
        sh = handle.symmoe
        x = rows_for_combine(api, "x", x, handle.num_expanded_tokens if sh is None else sh.num_recv_rows,
                             handle.allocated_rows)
        wait(previous_event)
        wait(previous_event_before_epilogue)
        if handle.do_expand:
            reject(api, "topk_weights", topk_weights, topk_weights is not None,
                   "symmoe's expert-major combine does not carry per-row weights back; combine weights with a "
                   "do_expand=False handle")
            if self.allow_multiple_reduction and not self._warned_reduction:
                self._warned_reduction = True
                warnings.warn("symmoe sums a token's expanded rows once in fp32 (DeepEP's allow_multiple_reduction="
                              "False); DeepEP's default (True) rounds each rank's partial sum to bf16 first, so the "
                              "last bit may differ. Construct with allow_multiple_reduction=False to silence this.",
                              stacklevel=2)
            if handle._ll is not None:
                route = handle._ll
                ys = engine_rows(x, route, handle.num_experts // self.num_ranks)
                out, event, _ = self.symmoe.low_latency_combine(ys, handle.topk_idx, route.unit_weights, route.ll)
                return out[:, :route.hidden].contiguous(), None, EventOverlap(event)
            out, _, event = self.symmoe.combine(x, handle.unit_weight_handle())
            return out, None, EventOverlap(event)
        w = rows_for_combine(api, "topk_weights", topk_weights, sh.num_recv_rows, handle.allocated_rows)
        if w is not None:
            local = handle._recv_topk_idx
            if not isinstance(w, torch.Tensor) or tuple(w.shape) != tuple(local.shape):
                raise InputError(f"{api}: topk_weights is {describe(w)}; expected shape {tuple(local.shape)}")
            # DeepEP V2 takes slot k from the rank owning that expert; symmoe sums over the
            # ranks, so the slots of experts that live elsewhere are zeroed first.
            w = w.masked_fill(local < 0, 0.0)
        out, out_w, event = self.symmoe.combine(x, sh, w)
        return out, out_w, EventOverlap(event)

    def _check_handle(self, api: str, handle: Any) -> None:
        if not isinstance(handle, EPHandle):
            raise InputError(f"{api}: handle is {describe(handle)}; pass the EPHandle this buffer's dispatch returned")
        if handle._owner() is not self:
            raise InputError(f"{api}: handle was made by another ElasticBuffer; use the one that dispatched")

    # -- the rest of ElasticBuffer -------------------------------------------------------------------
    _ENGRAM = "Engram (remote KV-cache fetch) is not part of symmoe"
    _PP = "pipeline-parallel send/recv is not part of symmoe"
    _AGRS = "all-gather/reduce-scatter sessions are not part of symmoe"
    engram_write = _unsupported("engram_write", _ENGRAM)
    engram_fetch = _unsupported("engram_fetch", _ENGRAM)
    get_engram_storage_size_hint = _unsupported("get_engram_storage_size_hint", _ENGRAM, static=True)
    pp_set_config = _unsupported("pp_set_config", _PP)
    pp_send = _unsupported("pp_send", _PP)
    pp_recv = _unsupported("pp_recv", _PP)
    get_pp_buffer_size_hint = _unsupported("get_pp_buffer_size_hint", _PP, static=True)
    create_agrs_session = _unsupported("create_agrs_session", _AGRS)
    destroy_agrs_session = _unsupported("destroy_agrs_session", _AGRS)
    agrs_new_session = _unsupported("agrs_new_session", _AGRS)
    agrs_set_config = _unsupported("agrs_set_config", _AGRS)
    agrs_get_inplace_tensor = _unsupported("agrs_get_inplace_tensor", _AGRS)
    all_gather = _unsupported("all_gather", _AGRS)
    get_agrs_num_max_session_bytes = _unsupported("get_agrs_num_max_session_bytes", _AGRS, static=True)
    get_agrs_buffer_size_hint = _unsupported("get_agrs_buffer_size_hint", _AGRS, static=True)
