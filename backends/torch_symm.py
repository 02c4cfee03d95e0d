"""torch: symmetric memory from ``torch.distributed._symmetric_memory`` (modelled on DeepGEMM
Mega MoE's SymmBuffer).

Each rank allocates its segment with ``symm_mem.empty`` and ``rendezvous`` on the job's
process group maps every peer's segment into this process; ``buffer_ptrs`` gives the base
addresses, so kernels reach peers with plain loads/stores and TMA bulk copies. Without an
initialised process group (one process) the segment is a plain CUDA allocation.

The segment is ``nbytes`` plus a private tail holding this backend's own barrier flags
(``barrier()``), so they never collide with the protocol's flags inside the layout.
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ..config import Config
from ..errors import BackendUnavailable, StallError
from ..memory import SymmetricMemory
from . import BackendSpec

BACKEND = BackendSpec("torch", "TorchSymmMemory", protocols=("pull", "push"), modelled_on="DeepGEMM Mega MoE SymmBuffer")

_PRIVATE = 4096  # bytes of backend-private flags after the segment (one int64 per rank)
MIN_TORCH = (2, 9)


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


class TorchSymmMemory(SymmetricMemory):
    name = "torch"
    load_store_peers = True
    remote_put = False
    tma_pull = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if _torch_version() < MIN_TORCH:
            return f"torch {torch.__version__} is older than {'.'.join(map(str, MIN_TORCH))}"
        if not torch.cuda.is_available():
            return f"no CUDA device visible to torch {torch.__version__} (built for CUDA {torch.version.cuda})"
        try:
            import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
        except ImportError as e:
            return f"torch.distributed._symmetric_memory is missing: {e}"
        if not hasattr(symm_mem, "empty") or not hasattr(symm_mem, "rendezvous"):
            return "torch.distributed._symmetric_memory has no empty/rendezvous"
        major, _ = torch.cuda.get_device_capability()
        if major < 9:
            return f"GPU compute capability {major}.x: the kernels use Hopper bulk copies (sm_90a)"
        return None

    def __init__(self, group: dist.ProcessGroup | None, nbytes: int, config: Config):
        super().__init__(group, nbytes)
        self.timeout_s = config.kernel.timeout_s
        self._epoch = 0
        self._handle: Any = None
        self._module: Any = None
        self._ctx: Any = None
        self._err: tuple[int, int] | None = None
        dev = torch.device("cuda", torch.cuda.current_device())
        total = nbytes + _PRIVATE
        if self.world_size > 1 and not dist.is_initialized():
            raise BackendUnavailable("torch: several ranks need an initialised torch.distributed process group")
        if dist.is_initialized() and self.world_size >= 1 and dist.get_world_size(group) > 1:
            if config.torch.allow_overlapping_devices:
                # Several ranks on one GPU (tests under MPS): torch refuses that unless told.
                os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
            import torch.distributed._symmetric_memory as symm_mem

            pg = group if group is not None else dist.group.WORLD
            if _torch_version() < (2, 11):  # later versions register groups on rendezvous
                try:
                    symm_mem.enable_symm_mem_for_group(pg.group_name)
                except Exception:
                    pass
            try:
                self._buf = symm_mem.empty(total, dtype=torch.uint8, device=dev)
                self._handle = symm_mem.rendezvous(self._buf, pg)
            except Exception as e:
                raise BackendUnavailable(f"torch symmetric memory rendezvous failed on rank {self.rank}: {e}") from e
            own = self._buf.data_ptr() - int(self._handle.buffer_ptrs[self.rank])
            bases = [int(p) + own for p in self._handle.buffer_ptrs]
        else:
            self._buf = torch.empty(total, dtype=torch.uint8, device=dev)
            bases = [self._buf.data_ptr()]
        # Zero everything (flags, counts) before any peer can signal into it.
        self._buf.zero_()
        self._local = self._buf[: self.nbytes]  # made once: dispatches read it (a slice costs the host µs)
        self._bases = torch.tensor(bases, dtype=torch.int64, device=dev)
        self._bases_host = bases
        torch.cuda.synchronize(dev)
        if self.world_size > 1:
            dist.barrier(group=group)

    @property
    def local(self) -> torch.Tensor:
        return self._local

    @property
    def peer_bases(self) -> torch.Tensor:
        return self._bases

    def peer(self, rank: int) -> torch.Tensor:
        if rank == self.rank:
            return self.local
        if self._handle is None:
            raise IndexError(f"rank {rank}: one process has no peers")
        t = self._handle.get_buffer(rank, (self.nbytes + _PRIVATE,), torch.uint8, 0)
        return t[: self.nbytes]

    # -- barrier -------------------------------------------------------------------------
    def _kernels(self) -> Any:
        if self._ctx is None:
            from .. import build

            self._module = build.load("symmoe_cuda")
            self._err = self._module.host_alloc_mapped(64)
            self._counters = torch.zeros(8, dtype=torch.int32, device=self.device)
            self._err_dev = torch.zeros(8, dtype=torch.int64, device=self.device)
            from ..config import Config as _C  # layout-independent context: only barrier() is used

            args = _C().layout(self.world_size).kernel_args()
            self._ctx = self._module.Context(args, self.rank, self._buf.data_ptr(), self._bases.data_ptr(),
                                             self._err_dev.data_ptr(), self._err[1], self.timeout_s, 1,
                                             self._counters.data_ptr())
        return self._ctx

    def barrier(self, stage: str = "barrier", flags_offset: int | None = None) -> None:
        """Device barrier over the flags at ``flags_offset`` (default: this backend's private
        ones); waits on the host and raises StallError naming ``stage`` on timeout."""
        import ctypes

        ctx = self._kernels()
        self._epoch += 1
        off = self.nbytes if flags_offset is None else flags_offset
        stream = torch.cuda.current_stream(self.device)
        ctx.barrier(off, self._epoch, self._module.STAGES["barrier"], stream.cuda_stream)
        stream.synchronize()
        word = (ctypes.c_int64 * 4).from_address(self._err[0])
        if word[0]:
            peer = int(word[1])
            raise StallError(self.rank, stage, self.timeout_s, f"no arrival from rank {peer}")

    def _release(self) -> None:
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass
        if self.world_size > 1 and dist.is_initialized():
            try:
                dist.barrier(group=self.group)  # no peer may still read this segment
            except Exception:
                pass
        self._handle = None
        self._buf = self._local = None  # type: ignore[assignment]
        if self._err is not None and self._module is not None:
            try:
                self._module.host_free(self._err[0])
            except Exception:
                pass
            self._err = None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self._buf is None else self._buf.device
