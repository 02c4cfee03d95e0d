"""The CUDA extension modules compile (no GPU needed), and the kernel header mirrors the layout."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from symmoe import build
from symmoe.layout import BufferLayout

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"


def test_layout_header_mirrors_kernel_args():
    text = (CSRC / "common" / "layout.cuh").read_text()
    body = text[text.index("struct Layout {"):text.index("__host__")]
    names = re.findall(r"\b([a-z_]+)\b", " ".join(line.split("//")[0] for line in body.splitlines()))
    fields = [n for n in names if n not in ("struct", "int64_t")]
    assert fields == list(BufferLayout.KERNEL_FIELDS + BufferLayout.KERNEL_OFFSETS)
    m = re.search(r"kLayoutArgs = (\d+) \+ (\d+);", text)
    assert int(m.group(1)) + int(m.group(2)) == len(fields)


def test_kernel_args_carry_a_dispatch_s_row_bytes():
    """Full rows by default; an FP8 dispatch's narrower rows (16-byte multiples) where asked,
    with every other field as it was."""
    lay = BufferLayout(2, 64, 7168, 8, 32, 2)
    at = BufferLayout.KERNEL_FIELDS.index("x_row_bytes")
    full, narrow = lay.kernel_args(), lay.kernel_args(7392)
    assert full[at] == lay.x_row_bytes == 14336 and narrow[at] == 7392
    assert full[:at] + full[at + 1:] == narrow[:at] + narrow[at + 1:]
    for bad in (7400, 14352, -16):
        with pytest.raises(ValueError, match=f"row_bytes={bad}: must be 0 .* multiple of 16 in 16..14336"):
            lay.kernel_args(bad)


def test_gencode_default_and_override(monkeypatch):
    monkeypatch.delenv("SYMMOE_ARCH", raising=False)
    assert build.gencode() == ["-gencode=arch=compute_90a,code=sm_90a"]
    monkeypatch.setenv("SYMMOE_ARCH", "sm_90a,sm_100a")
    assert build.gencode()[1] == "-gencode=arch=compute_100a,code=sm_100a"
    monkeypatch.setenv("SYMMOE_ARCH", "hopper")
    with pytest.raises(build.BuildError):
        build.gencode()


def test_the_cache_key_follows_sources_headers_arch_compiler_and_library_versions(tmp_path, monkeypatch):
    """A cached module is reused only when nothing that went into it changed."""
    csrc = tmp_path / "csrc"
    shutil.copytree(CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "nvcc_version", lambda nvcc: "13.0")
    monkeypatch.setenv("SYMMOE_ARCH", "sm_90a")
    from symmoe.protocol.nvshmem import SPEC as spec  # registers the module
    assert spec.lib_dists, "the nvshmem module records its library's version"
    key = lambda: build.cache_key(spec, "nvcc")  # noqa: E731
    seen = {key()}
    assert key() in seen  # nothing changed: the same key

    monkeypatch.setenv("SYMMOE_ARCH", "sm_100a")
    seen.add(key())
    monkeypatch.setenv("SYMMOE_ARCH", "sm_90a")
    monkeypatch.setattr(build, "nvcc_version", lambda nvcc: "13.1")
    seen.add(key())
    monkeypatch.setattr(build, "nvcc_version", lambda nvcc: "13.0")
    real = build.dist_version
    monkeypatch.setattr(build, "dist_version", lambda d: "9.9.9" if d == spec.lib_dists[0] else real(d))
    seen.add(key())
    monkeypatch.setattr(build, "dist_version", real)
    header = csrc / "common" / "layout.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    seen.add(key())
    source = csrc / spec.sources[0]
    source.write_text(source.read_text() + "\n// edited\n")
    seen.add(key())
    assert len(seen) == 6  # the original and one new key per change


@pytest.mark.build
def test_every_registered_module_compiles(tmp_path, monkeypatch):
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("SYMMOE_CACHE", str(tmp_path))
    build._register_optional()
    assert "symmoe_cuda" in build.EXTENSIONS
    no_driver = []
    for name in list(build.EXTENSIONS):
        try:
            path = build.build(name)
        except build.BuildError as e:
            # Compiled, but the final link wants the driver library, absent on GPU-less machines.
            if "cannot find -lcuda" in str(e) and name != "symmoe_cuda":
                no_driver.append(name)
                continue
            raise
        assert path.exists() and path.stat().st_size > 0
        if not build.EXTENSIONS[name].needs_rdc:  # relocatable device code keeps such stubs of every __device__ function
            assert not _imports_exit(path), f"{name}: its host code calls exit (a __device__ function called from the host?)"
    if no_driver:
        pytest.skip(f"compiled all; {', '.join(no_driver)} link(s) against libcuda, which this machine lacks")


def _imports_exit(so: Path) -> bool:
    """Whether a built module's host code calls exit / _exit. Ours never does; nvcc compiles a
    __device__ function that host code calls, without a word, into a host stub that calls
    exit(1), so a dispatch ends its process with code 1 and prints nothing. (Built as
    relocatable device code, every non-inline __device__ function has such a stub: NVSHMEM's.)"""
    nm = shutil.which("nm")
    assert nm, "binutils' nm is missing (the linker's package, which nvcc's host compiler needs)"
    out = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True, check=True).stdout
    return any(line.split()[-1].split("@")[0] in ("exit", "_exit") for line in out.splitlines() if line.strip())


