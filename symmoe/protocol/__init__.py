"""Protocols: the algorithms that move rows over a SymmetricMemory.

``host`` memory runs the plain-torch flow in ``host.py``; ``nvshmem`` memory its own push
kernels on the NVSHMEM device API (``nvshmem.py``); ``torch`` and ``nccl`` memory the shared
CUDA kernels over load/store peer pointers (``cuda.py``). Push or pull comes from the config.
"""
from __future__ import annotations

from ..config import Config
from ..layout import BufferLayout
from ..memory import SymmetricMemory
from .base import Protocol


def make(mem: SymmetricMemory, layout: BufferLayout, config: Config, buffer_id: int) -> Protocol:
    proto = config.effective_protocol
    if mem.name == "host":
        from .host import HostPull, HostPush
        cls = HostPush if proto == "push" else HostPull
    elif mem.name == "nvshmem":
        from .nvshmem import NvshmemPush  # push on the NVSHMEM device API (puts + signals)
        cls = NvshmemPush
    else:
        from .cuda import CudaPull, CudaPush
        cls = CudaPush if proto == "push" else CudaPull
    return cls(mem, layout, config, buffer_id)


__all__ = ["Protocol", "make"]
