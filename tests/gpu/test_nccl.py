"""nccl backend on one GPU (world size 1: NCCL refuses two ranks on one GPU).

Skipped without a CUDA GPU (conftest) or without nccl4py / a usable NCCL."""
from __future__ import annotations

import gc

import pytest
import torch

from conftest import gpu_unusable

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _nccl():
    from symmoe.backends import nccl
    reason = nccl.NcclMemory.unavailable_reason()
    if reason:
        gpu_unusable(f"nccl backend unusable here: {reason}")
    return nccl


def _free_bytes() -> int:
    torch.cuda.synchronize()
    gc.collect()
    return torch.cuda.mem_get_info()[0]


def test_window_peer_bases_and_local_view():
    nccl = _nccl()
    with nccl.NcclMemory(None, 3 * MiB + 123) as mem:
        assert mem.local.dtype == torch.uint8 and mem.local.numel() == 3 * MiB + 123
        assert mem.local.is_cuda
        bases = mem.peer_bases.tolist()
        assert len(bases) == 1 and bases[0] == mem.local.data_ptr()
        # local is NCCL's LSA mapping of the segment, not ncclMemAlloc's address, but the
        # same physical memory: a store through one shows through the other.
        assert mem._ptr != 0
        raw = nccl._tensor_at(mem._ptr, mem.nbytes, mem.device)
        raw[:4096] = torch.arange(4096, device=mem.device, dtype=torch.int64).to(torch.uint8)
        torch.cuda.synchronize()
        assert torch.equal(mem.local[:4096], raw[:4096])
        assert int(mem.local[4096:].count_nonzero()) == 0  # cleared at set-up
        assert mem.transports() == {"lsa": [0], "gin": []}
        assert mem.lsa_size == 1 and mem.devcomm.gin_contexts == 0
        mem.barrier("test")  # LSA barrier session of one rank


def test_register_teardown_20x_no_leak():
    nccl = _nccl()
    size = 256 * MiB
    with nccl.NcclMemory(None, size):  # first round: NCCL's one-time state and caches
        pass
    before = _free_bytes()
    for _ in range(20):
        mem = nccl.NcclMemory(None, size)
        mem.local[:8].fill_(1)
        mem.barrier("loop")
        mem.close()
    after = _free_bytes()
    # 20 leaked segments would be 5 GiB; allow a little allocator noise.
    assert before - after < 64 * MiB, f"device memory dropped by {(before - after) / MiB:.1f} MiB over 20 rounds"


def test_nccl_error_is_a_symmoe_error():
    nccl = _nccl()
    from symmoe.errors import SymmoeError
    # ncclMemAlloc of more than the device holds: the error names the call and NCCL's result.
    with pytest.raises(SymmoeError, match=r"ncclMemAlloc failed: .*ncclResult_t") as ei:
        nccl.NcclMemory(None, 1 << 50)
    assert isinstance(ei.value, nccl.NcclError) and ei.value.call == "ncclMemAlloc"
    # A pointer NCCL never allocated, through the extension's own error path.
    ext = nccl._ext()
    with pytest.raises(SymmoeError, match=r"ncclMemFree failed: .*ncclResult_t"):
        nccl._ext_call("ncclMemFree", ext.mem_free, 0xdead000)
    # Still usable afterwards.
    with nccl.NcclMemory(None, MiB) as mem:
        mem.barrier("after-error")


def test_closed_memory_says_so():
    nccl = _nccl()
    from symmoe.errors import SymmoeError
    mem = nccl.NcclMemory(None, MiB)
    mem.close()
    mem.close()  # idempotent
    with pytest.raises(SymmoeError, match="closed"):
        _ = mem.local


def _small_config(**over):
    cfg = {"backend": "nccl",
           "buffer": {"hidden": 256, "max_tokens_per_rank": 96, "topk": 4, "num_experts": 16,
                      "expert_alignment": 4, "dtype": "bfloat16"},
           "kernel": {"timeout_s": 20.0, "num_sms": 8, "num_channels": 2}}
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_dispatch_combine_bitwise(dtype, seed):
    _nccl()
    from symmoe.testing import CHECK_ROUTINGS, check_dispatch_combine
    cfg = _small_config()
    cfg["buffer"]["dtype"] = dtype
    # every routing kind, both layouts, twice on the same buffer
    assert check_dispatch_combine(0, 1, cfg, seed=seed, device="cuda", repeats=2) == len(CHECK_ROUTINGS) * 2 * 2


@pytest.mark.parametrize("phases", ["off", "block", "grid", "steal"])
def test_fan_out_in_phases_bitwise(phases, seed):
    """kernel.fan_phases: the expert-major fan-out in phases of whole rows (several rounds:
    1024 tokens on 8 blocks), on the window's LSA transport as on torch's."""
    _nccl()
    from symmoe.testing import CHECK_ROUTINGS, check_dispatch_combine
    cfg = _small_config()
    cfg["buffer"]["max_tokens_per_rank"] = 1024
    cfg["kernel"]["fan_phases"] = phases
    assert check_dispatch_combine(0, 1, cfg, seed=seed + 4, device="cuda", layouts=("expert",)) == len(CHECK_ROUTINGS)


def test_the_routing_kernel_leaves_the_host_the_matrix_s_summary(seed):
    _nccl()
    from symmoe.testing import CHECK_ROUTINGS, check_counts_summary
    assert check_counts_summary(0, 1, _small_config(), seed=seed + 1) == 3 * len(CHECK_ROUTINGS)


def test_num_worst_tokens_outputs(seed):
    """num_worst_tokens=N: the reference's rows, then x 0, ids -1, weights 0 up to N rows."""
    _nccl()
    from symmoe.testing import CHECK_ROUTINGS, check_num_worst_tokens
    assert check_num_worst_tokens(0, 1, _small_config(), seed=seed + 2, device="cuda") == len(CHECK_ROUTINGS) * 2


def test_cached_dispatch_bitwise(seed):
    """dispatch(x, handle=...) after other dispatches: the reference's rows for the new x."""
    _nccl()
    from symmoe.testing import CHECK_ROUTINGS, check_cached_dispatch
    assert check_cached_dispatch(0, 1, _small_config(), seed=seed + 3, device="cuda") == len(CHECK_ROUTINGS) * 2
