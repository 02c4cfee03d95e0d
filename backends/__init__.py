"""Registry of symmetric-memory backends, keyed by their YAML names.

Each backend module declares itself in ``BACKEND`` (a :class:`BackendSpec`): the protocols it
runs and the sizes its buffer needs. The config validates against that declaration and sizes
the buffer from it, so it holds no backend knowledge of its own. A backend module imports its
library only when it allocates, so every declaration can be read on any machine (a config is
checked where the library is missing); ``probe(name)`` says whether the backend can run here,
and if not, precisely why.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import BackendUnavailable
from ..layout import STREAM_CHANNELS

if TYPE_CHECKING:
    import torch.distributed as dist
    from ..config import Config
    from ..memory import SymmetricMemory

# YAML name -> module (symmoe.backends.<module>): the one table of backends.
MODULES: dict[str, str] = {"host": "host", "torch": "torch_symm", "nvshmem": "nvshmem", "nccl": "nccl"}


@dataclass(frozen=True)
class BackendSpec:
    """What a backend declares about itself (``BACKEND`` in its module)."""

    name: str  # its YAML name
    memory_class: str  # the SymmetricMemory subclass in its module
    protocols: tuple[str, ...]  # the protocols it runs, its native one first
    modelled_on: str
    # Pull reads the rows in the peers' input regions in place, so it needs no receive pool
    # (the CUDA pull); False: its pull copies rows into the pool as push does (host).
    pull_in_place: bool = True
    # Push writes into W * kernel.num_channels rings of the receive pool, one per (source,
    # channel), each with one row of slack, and the layout keeps tail words for those
    # channels (nvshmem). False: one pool row per (source, token), tail words for the most
    # channels the streamed push can have (STREAM_CHANNELS).
    channel_rings: bool = False

    def layout_channels(self, num_channels: int) -> int:
        """The channels whose tail words the buffer layout keeps (``kernel.num_channels``)."""
        return num_channels if self.channel_rings else STREAM_CHANNELS

    def pool_limit(self, protocol: str, world_size: int, max_tokens: int, num_channels: int) -> int:
        """Rows the receive pool needs at most (``BufferLayout.pool_limit``): one per (source,
        token), whatever the output layout (a receiver fans them out into its outputs), plus one
        per ring; none for a pull that reads in place. Split evenly, a ring holds ceil(T / C)
        rows, a channel's longest share of a source's rows, and never wraps."""
        if protocol == "pull" and self.pull_in_place:
            return 0
        return world_size * (max_tokens + (num_channels if self.channel_rings else 0))

    def load(self) -> type["SymmetricMemory"]:
        """Its SymmetricMemory class."""
        return getattr(_module(self.name), self.memory_class)


def _module(name: str):
    return importlib.import_module(f"{__name__}.{MODULES[name]}")


def declared(name: str) -> BackendSpec:
    """The declaration of backend ``name`` (a KeyError for a name not in MODULES)."""
    spec = _module(name).BACKEND
    assert spec.name == name, f"symmoe.backends.{MODULES[name]} declares {spec.name!r}, registered as {name!r}"
    return spec


class _Registry(Mapping[str, BackendSpec]):
    """name -> BackendSpec, each module imported when its declaration is first read."""

    def __getitem__(self, name: str) -> BackendSpec:
        return declared(name)

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


BACKENDS: Mapping[str, BackendSpec] = _Registry()


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
