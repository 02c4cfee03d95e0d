"""nccl: symmetric memory from NCCL windows (DeepEP V2 ``ElasticBuffer`` style).

Set-up, collective over the job's process group:

1. rank 0 makes an NCCL unique id; it travels over the torch group
   (``broadcast_object_list``); every rank joins an nccl4py ``Communicator``.
2. each rank allocates its segment with ``ncclMemAlloc`` and registers it collectively as
   a symmetric window (``NCCL_WIN_COLL_SYMMETRIC``).
3. the device communicator (``ncclDevCommCreate``, in symmoe's NCCL extension because
   nccl4py 0.6.0's helper assumes NCCL >= 2.29) with LSA barriers and, where the job
   spans more than one LSA team (NVLink domain), GIN signals.
4. peer bases for the LSA team: host ``ncclGetLsaDevicePointer`` on NCCL >= 2.29, a
   one-time kernel calling ``ncclGetLsaPointer`` on 2.28.

``local`` is the LSA view of this rank's own segment, ``ncclGetLsaPointer(win, 0,
lsa_rank)``, not the address ``ncclMemAlloc`` returned: NCCL maps the window a second
time in its own flat range. Both are the same physical memory, but the kernels reach
every rank (this one included) through ``peer_bases``, so ``local`` uses the same virtual
address: one address per byte, no aliasing between the host's view and the kernels' (L1
is tagged by virtual address), and ``peer_bases[rank] == local.data_ptr()``.

Peers outside the LSA team get ``peer_bases[r] == 0``; they are reached through GIN
puts and signals (``transports()`` says which rank is reached how).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import build
from ..config import Config
from ..errors import BackendUnavailable, NcclError, StallError, SymmoeError
from ..memory import SymmetricMemory
from . import BackendSpec

BACKEND = BackendSpec("nccl", "NcclMemory", protocols=("push",), modelled_on="DeepEP V2 ElasticBuffer")

NCCL_WIN_COLL_SYMMETRIC = 1
MIN_VERSION = 22800  # device API (LSA pointers, device communicator) from NCCL 2.28
HOST_LSA_POINTER_VERSION = 22900  # host ncclGetLsaDevicePointer from 2.29
SEGMENT_ALIGN = 1 << 21  # ncclMemAlloc's granularity on current GPUs; windows want 4 KiB at least
BARRIER_SIGNAL = 0  # GIN signal ids of the device communicator
DATA_SIGNAL = 1
GIN_SIGNALS = 2


def _bindings():
    import nccl.bindings.nccl as b  # noqa: PLC0415 - optional dependency
    return b


def _nccl_call(call: str, fn: Any, *args: Any) -> Any:
    """Run one nccl4py binding call; NCCL errors become NcclError naming the call."""
    b = _bindings()
    try:
        return fn(*args)
    except b.NCCLError as e:
        status = getattr(e, "status", None)
        try:
            text = b.get_error_string(int(status)) if status is not None else str(e)
        except Exception:  # noqa: BLE001 - keep the original text
            text = str(e)
        raise NcclError(call, f"{text} (ncclResult_t {int(status) if status is not None else '?'})",
                        int(status) if status is not None else None) from None


def _ext_call(call: str, fn: Any, *args: Any, **kw: Any) -> Any:
    ext = _ext()
    try:
        return fn(*args, **kw)
    except ext.NcclCallError as e:  # "<NCCL call> failed: <result string> (ncclResult_t N)[; NCCL says: ...]"
        text = str(e)
        inner, sep, detail = text.partition(" failed: ")
        if sep and inner and " " not in inner:
            call, text = inner, detail  # the extension names the exact NCCL/CUDA call
        raise NcclError(call, text, getattr(e, "code", None)) from None


def _cccl_include() -> list[str]:
    """CCCL's headers (<cuda/atomic>, used by NCCL's device API) live in include/cccl."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = build.nvcc_path()
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    for h in homes:
        if h and (Path(h) / "include" / "cccl").is_dir():
            return [str(Path(h) / "include" / "cccl")]
    return []


def _nccl_lib() -> str:
    return str(build.site_lib_root("nccl") / "lib")


