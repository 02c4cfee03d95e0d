"""Registry of symmetric-memory backends, keyed by their YAML names.

Each backend module is imported only when used, so a missing library disables only that
backend; ``probe(name)`` says whether it can run here, and if not, precisely why.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..config import PROTOCOLS
from ..errors import BackendUnavailable

if TYPE_CHECKING:
    import torch.distributed as dist
    from ..config import Config
    from ..memory import SymmetricMemory


@dataclass(frozen=True)
class BackendInfo:
    name: str
    module: str  # symmoe.backends.<module>
    cls: str
    modelled_on: str

    @property
    def protocols(self) -> tuple[str, ...]:
        return PROTOCOLS[self.name]

    def load(self) -> type["SymmetricMemory"]:
        mod = importlib.import_module(f"{__name__}.{self.module}")
        return getattr(mod, self.cls)


BACKENDS: dict[str, BackendInfo] = {
    "host": BackendInfo("host", "host", "HostMemory", "none (CPU processes, POSIX shared memory)"),
    "torch": BackendInfo("torch", "torch_symm", "TorchSymmMemory", "DeepGEMM Mega MoE SymmBuffer"),
    "nvshmem": BackendInfo("nvshmem", "nvshmem", "NvshmemMemory", "DeepEP V1 Buffer"),
    "nccl": BackendInfo("nccl", "nccl", "NcclMemory", "DeepEP V2 ElasticBuffer"),
}


def probe(name: str) -> tuple[bool, str]:
    """(usable, reason): the reason names what is missing when it is not usable."""
    try:
        cls = BACKENDS[name].load()
    except ImportError as e:
        return False, f"cannot import its module: {e}"
    check: Callable[[], str | None] = getattr(cls, "unavailable_reason")
    reason = check()
    return (reason is None), (reason or "usable")


def create(config: "Config", group: "dist.ProcessGroup | None", nbytes: int) -> "SymmetricMemory":
    if config.backend not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {config.backend!r}; known: {', '.join(BACKENDS)}")
    ok, reason = probe(config.backend)
    if not ok:
        raise BackendUnavailable(f"backend '{config.backend}' is not usable here: {reason}")
    return BACKENDS[config.backend].load().allocate(config, group, nbytes)
