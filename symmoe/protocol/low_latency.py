"""The low-latency mode's two engines over one layout (``symmoe.low_latency``).

dispatch
  send: for each expert ``e`` (rank ``e // L``, local id ``j``), the source writes the rows of
    its tokens routed to ``e``, in token order, into slot region ``(j, source)`` of the expert's
    rank (``dx``, ``dmeta = t * K + k``), then stores ``(seq << 32) | rows`` into that rank's
    ``dflag[j, source]``.
  receive (the hook): for each local expert, wait until every source's flag carries this
    call's ``seq``, then pack the regions in source order into ``recv_x[j]``.
combine
  send: the expert's rank stores each row ``y[j, q]`` into its source's ``cx[t, k]``; once all
    of them are stored, ``seq`` into every source's ``cflag[rank]`` (rows or not).
  receive (the hook): wait for all ``W`` flags, then reduce ``sum_k w[t, k] * cx[t, k']`` in
    fp32 in ascending ``k`` (``k'``: the first slot of t with that expert) and cast once.

The sequence numbers count calls on each rank (every rank makes every call): the CUDA engine
keeps them on the device, the send kernel's last block advancing them, so no host epoch is
passed and a captured CUDA graph replays correctly. Parity ``seq & 1`` picks the half of each
region: a sender is at most one call ahead of a receiver still unpacking.
"""
from __future__ import annotations

import ctypes
from typing import Callable

import torch

from .. import build, fp8
from ..config import Config
from ..errors import CapacityError, InputError, StallError
from ..low_latency import LowLatencyHandle, LowLatencyLayout
from ..memory import SymmetricMemory
from ..launch_shape import gpu_sms, low_latency_blocks
from .base import stream_handle

Hook = Callable[[], None]


class _Engine:
    def __init__(self, mem: SymmetricMemory, lay: LowLatencyLayout, timeout_s: float):
        self.mem, self.lay, self.timeout_s = mem, lay, timeout_s
        self.rank, self.world_size = mem.rank, mem.world_size
        self.device = mem.device
        self._pending: str | None = None  # the call whose receive hook has not run yet

    def _begin(self, call: str) -> None:
        self.check()
        if self._pending is not None:
            raise InputError(f"{call}: the receive hook of the previous {self._pending} has not been called; call "
                             "it first (each rank receives a call before it sends the next)")

    def _hook(self, call: str, receive: Callable[[], None], deferred: bool) -> Hook | None:
        if not deferred:
            receive()
            return None
        self._pending = call
        done = [False]

        def hook() -> None:
            if done[0]:
                raise InputError(f"the receive hook of this {call} was already called")
            done[0] = True
            self._pending = None
            receive()
        return hook

    def check(self, synchronize: bool = False) -> None:
        """Raise what an earlier call's device waits recorded (GPU); nothing on the host."""

    def _outputs(self, hidden: int) -> tuple[torch.Tensor, ...]:
        """(recv_x, count, src_info, src_slot, layout_range): one allocation each. On a GPU
        machine's host a tensor carved from another (a split piece, a view) costs about as much
        as an allocation, 3-6 µs: five tensors from two allocations were ten."""
        lay, dev = self.lay, self.device
        L, W, rows = lay.local_experts, lay.world_size, lay.world_size * lay.max_tokens
        return (torch.empty((L, rows, hidden), dtype=torch.bfloat16, device=dev),
                torch.empty(L, dtype=torch.int32, device=dev),
                torch.empty((L, rows), dtype=torch.int32, device=dev),
                torch.empty((L, rows), dtype=torch.int32, device=dev),
                torch.empty((L, W), dtype=torch.int64, device=dev))

    def shapes(self) -> dict[str, int]:
        """The kernels' launch shapes (blocks, threads, work split); empty on the host."""
        return {}

    def fp8_rows(self, x: torch.Tensor, round_scale: bool) -> torch.Tensor:
        """use_fp8's rows: ``x`` bfloat16 [T, H] -> [T, H] rows whose first bytes hold the e4m3
        data and float32 scales (``fp8.quantize`` + ``fp8.pack``)."""
        data, scales = fp8.quantize(x, "float32", round_scale)
        return fp8.pack(data, scales, torch.empty_like(x))

    def close(self) -> None:
        pass


