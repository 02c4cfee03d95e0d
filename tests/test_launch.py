"""symmoe.launch.spawn: local ranks for the tests and single-node runs."""
from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from symmoe import launch


def _sum_of_ranks(rank: int, world_size: int) -> int:
    t = torch.tensor([rank])
    dist.all_reduce(t)
    return int(t)


def test_ranks_meet_without_a_port_staying_free(monkeypatch):
    """A port found free can be taken before a rank binds it (EADDRINUSE on the GPU machine,
    session 24). With free_port naming a port that is held open here, the ranks still meet: the
    parent holds their store on a port the OS picked while binding it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setattr(launch, "free_port", lambda: held.getsockname()[1])
        assert launch.spawn(_sum_of_ranks, 3, timeout_s=30.0) == [3, 3, 3]
