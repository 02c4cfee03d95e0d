"""JIT build of symmoe's CUDA extension modules (pybind11 + nvcc), cached on disk.

Each module is an :class:`ExtensionSpec` in :data:`EXTENSIONS`; backends that need their own
module (nvshmem, nccl) add a spec with :func:`register`. :func:`load` builds on first use and
imports the shared object; :func:`build_all` prebuilds everything (``symmoe build``).

Raw pointers and CUDA streams cross into the kernel modules as Python ints, so they need no
torch C++ header. One host module (``symmoe_host``, ``compiler="torch"``) makes a dispatch's
tensors with torch's C++ API instead, built by the C++ compiler. Every module compiles against
a CPU-only torch (CI) just as on the GPU machine.

Cache: ``$SYMMOE_CACHE`` or ``~/.cache/symmoe``, one folder per module and key; the key
hashes the sources and every header under ``csrc/``, the GPU architecture
(``$SYMMOE_ARCH``, default ``sm_90a``), the nvcc version, the Python ABI, pybind11 and the
versions of the libraries the spec names. Concurrent builders (several ranks) serialise on a
file lock; the finished module is moved into place atomically.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable

from .errors import BuildError

CSRC = Path(__file__).resolve().parent.parent / "csrc"
DEFAULT_ARCH = "sm_90a"


@dataclass(frozen=True)
class ExtensionSpec:
    """One pybind11 extension module. Paths in ``sources`` are relative to ``csrc/``."""

    name: str  # the PYBIND11_MODULE name
    sources: tuple[str, ...]
    include_dirs: Callable[[], list[str]] = field(default=lambda: [], compare=False)
    link_flags: Callable[[], list[str]] = field(default=lambda: [], compare=False)  # passed to the final link
    needs_rdc: bool = False  # relocatable device code + a device-link step (NVSHMEM)
    dlink_flags: Callable[[], list[str]] = field(default=lambda: [], compare=False)  # the device-link step
    lib_dists: tuple[str, ...] = ()  # pip distributions whose versions key the cache
    extra_nvcc: tuple[str, ...] = ()
    description: str = ""
    # "nvcc": CUDA kernels bound with pybind11, pointers as ints (no torch header). "torch": host
    # C++ over torch's C++ API and its pybind11 (tensors in and out), compiled by the C++ compiler.
    compiler: str = "nvcc"


EXTENSIONS: dict[str, ExtensionSpec] = {}
_LOADED: dict[str, ModuleType] = {}


def register(spec: ExtensionSpec) -> ExtensionSpec:
    EXTENSIONS[spec.name] = spec
    return spec


register(ExtensionSpec(
    name="symmoe_cuda",
    sources=("bindings/symmoe_cuda.cu",),
    description="kernels over load/store peers (torch symmetric memory); the one-rank dispatch kernels (nvshmem alone)",
))
register(ExtensionSpec(
    name="symmoe_host",
    sources=("host/tensors.cpp",),
    compiler="torch",
    description="the GPU protocols' output tensors (dispatch, combine, FP8 split, low latency), made and cut in C++",
))
register(ExtensionSpec(
    name="symmoe_ll",
    sources=("bindings/low_latency.cu",),
    description="the low-latency mode's kernels over load/store peers (torch symmetric memory, nvshmem on one node)",
))


# -- tool discovery ------------------------------------------------------------------------
def nvcc_path() -> str | None:
    cand = os.environ.get("NVCC")
    if cand and Path(cand).exists():
        return cand
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, (V[\w.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def arch() -> str:
    return os.environ.get("SYMMOE_ARCH", DEFAULT_ARCH)


def gencode(a: str | None = None) -> list[str]:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (the form nvcc 13.0 assembles
    sm_90a-only instructions with; ``-arch=sm_90a`` also runs a plain sm_90 pass)."""
    a = a or arch()
    out = []
    for one in a.replace(";", ",").split(","):
        one = one.strip()
        m = re.fullmatch(r"sm_(\d+[a-z]?)", one)
        if not m:
            raise BuildError(f"SYMMOE_ARCH={a!r}: expected names like sm_90a (comma-separated for several)")
        out.append(f"-gencode=arch=compute_{m.group(1)},code=sm_{m.group(1)}")
    return out