# The extension is compiled against the headers of the nvidia-nccl wheel and linked to its
# libnccl.so.2 (rpath), the same library nccl4py and torch load.
SPEC = build.register(build.ExtensionSpec(
    name="symmoe_nccl",
    sources=("nccl/nccl_ext.cu",),
    include_dirs=lambda: [build.site_include("nccl"), *_cccl_include()],
    link_flags=lambda: [f"-L{_nccl_lib()}", "-l:libnccl.so.2", "-Xlinker", f"-rpath,{_nccl_lib()}"],
    lib_dists=("nvidia-nccl-cu13", "nvidia-nccl-cu12"),
    description="NCCL device communicator, LSA peer pointers, LSA/GIN barrier, GIN puts (nccl backend)",
))

_EXT_LOCK = threading.Lock()
_EXT: Any = None


def _ext() -> Any:
    """The compiled symmoe_nccl module (JIT-built by symmoe.build on first use)."""
    global _EXT
    with _EXT_LOCK:
        if _EXT is None:
            _EXT = build.load(SPEC.name)
        return _EXT


def runtime_version() -> int:
    return int(_bindings().get_version())


def _fmt_version(v: int) -> str:
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


class NcclMemory(SymmetricMemory):
    name = "nccl"
    load_store_peers = True
    remote_put = True  # GIN, for peers outside the LSA team
    tma_pull = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import nccl.core  # noqa: F401, PLC0415
            b = _bindings()
        except ImportError as e:
            if (e.name or "").split(".")[0] == "cuda":
                return (f"nccl4py is installed but its dependency is not importable ({e}); install cuda-core and "
                        "cuda-bindings for your CUDA version")
            return f"nccl4py is not importable ({e}); install nccl4py>=0.6.0 (pip install 'symmoe[nccl]')"
        if not torch.cuda.is_available():
            return "no CUDA GPU visible (torch.cuda.is_available() is False)"
        try:
            v = int(b.get_version())
        except Exception as e:  # noqa: BLE001 - libnccl missing or broken
            return f"libnccl cannot be loaded through nccl4py: {e}"
        if v < MIN_VERSION:
            return f"NCCL {_fmt_version(v)} is older than 2.28 (the device API with symmetric windows starts there)"
        if build.nvcc_path() is None:
            return "nvcc not found (set NVCC or CUDA_HOME): the NCCL device-API extension is compiled on first use"
        try:
            build.site_include("nccl")
        except Exception as e:  # noqa: BLE001 - BuildError: the wheel with the headers is missing
            return f"NCCL headers missing: {e}"
        if not _cccl_include():
            return "CCCL headers (include/cccl of the CUDA toolkit) not found; NCCL's device API needs them"
        return None

    @classmethod
    def describe_transports(cls) -> str:
        """For ``symmoe info``: how each class of peer is reached."""
        try:
            v = runtime_version()
            how = ("host ncclGetLsaDevicePointer" if v >= HOST_LSA_POINTER_VERSION
                   else "a one-time ncclGetLsaPointer kernel")
            ver = f"NCCL {_fmt_version(v)}"
        except Exception:  # noqa: BLE001
            how, ver = "ncclGetLsaPointer", "NCCL ?"
        return (f"{ver}; peers in the LSA team (NVLink domain): load/store through LSA pointers ({how}); "
                "peers outside it: refused at allocation (GIN put and signal kernels are compiled, but the "
                "push kernels move rows over LSA only)")

    @classmethod
    def allocate(cls, config: Config, group: dist.ProcessGroup | None, nbytes: int) -> "NcclMemory":
        mem = cls(group, nbytes, config)
        gin = mem.transports()["gin"]
        if gin:
            # The push/combine kernels (csrc/kernels) reach peers through load/store
            # pointers only; rows for GIN peers would need a GIN-aware push kernel.
            mem.close()
            raise BackendUnavailable(
                f"nccl: rank {mem.rank} reaches ranks {gin} only through GIN (outside its NVLink domain of "
                f"{mem.lsa_size}); the nccl push kernels move rows over LSA only so far. Use one NVLink "
                "domain per job, or the nvshmem backend across nodes")
        return mem

    def __init__(self, group: dist.ProcessGroup | None, nbytes: int, config: Config | None = None):
        super().__init__(group, nbytes)
        self.timeout_s = config.kernel.timeout_s if config is not None else 30.0
        self._comm: Any = None
        self._ptr = 0
        self._win: Any = None
        self._devcomm: Any = None
        self._local: torch.Tensor | None = None
        self._bases: torch.Tensor | None = None
        self._epoch = 0
        self.alloc_bytes = (nbytes + SEGMENT_ALIGN - 1) // SEGMENT_ALIGN * SEGMENT_ALIGN
        try:
            self._setup()
        except BaseException:
            self._release()
            self._closed = True
            raise

    # -- set-up ------------------------------------------------------------------------------
    def _setup(self) -> None:
        import nccl.core as nc  # noqa: PLC0415
        b = _bindings()
        ext = _ext()
        v = runtime_version()
        if v != ext.NCCL_VERSION_CODE and v < 23100:
            # Before 2.31 the device API's structs may change between any two versions.
            raise BackendUnavailable(
                f"nccl: the extension was compiled against NCCL {_fmt_version(ext.NCCL_VERSION_CODE)} but "
                f"libnccl {_fmt_version(v)} is loaded; they must match before NCCL 2.31 (rebuild: symmoe build)")
        self.version = v
        torch.cuda.init()
        self._device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(self._device)

        uid: list[Any] = [nc.get_unique_id() if self.rank == 0 else None]
        if self.world_size > 1:
            src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
            dist.broadcast_object_list(uid, src=src, group=self.group)
        try:
            self._comm = nc.Communicator.init(self.world_size, self.rank, uid[0])
        except b.NCCLError as e:
            raise NcclError("ncclCommInitRankScalable", str(e)) from None

        self._ptr = int(_nccl_call("ncclMemAlloc", b.mem_alloc, self.alloc_bytes))
        self._win = _nccl_call("ncclCommWindowRegister", b.comm_window_register, self._comm._comm, self._ptr,
                               self.alloc_bytes, NCCL_WIN_COLL_SYMMETRIC)
        if not int(self._win.handle):
            raise BackendUnavailable(
                "nccl: ncclCommWindowRegister returned no window: this communicator has no symmetric-memory "
                "support here (needs CUDA VMM / NCCL_CUMEM_ENABLE=1 and a device-API capable NCCL)")

        lsa_n, lsa_rank, _stride = _ext_call("ncclTeamLsa", ext.team_lsa, self._comm.ptr)
        self.lsa_size, self.lsa_rank = int(lsa_n), int(lsa_rank)
        self.lsa_first = self.rank - self.lsa_rank  # the LSA team is a contiguous block of world ranks
        needs_gin = self.lsa_size < self.world_size
        self._devcomm = _ext_call("ncclDevCommCreate", ext.DevComm, self._comm.ptr, 1,
                                  GIN_SIGNALS if needs_gin else 0, False)
        if needs_gin and self._devcomm.gin_contexts == 0:
            raise BackendUnavailable(
                f"nccl: ranks {self._gin_ranks()} are outside this rank's LSA team (NVLink domain of "
                f"{self.lsa_size}) and NCCL set up no GIN transport for them (needs a GIN-capable network: "
                "IB/RoCE with GPUDirect RDMA)")

        stream = torch.cuda.current_stream(self._device)
        if v >= HOST_LSA_POINTER_VERSION and hasattr(b, "get_lsa_device_pointer"):
            ptrs = [int(_nccl_call("ncclGetLsaDevicePointer", b.get_lsa_device_pointer, self._win, 0, i))
                    for i in range(self.lsa_size)]
        else:
            ptrs = [int(p) for p in _ext_call("ncclGetLsaPointer", ext.lsa_pointers, int(self._win.handle),
                                              self.lsa_size, stream.cuda_stream)]
        bases = [0] * self.world_size
        for i, p in enumerate(ptrs):
            bases[self.lsa_first + i] = p
        self._bases = torch.tensor(bases, dtype=torch.int64, device=self._device)
        self._local = _tensor_at(bases[self.rank], self.nbytes, self._device)
        self._status = torch.zeros(ext.STATUS_WORDS, dtype=torch.int32, device=self._device)
        self._local.zero_()  # ncclMemAlloc does not clear; flags must start at 0 everywhere
        self.barrier("nccl.setup")

    def _gin_ranks(self) -> list[int]:
        return [r for r in range(self.world_size) if not self.lsa_first <= r < self.lsa_first + self.lsa_size]

    # -- SymmetricMemory ----------------------------------------------------------------------
    @property
    def local(self) -> torch.Tensor:
        if self._local is None:
            raise SymmoeError("nccl: the symmetric memory is closed")
        return self._local

    @property
    def peer_bases(self) -> torch.Tensor:
        if self._bases is None:
            raise SymmoeError("nccl: the symmetric memory is closed")
        return self._bases

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def maps_every_peer(self) -> bool:
        return not self._gin_ranks()  # the LSA team is the whole group

    def peer(self, rank: int) -> torch.Tensor:
        base = int(self.peer_bases[rank]) if self._bases is not None else 0
        if not base:
            raise SymmoeError(f"nccl: rank {rank} is outside this rank's LSA team and has no load/store view "
                              "(reached through GIN puts)")
        return _tensor_at(base, self.nbytes, self._device)

    def transports(self) -> dict[str, list[int]]:
        """Which transport reaches each world rank: LSA load/store inside the NVLink
        domain (this rank included), GIN puts and signals outside it."""
        lsa = list(range(self.lsa_first, self.lsa_first + self.lsa_size))
        return {"lsa": lsa, "gin": self._gin_ranks()}

    @property
    def window(self) -> int:
        """The ncclWindow_t (device pointer) of the segment, for kernels that use GIN."""
        return int(self._win.handle)

    @property
    def devcomm(self) -> Any:
        """The extension's DevComm (ncclDevComm by value for kernels)."""
        return self._devcomm

    def barrier(self, stage: str = "barrier", flags_offset: int | None = None) -> None:
        """Device barrier on the current stream: NCCL's LSA barrier session inside the LSA
        team, GIN signals outside it; a wait past ``kernel.timeout_s`` raises StallError.
        ``flags_offset`` is accepted for the host protocol's signature and not used: NCCL
        keeps the barrier state in the device communicator's own resource window."""
        ext = _ext()
        self._epoch += 1
        n_remote = self.world_size - self.lsa_size
        stream = torch.cuda.current_stream(self._device)
        self._status.zero_()
        _ext_call("barrier kernel", ext.barrier, self._devcomm, 0, BARRIER_SIGNAL, self._epoch * n_remote,
                  float(self.timeout_s), self._status.data_ptr(), stream.cuda_stream)
        status = self._status.tolist()  # synchronises the stream
        if status[0]:
            late = status[1]
            what = (f"no arrival from rank {late} over LSA" if status[0] == 1 else
                    "GIN barrier signals from ranks outside the LSA team did not all arrive")
            raise StallError(self.rank, stage, self.timeout_s, what)

    def _release(self) -> None:
        """Device communicator, window, segment, communicator: in that order, each step
        attempted even if an earlier one failed; the first failure is raised at the end."""
        first: BaseException | None = None
        b = None
        try:
            b = _bindings()
        except ImportError:
            pass
        if self._comm is not None:
            try:
                torch.cuda.synchronize(self._device)
            except BaseException as e:  # noqa: BLE001
                first = first or e
        self._local = None
        self._bases = None
        if self._devcomm is not None:
            try:
                _ext_call("ncclDevCommDestroy", self._devcomm.destroy)
            except BaseException as e:  # noqa: BLE001
                first = first or e
            self._devcomm = None
        if self._win is not None and b is not None:
            try:
                if int(self._win.handle):
                    _nccl_call("ncclCommWindowDeregister", b.comm_window_deregister, self._comm._comm, self._win)
            except BaseException as e:  # noqa: BLE001
                first = first or e
            self._win = None
        if self._ptr and b is not None:
            try:
                _nccl_call("ncclMemFree", b.mem_free, self._ptr)
            except BaseException as e:  # noqa: BLE001
                first = first or e
            self._ptr = 0
        if self._comm is not None:
            try:
                _nccl_call("ncclCommFinalize", b.comm_finalize, self._comm._comm)
                self._comm.destroy()
            except BaseException as e:  # noqa: BLE001
                first = first or e
            self._comm = None
        if first is not None:
            raise first


class _DeviceArray:
    """Just enough ``__cuda_array_interface__`` for torch to wrap a raw device pointer."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def _tensor_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    if not ptr:
        raise SymmoeError("nccl: no load/store address for this segment")
    with torch.cuda.device(device):
        return torch.as_tensor(_DeviceArray(ptr, nbytes), device=device)


def describe() -> dict[str, Any]:
    """Versions and the way peer bases are found, for ``symmoe info``."""
    out: dict[str, Any] = {}
    try:
        v = runtime_version()
        import nccl.core as nc  # noqa: PLC0415
        out["libnccl"] = _fmt_version(v)
        out["nccl4py"] = nc.__version__
        out["lsa_pointers"] = ("host ncclGetLsaDevicePointer" if v >= HOST_LSA_POINTER_VERSION
                               else "one-time ncclGetLsaPointer kernel (NCCL 2.28)")
    except Exception as e:  # noqa: BLE001
        out["error"] = str(e)
    out["transports"] = "lsa: load/store inside the NVLink domain; gin: puts + signals outside it"
    return out
