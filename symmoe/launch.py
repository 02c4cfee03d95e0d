"""Starting ranks: reuse torchrun's process group, or spawn N local processes.

The process group is gloo: symmoe moves data through symmetric memory, the group only
carries set-up metadata, and gloo also works for several ranks on one GPU (where NCCL
refuses duplicate devices).
"""
from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_from_env(timeout_s: float = 120.0) -> tuple[int, int]:
    """Join torchrun's rendezvous (gloo) and return (rank, world_size); outside torchrun, a
    group of this process alone, on an in-process store (no port to find free)."""
    if not dist.is_initialized():
        if under_torchrun():
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


@contextmanager
def torchrun_group(timeout_s: float = 120.0) -> Iterator[tuple[int, int]]:
    """``with torchrun_group() as (rank, world_size):`` -- joins torchrun's rendezvous (outside
    torchrun: a group of this process alone) and destroys the group on the way out (gloo aborts
    the process at exit otherwise)."""
    rank, world_size = init_from_env(timeout_s)
    try:
        yield rank, world_size
    finally:
        dist.destroy_process_group()


def local_gpu(rank: int) -> torch.device:
    """This rank's GPU, made current: LOCAL_RANK (torchrun and spawn set it; else ``rank``)
    modulo the visible GPUs, so several ranks may share one GPU (MPS). None visible:
    BackendUnavailable."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        from .errors import BackendUnavailable
        raise BackendUnavailable(f"rank {rank}: needs a CUDA GPU and none is visible here")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % gpus)
    torch.cuda.set_device(dev)
    return dev


def mps_share(world_size: int, gpus: int | None = None) -> int:
    """The CUDA MPS active thread percentage each of ``world_size`` local ranks gets when they
    share the visible GPUs (rank r on GPU r % gpus), 0 when each rank has a GPU of its own.
    Every backend gets the same share, so an A/B run compares equal SM shares; NVSHMEM needs
    it besides (its full multi-process-per-GPU mode wants one GPU's shares to sum to <= 100)."""
    gpus = max(1, torch.cuda.device_count() if gpus is None else gpus)
    if world_size <= gpus:
        return 0
    return max(1, 100 // -(-world_size // gpus))  # the busiest GPU's ranks split it evenly


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, env: dict[str, str],
            results: Any, timeout_s: float) -> None:
    os.environ.update(env)
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: ranks sharing the cores must not each run a full-width thread pool
        # (host-backend calls were 10x slower oversubscribed, waiting on each other's barriers).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    failed = False
    try:
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException as e:  # the parent reports it, with the rank that raised
        results[rank] = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        failed = True
    finally:
        dist.destroy_process_group()
    if failed:
        sys.exit(1)


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), env: dict[str, str] | None = None,
          timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return each
    rank's result, or raise ``RankFailed`` carrying every rank's outcome. A rank that returned
    but then exited non-zero (an abort at interpreter exit, e.g. in a library's finalisation)
    or hung until killed has failed too."""
    ctx = mp.get_context("spawn")
    # The parent listens for the ranks' rendezvous on a port the OS picks while binding it: a
    # port found free and then bound by rank 0 could be taken in between (EADDRINUSE: rank 0
    # fails and rank 1 waits out the whole timeout).
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    with ctx.Manager() as manager:
        results = manager.dict()
        port = store.port
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, env or {}, results, timeout_s))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s * 4)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        out = dict(results)
    for r, p in enumerate(procs):
        if out.get(r, ("missing",))[0] == "ok" and p.exitcode != 0:
            how = "was killed, still running" if p.exitcode == -9 else f"exited with code {p.exitcode}"
            out[r] = ("error", f"returned its result, then {how} (at interpreter exit)", "")
    if any(out.get(r, ("missing",))[0] != "ok" for r in range(world_size)):
        raise RankFailed(out, world_size)
    return [out[r][1] for r in range(world_size)]


class RankFailed(RuntimeError):
    def __init__(self, outcomes: dict[int, Any], world_size: int):
        self.outcomes = outcomes
        lines = []
        for r in range(world_size):
            o = outcomes.get(r)
            if o is None:
                lines.append(f"rank {r}: exited without a result")
            elif o[0] == "error":
                lines.append(f"rank {r}: {o[1]}")
        super().__init__("; ".join(lines) or "a rank failed")

    def errors(self) -> dict[int, str]:
        return {r: o[1] for r, o in self.outcomes.items() if o[0] == "error"}
