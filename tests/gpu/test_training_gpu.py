"""Training through the torch backend on the GPU: the same checks as tests/test_training.py,
with CUDA tensors, at world size 1 and 2 processes on one GPU (CUDA MPS, overlapping devices
allowed)."""
from __future__ import annotations

import pytest

from conftest import gpu_unusable, on_ranks
from symmoe.config import Config
from symmoe.testing.training import GRAD_ROUTINGS, check_autograd, check_compiled_layer, check_layer
from symmoe.workload import Routing

pytestmark = pytest.mark.gpu

LAYER = {"ffn_hidden": 64, "shared_ffn_hidden": 32}


@pytest.fixture(autouse=True)
def _usable():
    from symmoe.backends.torch_symm import TorchSymmMemory
    reason = TorchSymmMemory.unavailable_reason()
    if reason:
        gpu_unusable(f"torch backend unusable here: {reason}")


def gpu_config(**over) -> dict:
    base = {"backend": "torch", "buffer.hidden": 128, "buffer.max_tokens_per_rank": 64, "buffer.topk": 4,
            "buffer.num_experts": 16, "buffer.expert_alignment": 4, "buffer.dtype": "bfloat16",
            "kernel.timeout_s": 30.0, "kernel.num_sms": 16, "torch.allow_overlapping_devices": True}
    base.update(over)
    return Config().replace(**base).to_dict()


_on_ranks = on_ranks


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_gradients_are_the_references_combine_and_dispatch_bitwise(world_size, protocol, seed):
    cfg = gpu_config(protocol=protocol)
    got = _on_ranks(check_autograd, world_size, (cfg, seed + world_size, ("rank", "expert"), (False, True), "cuda"))
    assert got == [len(GRAD_ROUTINGS) * 4] * world_size
    got = _on_ranks(check_autograd, world_size, (cfg, seed + 9, ("rank", "expert"), (True,), "cuda", True))
    assert got == [len(GRAD_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_layer_matches_a_single_process_moe(world_size, layout, seed):
    """fp32 rows (the loop over experts), 1e-4: cuBLAS and the CPU's GEMMs round differently."""
    cfg = gpu_config(protocol="pull", **{"buffer.dtype": "float32"})
    _on_ranks(check_layer, world_size, (cfg, seed + 70, dict(LAYER, output_layout=layout, num_worst_tokens="auto"),
                                        Routing("masked", mask_prob=0.3), "cuda", 1e-4, 1e-4))


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_the_grouped_gemm_layer_matches_a_single_process_moe_in_bfloat16(layout, seed):
    """bfloat16 rows through torch._grouped_mm against the CPU's bfloat16 MoE: 3e-2, a few
    bfloat16 ulps (2^-8 relative each) of GEMMs that round their outputs at other points."""
    cfg = gpu_config(protocol="push")
    _on_ranks(check_layer, 2, (cfg, seed + 80, dict(LAYER, output_layout=layout), Routing("masked", mask_prob=0.3),
                               "cuda", 3e-2, 3e-2))


def test_layer_gradients_are_bitwise_equal_across_protocols(seed):
    digests = [_on_ranks(check_layer, 2, (gpu_config(protocol=p), seed + 90, LAYER, Routing("masked", mask_prob=0.3),
                                          "cuda", 3e-2, 3e-2)) for p in ("push", "pull", "push")]
    assert digests[0] == digests[1] == digests[2], digests


def test_torch_compile_fullgraph_compiles_the_layer_with_inductor(seed):
    cfg = gpu_config(protocol="pull", **{"buffer.dtype": "float32", "buffer.max_tokens_per_rank": 32})
    got = _on_ranks(check_compiled_layer, 2, (cfg, seed + 100, "inductor", LAYER, "cuda"))
    assert [g["frames"] for g in got] == [1, 1], got
