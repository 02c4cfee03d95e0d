"""nvshmem: the symmetric buffer on NVSHMEM's symmetric heap, through nvshmem4py (DeepEP V1).

The runtime is process-wide: the first Buffer initialises nvshmem4py from the job's torch
process group (rank 0's unique id travels with ``broadcast_object_list``), later Buffers of
the same group reuse it, and it is finalised once at interpreter exit (NVSHMEM cannot be
initialised twice in a process). Each Buffer allocates its own segment with
``nvshmem.core.interop.torch.bytetensor`` (collective) and frees it on ``close()``
(collective too: every rank must close its Buffers in the same order, as with DeepEP).

Peer bases come from ``nvshmem_ptr``: non-zero for peers reachable by load/store (NVLink
P2P, or the same GPU under MPS), 0 for peers only reachable through NVSHMEM puts (IBGDA).
Where every peer is mapped (one node) the shared CUDA kernels run over the heap, as over
torch's symmetric memory; otherwise the push on the NVSHMEM device API (``protocol.nvshmem``).
"""
from __future__ import annotations

import atexit
import os
import socket
import threading
from typing import Any

import torch
import torch.distributed as dist

from ..config import Config
from ..errors import BackendUnavailable, StallError
from ..memory import SymmetricMemory
from . import BackendSpec

# Push only, on the NVSHMEM device API; its receive pool is one ring per (source, channel).
BACKEND = BackendSpec("nvshmem", "NvshmemMemory", protocols=("push",), modelled_on="DeepEP V1 Buffer", channel_rings=True)


def _import_nvshmem() -> Any:
    import nvshmem.core  # noqa: F401  (nvshmem4py)
    import nvshmem.core.interop.torch  # noqa: F401
    return nvshmem


class _Runtime:
    """The process's one NVSHMEM runtime (nvshmem4py + this package's extension)."""

    lock = threading.Lock()
    state: "_Runtime | None" = None

    def __init__(self, rank: int, world: int, device: int, group_ranks: tuple[int, ...]):
        self.rank, self.world, self.device, self.group_ranks = rank, world, device, group_ranks
        self.ext: Any = None  # the kernels' module, registered lazily (protocol.nvshmem)
        self.live = 0  # open segments
        self.broken = False  # a wait timed out: peers may be gone, skip collective teardown

    @classmethod
    def get(cls, group: dist.ProcessGroup | None, nbytes: int) -> "_Runtime":
        rank = dist.get_rank(group) if dist.is_initialized() else 0
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        ranks = tuple(dist.get_process_group_ranks(group)) if (dist.is_initialized() and group is not None) \
            else tuple(range(world))
        with cls.lock:
            rt = cls.state
            if rt is not None:
                if rt.group_ranks != ranks:
                    raise BackendUnavailable(
                        f"nvshmem: this process already runs NVSHMEM over ranks {list(rt.group_ranks)}; a Buffer "
                        f"over ranks {list(ranks)} needs a new process (NVSHMEM is initialised once per process)")
                return rt
            # The heap must hold the segment (NVSHMEM's default is 1 GiB); an explicit
            # NVSHMEM_SYMMETRIC_SIZE in the environment wins.
            os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(max(1 << 30, int(nbytes * 1.25) + (256 << 20))))
            rt = cls._start(rank, world, group, ranks)
            cls.state = rt
            atexit.register(_finalize_at_exit)
            return rt

    @classmethod
    def _start(cls, rank: int, world: int, group: dist.ProcessGroup | None, ranks: tuple[int, ...]) -> "_Runtime":
        nvshmem = _import_nvshmem()
        from cuda.core import Device
        dev_index = torch.cuda.current_device()
        torch.cuda.init()
        dev = Device(dev_index)
        dev.set_current()
        if rank == 0:
            uid = nvshmem.core.get_unique_id()
        else:
            uid = nvshmem.core.get_unique_id(empty=True)
        if world > 1:
            box = [uid]
            dist.broadcast_object_list(box, src=ranks[0], group=group)
            uid = box[0]
        try:
            nvshmem.core.init(device=dev, uid=uid, rank=rank, nranks=world, initializer_method="uid")
        except Exception as e:  # noqa: BLE001 -- name the library's failure
            raise BackendUnavailable(f"nvshmem: nvshmem.core.init failed on rank {rank}/{world}: {e}") from None
        return cls(rank, world, dev_index, ranks)

    def extension(self) -> Any:
        """The kernels' module, with its device state registered (once per process)."""
        if self.ext is None:
            from ..protocol.nvshmem import load_extension
            ext = load_extension()
            ext.init()
            pes = ext.device_pes()
            if list(pes) != [self.rank, self.world]:
                raise BackendUnavailable(f"nvshmem: the extension's device state says PE {pes[0]} of {pes[1]}, "
                                         f"expected {self.rank} of {self.world}")
            self.ext = ext
        return self.ext

    def finalize(self) -> None:
        nvshmem = _import_nvshmem()
        if self.ext is not None:
            self.ext.finalize()  # the module's reference, before the library's
            self.ext = None
        nvshmem.core.finalize()


