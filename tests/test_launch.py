"""symmoe.launch: local ranks for the tests and single-node runs, and the group of a process
alone. No port is ever found free first and bound later: another socket can take it in
between (EADDRINUSE)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from symmoe import launch


def _sum_of_ranks(rank: int, world_size: int) -> int:
    t = torch.tensor([rank])
    dist.all_reduce(t)
    return int(t)


def test_spawned_ranks_meet_on_a_store_the_parent_binds_to_a_port_the_os_picks(monkeypatch):
    opened = []
    real = dist.TCPStore

    def recording_store(host, port, *args, **kw):
        opened.append((port, kw.get("is_master", args[1] if len(args) > 1 else None)))
        return real(host, port, *args, **kw)

    monkeypatch.setattr(dist, "TCPStore", recording_store)
    assert launch.spawn(_sum_of_ranks, 3, timeout_s=30.0) == [3, 3, 3]
    assert opened == [(0, True)], opened  # the parent's store, bound to port 0 by the OS


def test_a_process_outside_torchrun_gets_a_group_of_its_own(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with launch.torchrun_group() as (rank, world_size):
        assert (rank, world_size) == (0, 1)
        assert _sum_of_ranks(rank, world_size) == 0
    assert not dist.is_initialized()