def pybind11_includes() -> list[str]:
    try:
        import pybind11
    except ImportError:
        raise BuildError("pybind11 is not installed (pip install pybind11): the CUDA modules are bound with it") from None
    return [pybind11.get_include(), sysconfig.get_paths()["include"]]


def site_include(package: str) -> str:
    """Header folder of an NVIDIA pip wheel, e.g. ``nvshmem`` -> site-packages/nvidia/nvshmem/include."""
    return str(site_lib_root(package) / "include")


def site_lib_root(package: str) -> Path:
    import importlib

    try:
        mod = importlib.import_module(f"nvidia.{package}")
    except ImportError:
        raise BuildError(f"nvidia.{package} is not installed (its pip wheel provides the headers)") from None
    paths = list(getattr(mod, "__path__", []))
    if not paths:
        raise BuildError(f"nvidia.{package} has no folder on disk")
    return Path(paths[0])


def dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def cache_root() -> Path:
    return Path(os.environ.get("SYMMOE_CACHE") or Path.home() / ".cache" / "symmoe")


def ext_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


# -- keys and paths -------------------------------------------------------------------------
def _headers() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cuh", ".h", ".hpp", ".inc"))


def cxx_path() -> str | None:
    """The C++ compiler of the ``torch`` modules: $CXX, else c++ or g++ on PATH."""
    cand = os.environ.get("CXX")
    if cand and shutil.which(cand):
        return shutil.which(cand)
    return shutil.which("c++") or shutil.which("g++")


def compiler_path(spec: ExtensionSpec) -> str:
    """The compiler that builds ``spec``; BuildError when this machine has none."""
    if spec.compiler == "torch":
        cxx = cxx_path()
        if cxx is None:
            raise BuildError(f"{spec.name}: no C++ compiler found (set CXX or put c++ on PATH)")
        return cxx
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found (set NVCC or CUDA_HOME, or put it on PATH): needed to build the CUDA kernels")
    return nvcc


def cache_key(spec: ExtensionSpec, compiler: str) -> str:
    """The key of ``spec`` built by ``compiler`` (``compiler_path``: nvcc, or the C++ compiler of a
    ``torch`` module)."""
    h = hashlib.sha256()
    for rel in spec.sources:
        p = CSRC / rel
        if not p.exists():
            raise BuildError(f"{spec.name}: source {p} is missing")
        h.update(rel.encode() + b"\0" + p.read_bytes())
    if spec.compiler == "torch":  # its one source includes only torch's headers
        import torch

        parts = [_tool_version(compiler), ext_suffix(), torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI),
                 *TORCH_CXX_FLAGS]
        h.update("\0".join(parts).encode())
        return h.hexdigest()[:20]
    for p in _headers():
        h.update(str(p.relative_to(CSRC)).encode() + b"\0" + p.read_bytes())
    try:
        import pybind11
        pyb = pybind11.__version__
    except ImportError:
        pyb = "absent"
    parts = [arch(), nvcc_version(compiler), ext_suffix(), pyb, repr(spec.extra_nvcc), str(spec.needs_rdc)]
    parts += [f"{d}={dist_version(d)}" for d in spec.lib_dists]
    h.update("\0".join(parts).encode())
    return h.hexdigest()[:20]


def _tool_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
    return out.splitlines()[0] if out else "unknown"


def module_path(spec: ExtensionSpec, key: str) -> Path:
    return cache_root() / f"{spec.name}-{key}" / f"{spec.name}{ext_suffix()}"


# -- building -------------------------------------------------------------------------------
def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


TORCH_CXX_FLAGS = ("-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden")  # C++20 as torch's own extensions


