"""host: symmetric memory as POSIX shared memory between CPU processes, one per rank.

Each rank creates ``/dev/shm/symmoe-<id>-<rank>``; the names travel over the job's (gloo)
process group and every rank maps every peer's file. The owner unlinks its file as soon
as all peers have mapped it, so the memory goes away when the last process exits, also
when a rank raises or is killed.
"""
from __future__ import annotations

import mmap
import os
import time
import uuid

import torch
import torch.distributed as dist

from ..config import Config
from ..errors import BackendUnavailable, StallError
from ..memory import SymmetricMemory
from . import BackendSpec

BACKEND = BackendSpec("host", "HostMemory", protocols=("push", "pull"), modelled_on="none (CPU processes, POSIX shared memory)",
                      pull_in_place=False)  # host pull copies the rows into its pool too

SHM_DIR = "/dev/shm"


class HostMemory(SymmetricMemory):
    name = "host"
    load_store_peers = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not os.path.isdir(SHM_DIR):
            return f"{SHM_DIR} does not exist (POSIX shared memory is needed)"
        return None

    def __init__(self, group: dist.ProcessGroup | None, nbytes: int, config: Config):
        super().__init__(group, nbytes)
        self.timeout_s = config.kernel.timeout_s
        self.poll_s = config.host.poll_interval_us * 1e-6
        self._maps: list[mmap.mmap] = []
        self._views: list[torch.Tensor] = []
        self._epoch = 0
        job = uuid.uuid4().hex[:12]
        own = f"symmoe-{job}-{self.rank}"
        path = os.path.join(SHM_DIR, own)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            raise BackendUnavailable(f"host: cannot size {path} to {nbytes} bytes: {e}") from None
        own_map = mmap.mmap(fd, nbytes)
        os.close(fd)
        names = self.all_gather(own)
        try:
            for r, name in enumerate(names):
                if r == self.rank:
                    self._maps.append(own_map)
                    continue
                pfd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
                try:
                    self._maps.append(mmap.mmap(pfd, nbytes))
                finally:
                    os.close(pfd)
        finally:
            if self.world_size > 1:
                dist.barrier(group=group)  # every peer has mapped our file
            os.unlink(path)
        self._views = [torch.frombuffer(m, dtype=torch.uint8) for m in self._maps]

    @property
    def local(self) -> torch.Tensor:
        return self._views[self.rank]

    @property
    def peer_bases(self) -> torch.Tensor:
        return torch.tensor([v.data_ptr() for v in self._views], dtype=torch.int64)

    def peer(self, rank: int) -> torch.Tensor:
        return self._views[rank]

    def barrier(self, stage: str = "barrier", flags_offset: int = 0) -> None:
        """Flag barrier through the segments themselves: rank ``r`` stores the epoch into
        slot ``r`` of every peer's flags, then waits for all of its own slots to reach it.
        Epochs only grow, so a peer already one barrier ahead also satisfies the wait."""
        self._epoch += 1
        epoch = self._epoch
        W = self.world_size
        for p in range(W):
            self.view(flags_offset, torch.int64, (W,), rank=p)[self.rank] = epoch
        mine = self.view(flags_offset, torch.int64, (W,))
        deadline = time.monotonic() + self.timeout_s
        while True:
            late = (mine < epoch).nonzero().flatten().tolist()
            if not late:
                return
            if time.monotonic() > deadline:
                raise StallError(self.rank, stage, self.timeout_s, f"no arrival from rank(s) {late}")
            if self.poll_s:
                time.sleep(self.poll_s)

    def _release(self) -> None:
        self._views = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a tensor view still exists; the mapping goes when it does
        self._maps = []
