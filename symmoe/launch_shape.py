"""The one place that decides SMs and launch shapes: how many blocks each family of kernels
launches, from the config's ``kernel`` section and the SMs of this process's GPU.

Every function here is pure (the GPU is read once, by :func:`gpu_sms`), so the rules are
specified on the CPU (``tests/test_launch_shape.py``). The protocols hand the numbers to the
bindings (``LaunchShape.kernel_args``, ``csrc/bindings/launch_geometry.h``), which check them
and launch with them; no C++ code reads ``kernel.num_sms`` or the GPU's SM count to size a grid.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import FAN_PHASES
from .errors import ConfigError, InputError

if TYPE_CHECKING:
    import torch

    from .config import Config, KernelConfig

MPS_SHARE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # the MPS share of the SMs this process may hold
MIN_HELD_SMS = 2  # the fewest SMs an MPS share counts as: a sender and a receiver block resident


@dataclass(frozen=True)
class GpuSms:
    """The SMs of this process's GPU: all of them, and those it may occupy at once (under CUDA
    MPS its active thread percentage of them, else all)."""

    total: int
    held: int

    def __post_init__(self) -> None:
        if self.total < 1:
            raise InputError(f"GPU SMs: total={self.total}; a GPU has at least 1 SM")
        if not 1 <= self.held <= max(self.total, MIN_HELD_SMS):
            raise InputError(f"GPU SMs: held={self.held} of total={self.total}; this process holds 1..{self.total}")


def held_sms(total: int, mps_share: str | None) -> int:
    """SMs a process may occupy at once on a GPU of ``total`` SMs: all of them, or with an MPS
    share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, a percentage in (0, 100]) that share, rounded
    down, of at least MIN_HELD_SMS."""
    if not mps_share:
        return total
    try:
        pct = float(mps_share)
    except ValueError:
        raise InputError(f"{MPS_SHARE}={mps_share!r}: expected a percentage in (0, 100]") from None
    if not 0 < pct <= 100:
        raise InputError(f"{MPS_SHARE}={mps_share!r}: expected a percentage in (0, 100]")
    return max(MIN_HELD_SMS, total * int(pct) // 100)


def gpu_sms(device: "torch.device") -> GpuSms:
    """``device``'s SMs and the share of them this process holds (its MPS share): the only read
    of the GPU's SM count that a launch shape comes from."""
    import torch

    total = torch.cuda.get_device_properties(device).multi_processor_count
    return GpuSms(total, held_sms(total, os.environ.get(MPS_SHARE)))


def _num_sms(kernel: "KernelConfig") -> int:
    if kernel.num_sms < 1:
        raise ConfigError("kernel.num_sms", kernel.num_sms, "must be >= 1")
    return kernel.num_sms


def grid_blocks(kernel: "KernelConfig", gpu: GpuSms) -> int:
    """Blocks of a persistent grid: ``kernel.num_sms``, at most the GPU's SMs."""
    return min(_num_sms(kernel), gpu.total)


def held_blocks(kernel: "KernelConfig", gpu: GpuSms) -> int:
    """Blocks of a grid whose blocks wait for each other, so all must be resident at once:
    ``kernel.num_sms``, at most the SMs this process holds."""
    return min(_num_sms(kernel), gpu.held)


@dataclass(frozen=True)
class LaunchShape:
    """Blocks of each kernel family of one protocol's calls. The C++ side launches at most these
    many (fewer where the work is smaller: a routing block takes 128 tokens or more) and refuses
    a shape that is not one of these (csrc/bindings/launch_geometry.h)."""

    sms: int          # the GPU's SMs (the residency check of grid-wide phases counts them)
    route: int        # most blocks of a routing launch
    dispatch: int     # blocks of the dispatch data kernels (CUDA pull / push / unpack; nvshmem 2 x channels)
    combine: int      # blocks of the combine's send kernel (CUDA one grid; nvshmem one a channel)
    reduce: int       # SMs the combine's reduction spreads over (csrc/common/reduce.cuh: blocks a SM)
    alone: int        # blocks of the world-size-1 kernels (csrc/kernels/alone.cuh)
    tail: int         # most blocks of num_worst_tokens' tail kernel
    stream: int = 0   # blocks of the streamed push (kernel.push_mode); 0: push, then unpack
    channels: int = 0  # nvshmem: channels of its dispatch (a sender and a receiver block each); 0 elsewhere

    # What symmoe_cuda's Context takes (csrc/bindings/launch_geometry.h, in this order); the
    # streamed push's split and nvshmem's channels go with each call.
    KERNEL_FIELDS = ("sms", "route", "dispatch", "combine", "reduce", "alone", "tail")

    def kernel_args(self) -> list[int]:
        """The shape as csrc/bindings/launch_geometry.h reads it, in KERNEL_FIELDS' order."""
        return [getattr(self, f) for f in self.KERNEL_FIELDS]