def _compile_torch(spec: ExtensionSpec, cxx: str, out: Path, log: list[str]) -> None:
    """A ``torch`` module: its sources against torch's headers (and the pybind11 torch ships),
    linked to torch's libraries, which torch has loaded by the time the module is imported."""
    import torch
    from torch.utils import cpp_extension

    libs = cpp_extension.library_paths()
    cmd = [cxx, *TORCH_CXX_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-DTORCH_EXTENSION_NAME={spec.name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           *[f"-I{i}" for i in cpp_extension.include_paths()], f"-I{sysconfig.get_paths()['include']}",
           *[str(CSRC / rel) for rel in spec.sources],
           *[f"-L{d}" for d in libs], *[f"-Wl,-rpath,{d}" for d in libs],
           "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(out)]
    log.append(_run(cmd, f"compiling {', '.join(spec.sources)}"))


def _compile(spec: ExtensionSpec, compiler: str, out: Path, log: list[str]) -> None:
    if spec.compiler == "torch":
        _compile_torch(spec, compiler, out, log)
        return
    nvcc = compiler
    build = out.parent
    incs = [str(CSRC)] + pybind11_includes() + list(spec.include_dirs())
    common = gencode() + ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                          "-diag-suppress", "177,550"] + [f"-I{i}" for i in incs] + list(spec.extra_nvcc)
    if spec.needs_rdc:
        common.append("-rdc=true")

    def one(rel: str) -> str:
        obj = build / (Path(rel).name + ".o")
        log.append(_run([nvcc, *common, "-c", str(CSRC / rel), "-o", str(obj)], f"compiling {rel}"))
        return str(obj)

    with ThreadPoolExecutor(max_workers=max(1, min(len(spec.sources), os.cpu_count() or 1))) as pool:
        objs = list(pool.map(one, spec.sources))
    if spec.needs_rdc:
        dlink = str(build / "dlink.o")
        log.append(_run([nvcc, *gencode(), "-Xcompiler", "-fPIC", "-dlink", *objs, *spec.dlink_flags(), "-o", dlink],
                        "device link"))
        objs.append(dlink)
    log.append(_run([nvcc, *gencode(), "-shared", *objs, *spec.link_flags(), "-o", str(out)], "linking"))


def build(name: str, force: bool = False, verbose: bool = False) -> Path:
    """Build (or find in the cache) module ``name``; returns the shared object's path."""
    if name not in EXTENSIONS:
        raise BuildError(f"unknown extension {name!r}; registered: {', '.join(EXTENSIONS)}")
    spec = EXTENSIONS[name]
    compiler = compiler_path(spec)
    key = cache_key(spec, compiler)
    path = module_path(spec, key)
    if path.exists() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.parent / ".lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per key; the others wait, then reuse
        if path.exists() and not force:
            return path
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=path.parent, prefix="build-") as tmp:
            out = Path(tmp) / path.name
            log: list[str] = []
            _compile(spec, compiler, out, log)
            os.replace(out, path)
            (path.parent / "build.log").write_text("\n".join(x for x in log if x))
        if verbose:
            print(f"built {name} in {time.monotonic() - t0:.1f} s -> {path}")
    return path


def load(name: str) -> ModuleType:
    """Import module ``name``, building it first if needed."""
    if name in _LOADED:
        return _LOADED[name]
    path = build(name)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise BuildError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(mod)
    except ImportError as e:
        raise BuildError(f"{name}: built at {path} but cannot be imported: {e}") from e
    _LOADED[name] = mod
    return mod


def build_all(names: list[str] | None = None, force: bool = False, verbose: bool = True) -> dict[str, Path]:
    """Build every registered module (``symmoe build``), the modules at the same time: each is
    one nvcc process, and on the GPU machine's 16 cores three in turn cost 65-90 s of a device
    call. Raises BuildError naming every module that failed, once all have finished."""
    _register_optional()
    names = names or list(EXTENSIONS)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:  # a few modules: one nvcc each
        futures = {name: pool.submit(build, name, force, verbose) for name in names}
    out, failed = {}, []
    for name, fut in futures.items():
        try:
            out[name] = fut.result()
        except BuildError as e:
            failed.append(f"{name}: {e}")
    if failed:
        raise BuildError("\n".join(failed))
    return out


# Modules that call register() for their own specs (a backend may keep its spec next to its
# code); build_all imports them so that every spec is built, even where the backend's Python
# library (nvshmem4py, nccl4py) is absent. Specs may equally be registered in this file.
OPTIONAL_SPEC_MODULES: list[str] = ["symmoe.backends.nccl", "symmoe.protocol.nvshmem"]


def _register_optional() -> None:
    import importlib

    for mod in OPTIONAL_SPEC_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
