"""The nccl backend's extension compiles against the nvidia-nccl wheel's headers (no GPU needed)."""
import pytest

pytestmark = pytest.mark.build


def test_nccl_extension_builds_and_imports():
    from symmoe import build
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    try:
        build.site_include("nccl")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NCCL headers missing: {e}")
    from symmoe.backends import nccl
    if not nccl._cccl_include():
        pytest.skip("CCCL headers not found")
    mod = build.load(nccl.SPEC.name)
    assert mod.NCCL_VERSION_CODE >= 22800
    assert mod.STATUS_WORDS == 2 and mod.GIN_PUT_BYTES == 32
    assert issubclass(mod.NcclCallError, RuntimeError)


def test_nccl_call_errors_become_symmoe_errors():
    """A failing NCCL call through the extension raises NcclError (a SymmoeError) naming the
    call and NCCL's result string; no GPU needed (ncclMemFree of a foreign pointer fails)."""
    from symmoe import build
    from symmoe.errors import SymmoeError
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    from symmoe.backends import nccl
    if not nccl._cccl_include():
        pytest.skip("CCCL headers not found")
    mod = nccl._ext()
    with pytest.raises(SymmoeError, match=r"nccl backend: ncclMemFree failed: .+ \(ncclResult_t \d+\)") as ei:
        nccl._ext_call("ncclMemFree", mod.mem_free, 0xDEAD000)
    assert isinstance(ei.value, nccl.NcclError) and ei.value.call == "ncclMemFree" and ei.value.code
