"""SymmetricMemory: the one seam between the algorithms and the backends.

A backend allocates one segment of ``nbytes`` per rank, identical in size and layout on
every rank, and says how peers can reach it:

* ``load_store_peers``: ``peer_bases[r]`` is an address this rank's kernels can load
  from and store to (NVLink/P2P mapping, or the host's shared memory for ``host``);
* ``remote_put``: the backend's device library can put into peers it cannot map
  (NVSHMEM IBGDA, NCCL GIN);
* ``tma_pull``: peers' memory can be the source of TMA bulk copies;
* ``signal_puts``: the device library puts rows with signals into peers it cannot map, and
  symmoe's put protocol runs on it (NVSHMEM).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from .config import Config


class SymmetricMemory(ABC):
    name: ClassVar[str]
    load_store_peers: ClassVar[bool] = True
    remote_put: ClassVar[bool] = False
    tma_pull: ClassVar[bool] = False
    signal_puts: ClassVar[bool] = False

    def __init__(self, group: dist.ProcessGroup | None, nbytes: int):
        self.group = group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.nbytes = nbytes
        self._closed = False

    # -- what every backend provides -----------------------------------------------------
    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can run here, else what is missing (for ``symmoe info``)."""

    @classmethod
    def allocate(cls, config: "Config", group: dist.ProcessGroup | None, nbytes: int) -> "SymmetricMemory":
        """Collective over ``group``: every rank allocates its segment and maps its peers'.
        Backends construct as ``cls(group, nbytes, config)``; one that must check more after
        allocating (nccl: its transports) overrides this."""
        return cls(group, nbytes, config)  # type: ignore[call-arg]

    @property
    @abstractmethod
    def local(self) -> torch.Tensor:
        """uint8 tensor over this rank's segment."""

    @property
    @abstractmethod
    def peer_bases(self) -> torch.Tensor:
        """int64 tensor, one base address per rank (this rank's own included), on the
        segment's device; 0 for a peer that cannot be reached by load/store."""

    def peer(self, rank: int) -> torch.Tensor:
        """uint8 tensor over ``rank``'s segment, where load/store reaches it."""
        raise NotImplementedError(f"backend '{self.name}' gives no tensor view of peer segments")

    @abstractmethod
    def barrier(self, stage: str = "barrier", flags_offset: int = 0) -> None:
        """All ranks reach this point; raises StallError naming ``stage`` on timeout. The
        barrier may use ``W`` int64 flags at ``flags_offset`` of the segment (the layout's
        ``barrier`` sub-region); backends with a barrier of their own ignore it."""

    @abstractmethod
    def _release(self) -> None:
        """Free the segment and the library state the backend set up."""

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def maps_every_peer(self) -> bool:
        """Every peer is reached by load/store (``peer_bases`` holds no 0), so the shared CUDA
        kernels need no put transport (``protocol.make``)."""
        return self.load_store_peers

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank of the group, by rank (collective; alone: ``[obj]``)."""
        if self.world_size == 1:
            return [obj]
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, obj, group=self.group)
        return every

    def mark_broken(self) -> None:
        """A device wait expired: peers may be gone, so teardown must not wait for them
        (backends whose free is collective skip it; the process exit reclaims the memory)."""

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def __enter__(self) -> "SymmetricMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...], rank: int | None = None) -> torch.Tensor:
        """A typed tensor over ``[offset, offset + bytes)`` of the local (or a peer's) segment."""
        seg = self.local if rank is None or rank == self.rank else self.peer(rank)
        n = dtype.itemsize
        count = 1
        for s in shape:
            count *= s
        return seg[offset: offset + count * n].view(dtype).view(shape)
