"""A protocol is chosen by what the memory can do, never by the backend's name: host memory
runs the plain-torch flow, GPU memory that maps every peer the shared CUDA kernels (nvshmem
on one node included), GPU memory that reaches some peers only by signalled puts the NVSHMEM
push, and anything else is refused with the reason."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from symmoe.errors import InputError
from symmoe.protocol import choose


def memory(device: str = "cuda", maps_every_peer: bool = True, signal_puts: bool = False, world_size: int = 2,
           peers_map: "list[bool] | None" = None, name: str = "some-backend") -> SimpleNamespace:
    """A memory as choose() sees it; ``peers_map``: what every rank's maps_every_peer says."""
    answers = peers_map if peers_map is not None else [maps_every_peer] * world_size
    return SimpleNamespace(device=torch.device(device), maps_every_peer=maps_every_peer, signal_puts=signal_puts,
                           world_size=world_size, name=name, all_gather=lambda mine: answers)


@pytest.mark.parametrize("proto", ["push", "pull"])
def test_host_memory_runs_the_plain_torch_flow(proto):
    assert choose(memory(device="cpu"), proto).__name__ == f"Host{proto.capitalize()}"


@pytest.mark.parametrize("signal_puts", [False, True])
@pytest.mark.parametrize("proto", ["push", "pull"])
def test_gpu_memory_that_maps_every_peer_runs_the_shared_kernels(proto, signal_puts):
    """torch's symmetric memory, nccl's LSA team and NVSHMEM on one node alike."""
    assert choose(memory(signal_puts=signal_puts), proto).__name__ == f"Cuda{proto.capitalize()}"


def test_memory_that_puts_where_it_cannot_map_runs_the_nvshmem_push():
    assert choose(memory(maps_every_peer=False, signal_puts=True), "push").__name__ == "NvshmemPush"


def test_one_rank_that_cannot_map_a_peer_takes_every_rank_to_the_put_protocol():
    """Ranks must run the same protocol: the answer is gathered where it could differ."""
    mem = memory(maps_every_peer=True, signal_puts=True, world_size=4, peers_map=[True, True, False, True])
    assert choose(mem, "push").__name__ == "NvshmemPush"


def test_memory_with_unmapped_peers_and_no_put_protocol_is_refused():
    with pytest.raises(InputError, match="cannot reach every peer by load/store.*'some-backend'|'some-backend'.*load/store"):
        choose(memory(maps_every_peer=False), "push")