class HostLowLatency(_Engine):
    """The same flow in torch over the host backend's shared memory; the receive waits at a
    host barrier instead of spinning on the flags, then checks them."""

    def __init__(self, mem: SymmetricMemory, lay: LowLatencyLayout, timeout_s: float):
        super().__init__(mem, lay, timeout_s)
        self._seq = {"dispatch": 0, "combine": 0}
        off, lay_ = lay.offsets(), lay
        W, L, T, H, K = lay_.world_size, lay_.local_experts, lay_.max_tokens, lay_.hidden, lay_.topk
        self._shapes = {"dflag": (torch.int64, (L, W)), "cflag": (torch.int64, (W,)),
                        "dmeta": (torch.int32, (L, W, T)), "dx": (torch.bfloat16, (L, W, T, H)),
                        "cx": (torch.bfloat16, (T, K, H))}
        self._off = off
        self._par = {n: (s + 255) // 256 * 256 for n, s in lay.parity_bytes().items()}

    def _region(self, name: str, parity: int, rank: int | None = None) -> torch.Tensor:
        dtype, shape = self._shapes[name]
        return self.mem.view(self._off[name] + parity * self._par[name], dtype, shape, rank)

    def _barrier(self, stage: str) -> None:
        self.mem.barrier(stage, flags_offset=self._off["barrier"])

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, deferred: bool, row_bytes: int = 0):
        """Whole rows move whatever ``row_bytes`` says (it only saves bandwidth on the GPU)."""
        self._begin("low_latency_dispatch")
        lay, me = self.lay, self.rank
        W, L, T_max = lay.world_size, lay.local_experts, lay.max_tokens
        seq = self._seq["dispatch"] = self._seq["dispatch"] + 1
        p = seq & 1
        T, K = topk_idx.shape
        idx = topk_idx.long()
        idx = torch.where((idx >= 0) & (idx < lay.num_experts), idx, torch.full_like(idx, -1))
        # One row per (token, distinct expert), at the expert's first slot in the token's row.
        first = torch.ones_like(idx, dtype=torch.bool)
        for k in range(1, K):
            first[:, k] = (idx[:, :k] != idx[:, k:k + 1]).all(1)
        t, k = ((idx >= 0) & first).nonzero(as_tuple=True)
        e = idx[t, k]
        order = torch.argsort(e * max(T, 1) + t)  # by expert, then token
        t, k, e = t[order], k[order], e[order]
        per_e = torch.bincount(e, minlength=lay.num_experts)
        pos = torch.arange(e.numel()) - (per_e.cumsum(0) - per_e)[e]
        for dst in range(W):
            sel = (e // L) == dst
            j = e[sel] % L
            self._region("dx", p, dst)[j, me, pos[sel]] = x[t[sel]]
            self._region("dmeta", p, dst)[j, me, pos[sel]] = (t[sel] * K + k[sel]).to(torch.int32)
            self._region("dflag", p, dst)[:, me] = (seq << 32) | per_e[dst * L:(dst + 1) * L]
        recv_x, count, info, slot, rng = self._outputs(x.shape[1])
        handle = LowLatencyHandle(info, rng, T_max, x.shape[1], lay.num_experts, slot, T, K, id(self))

        def receive() -> None:
            self._barrier("low_latency_dispatch.receive")
            flags = self._region("dflag", p).clone()
            late = ((flags >> 32) != seq).nonzero()
            if late.numel():
                raise StallError(me, "low_latency_dispatch.receive", self.timeout_s,
                                 f"rank {int(late[0, 1])}'s rows of call {seq} never arrived")
            cnt = flags & 0xFFFFFFFF
            begin = cnt.cumsum(1) - cnt
            rng.copy_((begin << 32) | cnt)
            count.copy_(cnt.sum(1).to(torch.int32))
            dx, meta = self._region("dx", p), self._region("dmeta", p)
            for j in range(L):
                for s in range(W):
                    b, c = int(begin[j, s]), int(cnt[j, s])
                    recv_x[j, b:b + c] = dx[j, s, :c]
                    info[j, b:b + c] = meta[j, s, :c] // K
                    slot[j, b:b + c] = meta[j, s, :c] % K
        return recv_x, count, handle, self._hook("low_latency_dispatch", receive, deferred)

    def combine(self, y: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle: LowLatencyHandle,
                out: torch.Tensor | None, deferred: bool):
        self._begin("low_latency_combine")
        lay, me = self.lay, self.rank
        W, L = lay.world_size, lay.local_experts
        seq = self._seq["combine"] = self._seq["combine"] + 1
        p = seq & 1
        rng = handle.layout_range
        begin, cnt = rng >> 32, rng & 0xFFFFFFFF
        for s in range(W):
            cx = self._region("cx", p, s)
            for j in range(L):
                b, c = int(begin[j, s]), int(cnt[j, s])
                cx[handle.src_info[j, b:b + c].long(), handle.src_slot[j, b:b + c].long()] = y[j, b:b + c]
            self._region("cflag", p, s)[me] = seq
        T, K = topk_idx.shape
        result = out if out is not None else torch.empty((T, lay.hidden), dtype=torch.bfloat16, device=self.device)

        def receive() -> None:
            self._barrier("low_latency_combine.receive")
            late = (self._region("cflag", p) != seq).nonzero().flatten()
            if late.numel():
                raise StallError(me, "low_latency_combine.receive", self.timeout_s,
                                 f"rank {int(late[0])}'s rows of call {seq} never came back")
            result.copy_(_reduce(self._region("cx", p)[:T], topk_idx, topk_weights, lay.num_experts))
        return result, self._hook("low_latency_combine", receive, deferred)

    def clean(self) -> None:
        self._barrier("clean_low_latency_buffer")
        self.mem.local[self._off["dflag"]:].zero_()
        self._seq = {"dispatch": 0, "combine": 0}
        self._barrier("clean_low_latency_buffer")


def _reduce(cx: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``cx [T, K, H]`` reduced as the combine kernel does (a repeated expert reads its first slot)."""
    T, K = topk_idx.shape
    idx = topk_idx.long()
    acc = torch.zeros((T, cx.shape[-1]), dtype=torch.float32)
    for k in range(K):
        valid = (idx[:, k] >= 0) & (idx[:, k] < num_experts)
        src = torch.full((T,), k, dtype=torch.long)
        for k2 in range(k - 1, -1, -1):
            src = torch.where(idx[:, k2] == idx[:, k], torch.full_like(src, k2), src)
        t = valid.nonzero().flatten()
        acc[t] = acc[t] + topk_weights[t, k].float().unsqueeze(1) * cx[t, src[t]].float()
    return acc.to(torch.bfloat16)


class CudaLowLatency(_Engine):
    """The kernels of csrc/kernels/low_latency.cuh over load/store peers (torch symmetric memory,
    nvshmem on one node): a send kernel and a receive kernel per call; the receive kernel is
    the hook."""

    STAGE_NAMES = {101: "low_latency_dispatch.receive", 102: "low_latency_combine.receive"}
    BAD_EXPERT = 103

    def __init__(self, mem: SymmetricMemory, lay: LowLatencyLayout, timeout_s: float, blocks: int):
        """``blocks``: blocks of every kernel (``launch_shape.low_latency_blocks``)."""
        super().__init__(mem, lay, timeout_s)
        if not mem.maps_every_peer:
            raise InputError(f"low-latency mode: backend '{mem.name}' does not reach every peer by load/store, "
                             "which its kernels need (keep the group inside one NVLink domain)")
        self.mod = build.load("symmoe_ll")
        self._host = build.load("symmoe_host")  # the outputs (_outputs)
        self._err = self.mod.host_alloc_mapped(64)
        self._err_dev = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._state = torch.zeros(8, dtype=torch.int32, device=self.device)  # seqs and grid tickets
        self._err_rec = (ctypes.c_int64 * 4).from_address(self._err[0])
        self._bad_rec = (ctypes.c_int64 * 4).from_address(self._err[0] + 32)  # bad expert ids, beside it
        try:
            self.ll = self.mod.LowLatency(lay.kernel_geometry(self.rank), mem.local.data_ptr(),
                                          mem.peer_bases.data_ptr(), self._state.data_ptr(), self._err_dev.data_ptr(),
                                          self._err[1], float(timeout_s), blocks)
        except ValueError as e:  # the kernels' limits (shared memory for T_max), named by the module
            self.mod.host_free(self._err[0])
            raise CapacityError(f"low_latency_dispatch: {e}") from None
        self._closed = False

    def shapes(self) -> dict[str, int]:
        return dict(self.ll.shapes())

    def set_stamps(self, stamps: torch.Tensor | None) -> None:
        """Phase stamps of the kernels launched after this call (None: off): ``stamps`` int64
        ``[4, 3]`` on this device, per kernel (dispatch send, dispatch receive, combine send,
        combine receive) the global-timer ns of the first block's start, of the last block
        done waiting (receive kernels) and of the last block's end. Reset it before each
        measured call: -1 in the start column, 0 in the others. Eager calls only (a graph
        captured while stamps were on keeps the pointer)."""
        if stamps is not None and (stamps.dtype != torch.int64 or stamps.numel() != 12 or not stamps.is_contiguous()
                                   or stamps.device != self.device):
            raise InputError(f"set_stamps: expected a contiguous int64 tensor of 12 values on {self.device}")
        self._stamps = stamps
        self.ll.set_stamps(stamps.data_ptr() if stamps is not None else 0)

    def check(self, synchronize: bool = False) -> None:
        if synchronize:
            torch.cuda.current_stream(self.device).synchronize()
        bad = self._bad_rec
        if bad[0]:
            token, value = int(bad[1]), int(bad[2])
            bad[0] = 0  # raised once
            raise InputError(f"low_latency_dispatch: topk_idx held {value} at token {token} of an earlier call; "
                             f"expert ids must be -1 or in [0, {self.lay.num_experts}) (that slot was treated as -1)")
        word = self._err_rec
        if not word[0]:
            return
        stage, peer, value = int(word[0]), int(word[1]), int(word[2])
        name = self.STAGE_NAMES.get(stage, f"stage {stage}")
        what = (f"rank {peer}'s rows of call {value} never arrived" if stage == 101
                else f"rank {peer}'s rows of call {value} never came back")
        self.mem.mark_broken()
        raise StallError(self.rank, name, self.timeout_s, f"{what}; this Buffer's low-latency mode is unusable now")

    def _outputs(self, hidden: int) -> tuple[torch.Tensor, ...]:
        """As the host's, made in one call of the C++ host module (csrc/host/tensors.cpp): from
        Python the five allocations took 26 µs of a dispatch's host time on a GPU machine."""
        lay = self.lay
        return self._host.low_latency_outputs(lay.local_experts, lay.world_size * lay.max_tokens, hidden,
                                              lay.world_size, self.device)

    def fp8_rows(self, x: torch.Tensor, round_scale: bool) -> torch.Tensor:
        """As the host's, in one kernel (kernels/fp8_pack.cuh) rather than a dozen torch ops."""
        out = torch.empty_like(x)
        self.mod.fp8_pack(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], round_scale, stream_handle(self.device))
        return out

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, deferred: bool, row_bytes: int = 0):
        """``row_bytes`` > 0: only the first ``row_bytes`` of each row move (FP8 rows)."""
        self._begin("low_latency_dispatch")
        lay = self.lay
        T, K = topk_idx.shape
        if K != lay.topk:
            raise InputError(f"low_latency_dispatch: topk={K}; this buffer was sized for topk={lay.topk}")
        stream = stream_handle(self.device)
        self.ll.dispatch_send(x.data_ptr(), topk_idx.data_ptr(), T, stream, row_bytes)
        recv_x, count, info, slot, rng = self._outputs(x.shape[1])

        def receive() -> None:
            self.ll.dispatch_recv(recv_x.data_ptr(), count.data_ptr(), info.data_ptr(), slot.data_ptr(),
                                  rng.data_ptr(), stream_handle(self.device), row_bytes)
        hook = self._hook("low_latency_dispatch", receive, deferred)  # without hooks: the receive launches here
        handle = LowLatencyHandle(info, rng, lay.max_tokens, x.shape[1], lay.num_experts, slot, T, K, id(self))
        return recv_x, count, handle, hook

    def combine(self, y: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle: LowLatencyHandle,
                out: torch.Tensor | None, deferred: bool):
        self._begin("low_latency_combine")
        T = topk_idx.shape[0]
        self.ll.combine_send(y.data_ptr(), handle.src_info.data_ptr(), handle.src_slot.data_ptr(),
                             handle.layout_range.data_ptr(), stream_handle(self.device))
        result = out if out is not None else torch.empty((T, self.lay.hidden), dtype=torch.bfloat16,
                                                         device=self.device)

        def receive() -> None:
            self.ll.combine_recv(topk_idx.data_ptr(), topk_weights.data_ptr(), T, result.data_ptr(),
                                 stream_handle(self.device))
        return result, self._hook("low_latency_combine", receive, deferred)

    def clean(self) -> None:
        torch.cuda.synchronize(self.device)
        self.mem.barrier("clean_low_latency_buffer", flags_offset=self.lay.offsets()["barrier"])
        self.mem.local[self.lay.offsets()["dflag"]:].zero_()
        self._state.zero_()
        torch.cuda.synchronize(self.device)
        self.mem.barrier("clean_low_latency_buffer", flags_offset=self.lay.offsets()["barrier"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            torch.cuda.synchronize(self.device)
            self.mod.host_free(self._err[0])
        except Exception:
            pass


def make_engine(mem: SymmetricMemory, lay: LowLatencyLayout, config: Config) -> _Engine:
    """The engine for ``mem``: torch on the host, the CUDA kernels where every peer is mapped
    (collective on a GPU: the ranks compare their GPUs for the launch shape)."""
    if mem.device.type != "cuda":
        return HostLowLatency(mem, lay, config.kernel.timeout_s)
    from . import _maps_every_peer
    if not _maps_every_peer(mem):
        raise InputError(f"low-latency mode: backend '{mem.name}' does not map every peer for load/store (peers "
                         "across nodes); its kernels store rows straight into the peers' buffers, so keep the "
                         "group inside one NVLink domain")
    from .cuda import _gpu_sharing
    gpu = gpu_sms(mem.device)
    share, _ = _gpu_sharing(mem, gpu)
    return CudaLowLatency(mem, lay, config.kernel.timeout_s, low_latency_blocks(config.low_latency.num_sms, gpu, share))