def test_build_all_builds_the_modules_at_once_and_names_every_failure(monkeypatch):
    import threading

    names = ["a", "b", "c"]
    monkeypatch.setattr(build, "EXTENSIONS", {n: None for n in names})
    monkeypatch.setattr(build, "_register_optional", lambda: None)
    started, lock = threading.Barrier(len(names), timeout=10), threading.Lock()
    seen = []

    def fake(name, force=False, verbose=False):
        started.wait()  # raises BrokenBarrierError unless all three run at the same time
        with lock:
            seen.append(name)
        if name != "b":
            raise build.BuildError(f"compiling {name}.cu failed")
        return Path(f"/cache/{name}.so")

    monkeypatch.setattr(build, "build", fake)
    with pytest.raises(build.BuildError) as e:
        build.build_all()
    assert sorted(seen) == names
    assert "a: compiling a.cu failed" in str(e.value) and "c: compiling c.cu failed" in str(e.value)
    monkeypatch.setattr(build, "build", lambda name, force=False, verbose=False: Path(f"/cache/{name}.so"))
    assert build.build_all(["c", "a"]) == {"c": Path("/cache/c.so"), "a": Path("/cache/a.so")}


@pytest.mark.build
def test_compile_error_is_a_build_error_with_compiler_output(tmp_path, monkeypatch):
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("SYMMOE_CACHE", str(tmp_path / "cache"))
    # A copy of the sources: the broken file never enters the project's csrc/.
    csrc = tmp_path / "csrc"
    shutil.copytree(CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    (csrc / "bindings" / "_broken_for_test.cu").write_text("this is not C++;\n")
    monkeypatch.setitem(build.EXTENSIONS, "_broken_for_test",
                        build.ExtensionSpec(name="_broken_for_test", sources=("bindings/_broken_for_test.cu",)))
    with pytest.raises(build.BuildError, match="compiling bindings/_broken_for_test.cu"):
        build.build("_broken_for_test")


def test_the_host_module_s_key_follows_its_source_compiler_torch_and_flags(tmp_path, monkeypatch):
    """symmoe_host (torch's C++ API, the C++ compiler) is rebuilt when its source, the compiler,
    torch or its flags change; the kernel headers under csrc/ do not key it."""
    import torch

    csrc = tmp_path / "csrc"
    shutil.copytree(CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "_tool_version", lambda tool: "c++ 12")
    spec = build.EXTENSIONS["symmoe_host"]
    assert spec.compiler == "torch"
    key = lambda: build.cache_key(spec, "c++")  # noqa: E731
    seen = {key()}
    header = csrc / "common" / "layout.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    assert key() in seen  # a kernel header: the same key
    monkeypatch.setattr(build, "_tool_version", lambda tool: "c++ 13")
    seen.add(key())
    monkeypatch.setattr(build, "_tool_version", lambda tool: "c++ 12")
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    seen.add(key())
    monkeypatch.undo()
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "_tool_version", lambda tool: "c++ 12")
    monkeypatch.setattr(build, "TORCH_CXX_FLAGS", build.TORCH_CXX_FLAGS + ("-g",))
    seen.add(key())
    monkeypatch.setattr(build, "TORCH_CXX_FLAGS", build.TORCH_CXX_FLAGS[:-1])
    source = csrc / spec.sources[0]
    source.write_text(source.read_text() + "\n// edited\n")
    seen.add(key())
    assert len(seen) == 5  # the original and one new key per change
