"""push over NVSHMEM: the DeepEP V1 normal-mode flow on the NVSHMEM device API.

Kernels: ``csrc/nvshmem/nvshmem_ext.cu`` (module ``symmoe_nvshmem``, built by
``symmoe.build`` with relocatable device code and a device link against
``libnvshmem_device.a``). The host side here mirrors ``protocol/host.py`` step for step:

dispatch
  1. routing counts of this rank (torch, no host sync) -> row ``me`` of its counts matrix;
     kernel ``counts`` puts the row into every peer's matrix (put-with-signal on ``ready``)
     and waits for all peers' rows (stage ``dispatch.counts``). Meanwhile the GPU sorts this
     rank's send list (by destination, then the receiver's order).
  2. the host reads the matrix (the one host wait, as DeepEP's normal mode), derives every
     offset from prefix sums (numpy), checks every receiver's capacity (all ranks raise
     together) and sends the tables up in one pinned copy
  3. kernel ``dispatch``: C channels, each one sender block (warp puts of rows + metadata
     into the receivers' pools, ``tail[c][me]`` signalled per chunk) and one receiver block
     (copies the rows a rank keeps straight from x, then waits on ``tail[c][s]`` and streams
     delivered rows into the output tensors) (stage ``dispatch.data``)
combine
  4. after another combine only: the device barrier ``combine.done`` (peers may still be
     reducing from the slots this combine writes; a dispatch in between orders them already)
  5. kernel ``combine``: sender blocks put each received row back into its source's combine
     slot ``t * S + slot`` and signal ``head[c][me]``; every block waits for all heads (one
     polling warp), then reduces its tokens in the fixed order in fp32 (stage ``combine.data``)

No host wait follows a kernel: a wait that timed out is raised by the next call or by
``check()`` / ``Buffer.synchronize()``, as in the CUDA protocols. All 2C blocks of a kernel
must be resident at once (combine blocks wait for the peers' senders), so C is capped by the
SMs this process holds (``usable_sms``).

The pool holds the worst case, so no ring-buffer flow control is needed: ``tail`` counts
rows delivered per (channel, source) for dispatch, ``head`` the same for combine (separate
words, so a fast peer's combine never overwrites a dispatch signal still being read).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .. import build
from ..errors import StallError
from ..handle import DispatchHandle
from ..layout import BufferLayout
from ..reference import DispatchLayout, RecvResult
from .base import Protocol

# Stage codes, as in csrc/common/layout.cuh (enum Stage).
STAGES = {"dispatch.counts": 1, "dispatch.data": 2, "combine.data": 4, "combine.done": 5, "barrier": 6}
_STAGE_NAMES = {v: k for k, v in STAGES.items()}
_ELEM_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


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
    from ..backends.nvshmem import stall
    raise stall(mem, _STAGE_NAMES.get(int(code), stage), int(peer), int(epoch))


def _excl(v: np.ndarray, axis: int = 0) -> np.ndarray:
    return v.cumsum(axis) - v


class _Upload:
    """int32 host arrays -> one pinned buffer -> one device buffer, one copy per call. The
    pinned buffer is rewritten only after the previous copy finished (its event)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host = torch.empty(0, dtype=torch.int32, pin_memory=True)
        self.dev = torch.empty(0, dtype=torch.int32, device=device)
        self.done: torch.cuda.Event | None = None

    def __call__(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        n = sum(a.size for a in arrays)
        if self.done is not None:
            self.done.synchronize()
        if n > self.host.numel():
            self.host = torch.empty(2 * n, dtype=torch.int32, pin_memory=True)
            self.dev = torch.empty(2 * n, dtype=torch.int32, device=self.device)
        flat = self.host.numpy()
        views, o = [], 0
        for a in arrays:
            flat[o:o + a.size] = a.ravel()
            views.append(self.dev[o:o + a.size])
            o += a.size
        self.dev[:n].copy_(self.host[:n], non_blocking=True)
        self.done = torch.cuda.Event()
        self.done.record(torch.cuda.current_stream(self.device))
        return views


# -- the host-side arithmetic (numpy on the small counts matrix; routing on the GPU);
# tests/test_nvshmem_plan.py replays the kernels on it --
def routing_counts(lay: BufferLayout, topk_idx: torch.Tensor) -> DispatchLayout:
    """The reference's counts, computed without a host sync."""
    W, E, L = lay.world_size, lay.num_experts, lay.local_experts
    idx = topk_idx.long()
    valid = idx >= 0
    owner = torch.where(valid, idx // L, torch.full_like(idx, -1))
    in_rank = (owner.unsqueeze(-1) == torch.arange(W, device=idx.device)).any(dim=1)
    per_expert = torch.zeros(E + 1, dtype=torch.int64, device=idx.device)
    per_expert.scatter_add_(0, torch.where(valid, idx, torch.full_like(idx, E)).flatten(),
                            torch.ones(idx.numel(), dtype=torch.int64, device=idx.device))
    return DispatchLayout(num_tokens_per_rank=in_rank.sum(0).to(torch.int32),
                          num_tokens_per_expert=per_expert[:E].to(torch.int32), is_token_in_rank=in_rank)


def geometry(lay: BufferLayout, me: int, counts: "np.ndarray | torch.Tensor", output_layout: str,
             alignment: int | None, group_start: "np.ndarray | torch.Tensor | None" = None) -> dict[str, Any]:
    """Every offset rank ``me`` needs, from the counts matrix (host); identical on every rank.
    numpy: it runs while the GPU idles, so it must stay cheap.

    ``n[s, d]``: rows s sends d. Pool of d: source-major, in the sender's list order.
    Sender list of s for d: tokens by index (rank-major); by local expert, then token (expert-major)."""
    W, L = lay.world_size, lay.local_experts
    counts = np.asarray(counts, dtype=np.int64)
    per_rank = counts[:, 1:1 + W]  # [src, dst]
    per_expert = counts[:, 1 + W:].reshape(W, W, L)  # [src, dst, j]
    g: dict[str, Any] = {}
    if output_layout == "rank":
        n = per_rank
        g["totals"] = per_rank.sum(0)
    else:
        n = per_expert.sum(2)
        group = per_expert.sum(0)  # [dst, L]
        if group_start is None:
            padded = (group + alignment - 1) // alignment * alignment
            g["gstart"] = _excl(padded, 1)[me]
            g["totals"] = padded.sum(1)
        else:
            g["gstart"] = np.asarray(group_start, dtype=np.int64)
        g["group"] = group[me]
    g["n"] = n
    g["per_expert_me"] = per_expert[:, me, :]  # [src, j]
    recv_cnt = n[:, me]
    g["recv_cnt"], g["recv_base"] = recv_cnt, _excl(recv_cnt)
    g["send_cnt"], g["send_off"] = n[me], _excl(n[me])
    g["dst_base"] = _excl(n, 0)[me]
    return g


def out_positions(g: dict[str, Any]) -> np.ndarray:
    """Expert-major: pool row -> output row (int32)."""
    cnt = g["per_expert_me"]  # [src, j]
    start = g["gstart"][None, :] + _excl(cnt, 0)  # first output row of each (src, j)
    flat = cnt.ravel()
    return (np.repeat(start.ravel() - _excl(flat), flat) + np.arange(flat.sum())).astype(np.int32)


def padding_rows(g: dict[str, Any], rows: int) -> np.ndarray:
    """Expert-major: the output rows that pad each group up to the alignment."""
    group, gstart = g["group"], g["gstart"]
    ends = np.append(gstart[1:], rows)
    pad = ends - (gstart + group)
    return np.repeat(gstart + group - _excl(pad), pad) + np.arange(pad.sum())


def send_entries(lay: BufferLayout, routing: DispatchLayout, topk_idx: torch.Tensor, output_layout: str) -> torch.Tensor:
    """This rank's rows in send order (by destination, then the receiver's order), each as
    ``t * S + slot`` (slot: the destination rank, or the top-k position). Entries past the
    rows actually sent (``send_cnt.sum()``) are unused. A sort, not ``nonzero``: no host
    sync, so it runs on the GPU while the host waits for the counts."""
    S, K, W = lay.combine_slots, lay.topk, lay.world_size
    if output_layout == "rank":
        in_rank = routing.is_token_in_rank  # [T, W]
        T = in_rank.shape[0]
        dst = torch.arange(W, device=in_rank.device).unsqueeze(0).expand(T, W)
        tok = torch.arange(T, device=in_rank.device).unsqueeze(1).expand(T, W)
        key = torch.where(in_rank, dst * T + tok, torch.full_like(tok, W * max(T, 1)))
        order = key.flatten().argsort()  # by destination, then token
        return ((order // W) * S + order % W).to(torch.int32)
    idx = topk_idx.long()
    T = idx.shape[0]
    tok = torch.arange(T, device=idx.device).unsqueeze(1).expand(T, K)
    key = torch.where(idx >= 0, idx * T + tok, torch.full_like(idx, lay.num_experts * max(T, 1)))
    order = key.flatten().argsort()  # by expert (so by destination), then token
    return ((order // K) * S + order % K).to(torch.int32)


def self_rows(handle: DispatchHandle, me: int, S: int) -> torch.Tensor:
    """[T * S + 1]: the received row of each (token, slot) this rank kept for itself, else -1."""
    T, rows = handle.num_tokens, handle.num_recv_rows
    dev = handle.recv_src_rank.device
    out = torch.full((T * S + 1,), -1, dtype=torch.int32, device=dev)
    where = torch.where(handle.recv_src_rank == me, handle.recv_src_token.long() * S + handle.recv_src_slot.long(),
                        torch.full_like(handle.recv_src_token, T * S, dtype=torch.int64))
    out.scatter_(0, where, torch.arange(rows, dtype=torch.int32, device=dev))
    return out


def usable_sms(device: torch.device) -> int:
    """SMs this process can occupy at once: all of them, or its MPS share."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    pct = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if pct:
        sms = max(2, sms * int(float(pct)) // 100)
    return sms


class NvshmemPush(Protocol):
    name = "push"

    def __init__(self, mem, layout, config, buffer_id):
        super().__init__(mem, layout, config, buffer_id)
        self.ext = mem.runtime.extension()
        self.args = layout.kernel_args()
        self.offs = layout.offsets()
        mem.use_layout(self.args, self.offs["barrier"])
        k = config.kernel
        # One sender and one receiver block per channel, and every combine block waits for the
        # peers' senders: all 2 * C blocks must be resident at once, on the SMs this process
        # has (under MPS, its active thread percentage of them), or the ranks deadlock.
        self.channels = max(1, min(k.num_channels, layout.num_channels, k.num_sms // 2,
                                   usable_sms(mem.device) // 2))
        self.timeout_ns = int(k.timeout_s * 1e9)
        self.err = mem.error_word()
        self.me, self.W = mem.rank, layout.world_size
        self.device = mem.device
        self._dispatches = 0
        self._combines = 0
        self._last_op = ""  # "dispatch" | "combine": a combine right after a combine needs a barrier
        cols = 1 + layout.world_size + layout.num_experts
        self._counts_host = torch.empty((self.W, cols), dtype=torch.int32, pin_memory=True)
        self._upload_dispatch, self._upload_combine = _Upload(self.device), _Upload(self.device)
        # Puts read their source from symmetric memory where a peer is not load/store
        # reachable (IBGDA needs registered memory); SYMMOE_NVSHMEM_STAGE=1 forces it (tests).
        self.stage_inputs = (not mem.all_peers_mapped) or os.environ.get("SYMMOE_NVSHMEM_STAGE") == "1"
        # SYMMOE_NVSHMEM_TIMING=1: time the data kernels alone (benchmarks); ms of the last call.
        self.timing = os.environ.get("SYMMOE_NVSHMEM_TIMING") == "1"
        self.kernel_ms: dict[str, float] = {}

    def _events(self, stream: torch.cuda.Stream) -> "tuple[torch.cuda.Event, torch.cuda.Event] | None":
        if not self.timing:
            return None
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        return a, b

    # -- helpers ---------------------------------------------------------------------------
    def _local(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return self.mem.view(self.offs[name], dtype, shape)

    def _sync_check(self, stream: torch.cuda.Stream, stage: str) -> None:
        stream.synchronize()
        raise_if_failed(self.mem, stage)

    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        return routing_counts(self.layout, topk_idx)


    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, output_layout, alignment):
        raise_if_failed(self.mem, "dispatch")  # a wait of an earlier call expired
        lay, me, W = self.layout, self.me, self.W
        H, K = lay.hidden, lay.topk
        dev = self.device
        stream = torch.cuda.current_stream(dev)
        base = self.mem.local.data_ptr()
        T = x.shape[0]
        routing = routing_counts(lay, topk_idx)

        # 1. counts exchange; the GPU sorts the send list and converts the ids meanwhile
        self._dispatches += 1
        self._last_op = "dispatch"
        epoch = self._dispatches
        cols = 1 + W + lay.num_experts
        row = torch.cat([torch.full((1,), T, dtype=torch.int32, device=dev), routing.num_tokens_per_rank,
                         routing.num_tokens_per_expert])
        self._local("counts", torch.int32, (W, cols))[me].copy_(row)
        self.ext.counts(base, self.args, me, epoch, self.timeout_ns, self.err.data_ptr(), stream.cuda_stream)
        self._counts_host.copy_(self._local("counts", torch.int32, (W, cols)), non_blocking=True)
        counts_ready = torch.cuda.Event()
        counts_ready.record(stream)
        send_ent = send_entries(lay, routing, topk_idx, output_layout)
        idx32 = topk_idx.to(torch.int32).contiguous()
        src = x
        if self.stage_inputs and T:
            src = self._local("in_x", x.dtype, (T, H))
            src.copy_(x)
        counts_ready.synchronize()  # the one host wait, as DeepEP's normal mode
        raise_if_failed(self.mem, "dispatch.counts")
        counts = self._counts_host.clone()

        # 2. offsets and capacity; the tables travel to the GPU in one copy
        g = geometry(lay, me, counts.numpy(), output_layout, alignment)
        lay.check_capacity(g["totals"].tolist(), output_layout)
        rows = int(g["totals"][me])
        info = np.concatenate([g["send_off"], g["send_cnt"], g["dst_base"], g["recv_cnt"], g["recv_base"]])
        if output_layout == "rank":
            (info,) = self._upload_dispatch(info)
            out_pos = pad = None
            per_expert = torch.from_numpy(g["per_expert_me"].sum(0).astype(np.int32))
            offsets = None
            out_idx = torch.empty((rows, K), dtype=torch.int64, device=dev)
            out_w = torch.empty((rows, K), dtype=torch.float32, device=dev)
            out_meta = [torch.empty(rows, dtype=torch.int32, device=dev) for _ in range(3)]
        else:
            info, out_pos, pad = self._upload_dispatch(info, out_positions(g), padding_rows(g, rows))
            per_expert = torch.from_numpy(g["group"].astype(np.int32))
            offsets = torch.from_numpy(np.append(g["gstart"], rows).astype(np.int64))
            out_idx = torch.full((rows,), -1, dtype=torch.int64, device=dev)
            out_w = torch.zeros(rows, dtype=torch.float32, device=dev)
            out_meta = [torch.full((rows,), -1, dtype=torch.int32, device=dev) for _ in range(3)]
        out_x = torch.empty((rows, H), dtype=x.dtype, device=dev)

        # 3. rows. No host wait after the kernel: a timeout is raised by the next call (or
        # by check()), as the CUDA protocols do.
        ptrs = [src.data_ptr(), idx32.data_ptr(), topk_weights.data_ptr(), send_ent.data_ptr(), info.data_ptr(),
                out_pos.data_ptr() if out_pos is not None else 0, out_x.data_ptr(), out_idx.data_ptr(),
                out_w.data_ptr(), *(m.data_ptr() for m in out_meta), self.err.data_ptr()]
        ev = self._events(stream)
        self.ext.dispatch(base, self.args, me, self.channels, int(output_layout == "expert"), epoch,
                          self.timeout_ns, ptrs, stream.cuda_stream)
        if ev:
            ev[1].record(stream)
        if pad is not None and pad.numel():
            out_x.index_fill_(0, pad.long(), 0)
        if ev:
            self._sync_check(stream, "dispatch.data")
            self.kernel_ms["dispatch"] = ev[0].elapsed_time(ev[1])

        src_rank, src_token, src_slot = out_meta
        recv = RecvResult(out_x, out_idx, out_w, per_expert, src_rank, src_token, offsets)
        handle = DispatchHandle(
            output_layout=output_layout, num_tokens=T, topk_idx=topk_idx.long(), topk_weights=topk_weights.float(),
            is_token_in_rank=routing.is_token_in_rank, counts=counts, num_recv_rows=rows, recv_src_rank=src_rank,
            recv_src_token=src_token, recv_src_slot=src_slot, expert_offsets=offsets, buffer_id=self.buffer_id)
        return recv, handle

    def check(self, synchronize: bool = False) -> None:
        """Raise StallError if a device wait of an earlier call expired."""
        if synchronize:
            torch.cuda.current_stream(self.device).synchronize()
        raise_if_failed(self.mem, "barrier")

    # -- combine ---------------------------------------------------------------------------
    def combine(self, y, handle, recv_topk_weights):
        raise_if_failed(self.mem, "combine")
        lay, me = self.layout, self.me
        H, K, S = lay.hidden, lay.topk, lay.combine_slots
        dev = self.device
        stream = torch.cuda.current_stream(dev)
        base = self.mem.local.data_ptr()
        T = handle.num_tokens
        rows = handle.num_recv_rows
        expert = handle.output_layout == "expert"
        gstart = handle.expert_offsets[:-1].cpu().numpy() if expert else None  # a host tensor: no sync
        g = geometry(lay, me, handle.counts.numpy(), handle.output_layout, None, gstart)
        info = np.concatenate([g["recv_cnt"], g["recv_base"], g["send_cnt"]])
        info, out_pos = (self._upload_combine(info, out_positions(g)) if expert
                         else (*self._upload_combine(info), None))
        self_row = self_rows(handle, me, S)
        src, src_w = y, recv_topk_weights
        if self.stage_inputs and rows:
            src = self._local("recv_x", y.dtype, (rows, H))
            src.copy_(y)
            if recv_topk_weights is not None:
                src_w = self._local("recv_w", torch.float32, (rows, K))
                src_w.copy_(recv_topk_weights)
        out_x = torch.empty((T, H), dtype=y.dtype, device=dev)
        out_w = torch.empty((T, K), dtype=torch.float32, device=dev) if recv_topk_weights is not None else None
        if self._last_op == "combine" and self.W > 1:
            # Two combines in a row (e.g. a repeated combine on one handle): a peer may still be
            # reducing the previous one from the combine slots this one writes into. Between a
            # dispatch and a combine the counts exchange already orders them.
            self.mem.barrier_on_stream("combine.done")
        self._last_op = "combine"
        self._combines += 1
        ptrs = [src.data_ptr(), src_w.data_ptr() if src_w is not None else 0, info.data_ptr(),
                out_pos.data_ptr() if out_pos is not None else 0, handle.recv_src_token.data_ptr(),
                handle.recv_src_slot.data_ptr(), self_row.data_ptr(), handle.topk_idx.data_ptr(),
                handle.topk_weights.data_ptr(), out_x.data_ptr(), out_w.data_ptr() if out_w is not None else 0,
                self.err.data_ptr()]
        ev = self._events(stream)
        self.ext.combine(base, self.args, me, self.channels, int(expert), T, _ELEM_KIND[y.dtype], self._combines,
                         self.timeout_ns, ptrs, stream.cuda_stream)
        if ev:
            ev[1].record(stream)
            self._sync_check(stream, "combine.data")
            self.kernel_ms["combine"] = ev[0].elapsed_time(ev[1])
        return out_x, out_w


__all__ = ["NvshmemPush", "STAGES", "SPEC", "load_extension", "raise_if_failed", "StallError"]