def _finalize_at_exit() -> None:
    rt = _Runtime.state
    if rt is None:
        return
    _Runtime.state = None
    if rt.broken or rt.live:
        # A peer may be gone (stall) or segments are still open: NVSHMEM's finalize is
        # collective and would wait forever. The OS reclaims the memory at exit.
        return
    try:
        torch.cuda.synchronize()
        rt.finalize()
    except Exception:  # noqa: BLE001 -- never raise at interpreter exit
        pass


def puts_forced() -> bool:
    """``SYMMOE_NVSHMEM_STAGE=1``: the put path, combine's staging included, for every peer (the
    path of a multi-node job, on one node; the heap is then sized for the staging too)."""
    return os.environ.get("SYMMOE_NVSHMEM_STAGE") == "1"


def put_protocol_forced() -> bool:
    """``SYMMOE_NVSHMEM_PUTS=1`` (or ``SYMMOE_NVSHMEM_STAGE=1``): the push on the NVSHMEM device
    API even where every peer is mapped, as a multi-node job runs it (mapped peers by stores,
    the others by puts); otherwise a node's ranks run the shared CUDA kernels."""
    return os.environ.get("SYMMOE_NVSHMEM_PUTS") == "1" or puts_forced()


class NvshmemMemory(SymmetricMemory):
    name = "nvshmem"
    load_store_peers = True
    remote_put = True
    tma_pull = False
    signal_puts = True

    @classmethod
    def describe_transports(cls) -> str:
        """For ``symmoe info``: how each class of peer is reached."""
        return ("peers nvshmem_ptr maps (NVLink P2P, or the same GPU under MPS): vector stores, then NVSHMEM "
                "signals; the others: NVSHMEM puts from symmetric staging copies + signals (IBGDA)")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            _import_nvshmem()
        except ImportError as e:
            return f"nvshmem4py is not importable ({e}); install nvshmem4py-cu13 (pip install 'symmoe[nvshmem]')"
        except Exception as e:  # noqa: BLE001 -- e.g. a cuda-core / library version clash
            return f"nvshmem4py failed to import: {type(e).__name__}: {e}"
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return "no CUDA GPU visible to torch"
        major, _ = torch.cuda.get_device_capability()
        if major < 7:
            return f"GPU compute capability {major}.x; NVSHMEM needs 7.0 or newer"
        return None

    def __init__(self, group: dist.ProcessGroup | None, nbytes: int, config: Config):
        super().__init__(group, nbytes)
        self.timeout_s = config.kernel.timeout_s
        self._tensor: torch.Tensor | None = None
        self._bases: torch.Tensor | None = None
        self._epoch = 0
        self._layout_args: list[int] | None = None
        self._flags_offset = 0
        self._err: torch.Tensor | None = None
        self._extra: list[torch.Tensor] = []  # more symmetric tensors (staging), freed before the segment
        # The heap also holds combine's staging when some peer is on another host (puts only).
        stage = 0
        spans_hosts = len(set(self.all_gather(socket.gethostname()))) > 1
        if spans_hosts or puts_forced():
            stage = config.layout(self.world_size).stage_bytes
        self.runtime = _Runtime.get(group, nbytes + stage)
        nvshmem = _import_nvshmem()
        try:
            self._tensor = nvshmem.core.interop.torch.bytetensor((nbytes,), dtype=torch.uint8, except_on_del=False)
        except Exception as e:  # noqa: BLE001
            raise BackendUnavailable(f"nvshmem: cannot allocate {nbytes} bytes of symmetric memory on rank "
                                     f"{self.rank}: {e} (raise NVSHMEM_SYMMETRIC_SIZE?)") from None
        self.runtime.live += 1
        # Signals and counters must start at 0 on every rank before any peer writes them.
        self._tensor.zero_()
        torch.cuda.synchronize()
        if self.world_size > 1:
            dist.barrier(group=group)
        from nvshmem import bindings
        base = self._tensor.data_ptr()
        bases = [int(bindings.ptr(base, p)) if p != self.rank else base for p in range(self.world_size)]
        self._bases = torch.tensor(bases, dtype=torch.int64, device=self._tensor.device)
        self._host_bases = bases

    # -- SymmetricMemory -----------------------------------------------------------------
    @property
    def local(self) -> torch.Tensor:
        if self._tensor is None:
            raise RuntimeError("nvshmem: memory is closed")
        return self._tensor

    @property
    def peer_bases(self) -> torch.Tensor:
        return self._bases

    @property
    def all_peers_mapped(self) -> bool:
        return all(b != 0 for b in self._host_bases)

    @property
    def maps_every_peer(self) -> bool:
        # Same answer on every rank: one node maps every peer, several map none of the others'.
        return self.all_peers_mapped and not put_protocol_forced()

    def peer(self, rank: int) -> torch.Tensor:
        if rank == self.rank:
            return self.local
        if self._host_bases[rank] == 0:
            raise NotImplementedError(f"nvshmem: rank {rank} is not reachable by load/store from rank {self.rank}")
        nvshmem = _import_nvshmem()
        return nvshmem.core.interop.torch.get_peer_tensor(self.local, rank)

    def symmetric_bytes(self, nbytes: int) -> torch.Tensor:
        """Another symmetric allocation of ``nbytes`` beside the segment, freed with it
        (collective: every rank allocates the same size, in the same order)."""
        nvshmem = _import_nvshmem()
        try:
            t = nvshmem.core.interop.torch.bytetensor((nbytes,), dtype=torch.uint8, except_on_del=False)
        except Exception as e:  # noqa: BLE001
            raise BackendUnavailable(
                f"nvshmem: cannot allocate {nbytes} more bytes of symmetric memory on rank {self.rank}: {e} "
                f"(NVSHMEM_SYMMETRIC_SIZE must hold them beside the {self.local.numel()}-byte segment; the heap is "
                "sized for them only when the ranks span hosts)") from None
        self._extra.append(t)
        return t

    def error_word(self) -> torch.Tensor:
        """Host-mapped [stage, peer, epoch, detail] int64 record the kernels write on a timeout."""
        if self._err is None:
            self._err = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        return self._err

    def use_layout(self, layout_args: list[int], flags_offset: int) -> None:
        """The protocol tells the barrier where the flags are (``BufferLayout.kernel_args()``)."""
        self._layout_args = list(layout_args)
        self._flags_offset = flags_offset

    def barrier(self, stage: str = "barrier", flags_offset: int | None = None) -> None:
        """Device flag barrier through the segment (signals + timeout); before the protocol
        has set the layout, the process group's barrier."""
        if self.world_size == 1:
            torch.cuda.synchronize(self.device)
            return
        if self._layout_args is None:
            dist.barrier(group=self.group)
            return
        from ..protocol.nvshmem import raise_if_failed
        self.barrier_on_stream("barrier")
        torch.cuda.current_stream(self.device).synchronize()
        raise_if_failed(self, stage)

    def barrier_on_stream(self, stage: str) -> None:
        """The same device barrier, queued on the current stream without a host wait; a
        timeout is recorded under ``stage`` (a name of ``protocol.nvshmem.STAGES``) and raised
        by the next call that checks the error word."""
        from ..protocol.nvshmem import STAGES
        ext = self.runtime.extension()
        self._epoch += 1
        ext.barrier(self.local.data_ptr(), self._layout_args, self.rank, self._epoch, int(self.timeout_s * 1e9),
                    self.error_word().data_ptr(), STAGES[stage], torch.cuda.current_stream(self.device).cuda_stream)

    def mark_broken(self) -> None:
        self.runtime.broken = True

    def _release(self) -> None:
        t, self._tensor = self._tensor, None
        extra, self._extra = self._extra, []
        self._bases = None
        if t is None:
            return
        rt = self.runtime
        rt.live -= 1
        if rt.broken:
            return  # a peer may never reach the collective free; the process exit reclaims it
        try:
            torch.cuda.synchronize(t.device)
            nvshmem = _import_nvshmem()
            for e in reversed(extra):
                nvshmem.core.interop.torch.free_tensor(e)
            nvshmem.core.interop.torch.free_tensor(t)
        except Exception as e:  # noqa: BLE001
            raise BackendUnavailable(f"nvshmem: freeing the symmetric segment failed on rank {self.rank}: {e}") \
                from None


def stall(mem: NvshmemMemory, stage: str, peer: int, epoch: int) -> StallError:
    mem.mark_broken()
    from ..protocol.base import stall_detail
    return StallError(mem.rank, stage, mem.timeout_s, stall_detail(stage, peer, epoch))


__all__ = ["NvshmemMemory", "stall"]
