"""Protocols: the algorithms that move rows over a SymmetricMemory.

``make`` chooses by what the memory can do, never by the backend's name: memory on the host
runs the plain-torch flow in ``host.py``; GPU memory whose peers are all reached by load/store
runs the shared CUDA kernels (``cuda.py``); GPU memory that reaches some peers only by puts
with signals runs the push on the NVSHMEM device API (``nvshmem.py``). Push or pull comes
from the config.
"""
from __future__ import annotations

from ..config import Config
from ..errors import InputError
from ..layout import BufferLayout
from ..memory import SymmetricMemory
from .base import Protocol


def make(mem: SymmetricMemory, layout: BufferLayout, config: Config, buffer_id: int) -> Protocol:
    return choose(mem, config.effective_protocol)(mem, layout, config, buffer_id)


def choose(mem: SymmetricMemory, proto: str) -> type[Protocol]:
    """The protocol class for ``mem`` and ``proto`` ('push' or 'pull'); collective (every rank
    chooses the same)."""
    if mem.device.type != "cuda":
        from .host import HostPull, HostPush
        return HostPush if proto == "push" else HostPull
    if _maps_every_peer(mem):
        from .cuda import CudaPull, CudaPush
        return CudaPush if proto == "push" else CudaPull
    if mem.signal_puts:
        from .nvshmem import NvshmemPush  # puts + signals on the NVSHMEM device API
        return NvshmemPush
    raise InputError(f"backend '{mem.name}' cannot reach every peer by load/store, and symmoe has no put "
                     "protocol for it; keep the group inside one load/store domain")


def _maps_every_peer(mem: SymmetricMemory) -> bool:
    """Whether every rank reaches every peer by load/store; collective where the answer could
    differ (memories that can also put), so all ranks choose the same protocol."""
    if not mem.signal_puts or mem.world_size == 1:
        return mem.maps_every_peer
    return all(mem.all_gather(mem.maps_every_peer))


__all__ = ["Protocol", "choose", "make"]