def low_latency_blocks(num_sms: int, gpu: GpuSms, share: int) -> int:
    """Blocks of every low-latency kernel (``low_latency.num_sms``; 0 = the budget): at most the
    SMs this process holds (its MPS share) and at most its part of the GPU when ``share`` ranks
    run on it. The receive kernels spin while they wait; the budget keeps the spinning blocks of
    all ranks on a GPU at about one per SM, and a block takes at most half an SM
    (ll::kMinBlocksPerSm), so every sender finds room."""
    if num_sms < 0:
        raise ConfigError("low_latency.num_sms", num_sms, "must be >= 0 (0: the rank's share of the GPU)")
    budget = max(1, min(gpu.held, gpu.total // max(1, share)))
    return budget if num_sms == 0 else min(num_sms, budget)


def stream_blocks(mode: str, share: int, sms: int, num_sms: int) -> int:
    """Blocks of the streamed push for ``kernel.push_mode`` = ``mode`` when at most ``share``
    ranks run on one GPU and every GPU has at least ``sms`` SMs; 0 = push then unpack. The
    inputs are the same on every rank, so is the result (receivers wait for their channels'
    senders on every peer). Receivers wait inside the kernel, so the grids of all ranks sharing
    a GPU must be resident at once: one block per SM at least, a sender and a receiver each.
    "auto" streams only when every rank has a GPU of its own (under MPS the receivers would
    spin on the SMs the senders need)."""
    if mode == "unpack" or (mode == "auto" and share > 1):
        return 0
    fit = sms // share
    if fit < 2:
        if mode == "stream":
            raise InputError(f"kernel.push_mode=stream: {share} ranks share a GPU of {sms} SMs, and each needs "
                             "2 blocks resident at once; use push_mode unpack (or auto)")
        return 0
    return max(2, min(num_sms, fit))


def stream_split(blocks: int, max_senders: int, receivers: int) -> tuple[int, int]:
    """(senders, receivers) of a streamed push over at most ``blocks`` blocks; ``receivers``
    = ``kernel.stream_receivers`` (0: half the blocks; at W=2 every smaller share measured
    was slower, in both layouts). Senders are the channels, at
    most ``max_senders`` (the layout's tail words); receivers never outnumber them."""
    r = max(1, min(receivers or blocks // 2, blocks // 2))
    s = min(max_senders, blocks - r)
    return s, min(r, s)


def may_stream(kernel: "KernelConfig", protocol: str, world_size: int) -> bool:
    """Whether a CUDA protocol's push may stream (then its shape needs the group's GPU sharing,
    gathered from every rank)."""
    return protocol == "push" and world_size > 1 and kernel.push_mode != "unpack"


def cuda_shape(kernel: "KernelConfig", gpu: GpuSms, sharing: tuple[int, int] | None = None) -> LaunchShape:
    """The CUDA protocols' shape (symmoe_cuda's Context): every kernel on one persistent grid of
    ``kernel.num_sms`` blocks, at most the GPU's SMs. ``sharing``: (most ranks of the group on one
    GPU, fewest SMs of their GPUs) where the push may stream (``may_stream``), else None."""
    grid = grid_blocks(kernel, gpu)
    stream = stream_blocks(kernel.push_mode, sharing[0], sharing[1], kernel.num_sms) if sharing else 0
    return LaunchShape(sms=gpu.total, route=grid, dispatch=grid, combine=grid, reduce=grid, alone=grid, tail=grid,
                       stream=stream)


def nvshmem_shape(kernel: "KernelConfig", gpu: GpuSms, layout_channels: int) -> LaunchShape:
    """The nvshmem protocol's shape. Its dispatch (a sender and a receiver block a channel) and
    its combine's send kernel (a block a channel) wait for the peers' senders, so all their
    blocks must be resident at once on the SMs this process holds: at most ``kernel.num_channels``
    and ``layout_channels`` (its signal words) channels, two blocks each within ``kernel.num_sms``
    and the held SMs. The routing and the tail spread over every SM of the GPU; its world-size-1
    dispatch runs the CUDA alone kernels on ``kernel.num_sms`` blocks."""
    held = held_blocks(kernel, gpu)
    channels = max(1, min(kernel.num_channels, layout_channels, kernel.num_sms // 2, gpu.held // 2))
    return LaunchShape(sms=gpu.total, route=gpu.total, dispatch=2 * channels, combine=max(1, min(layout_channels, held)),
                       reduce=held, alone=grid_blocks(kernel, gpu), tail=gpu.total, channels=channels)


def fan_phases_mode(config: "Config", world_size: int, gpu: GpuSms) -> int:
    """kernel.fan_phases as the kernels take it (0 off, 1 block, 2 grid, 3 steal). Grid-wide
    phases need every block of the world-size-1 dispatch resident at once: a grid of more
    blocks than this process holds (its MPS share) is refused here (the kernel's own check
    counts every SM)."""
    mode = FAN_PHASES.index(config.kernel.fan_phases)
    if mode == 2 and world_size == 1:
        blocks = grid_blocks(config.kernel, gpu)
        if blocks > gpu.held:
            raise ConfigError("kernel.fan_phases", "grid",
                              f"needs every block resident at once: the dispatch runs {blocks} blocks, this "
                              f"process holds {gpu.held} SMs ({MPS_SHARE}); lower kernel.num_sms to {gpu.held} "
                              "or use 'block'", config.source)
    return mode
