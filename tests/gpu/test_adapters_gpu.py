"""The framework adapters over the torch backend on the GPU: the same checks as
tests/test_adapters.py with CUDA tensors, at world size 1 and 2 processes on one GPU (CUDA MPS,
overlapping devices allowed), and the layer benchmark for one step."""
from __future__ import annotations

import importlib.util
import json

import pytest

from symmoe.testing.adapters import check_megatron, check_torchtitan
from symmoe.testing.training import GRAD_ROUTINGS

from test_training_gpu import _on_ranks, _usable, gpu_config  # noqa: F401  (_usable: skips without the torch backend)

pytestmark = pytest.mark.gpu
CASES = len(GRAD_ROUTINGS)


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_megatron_manager_is_plain_torchs_bitwise_on_the_gpu(world_size, protocol, seed):
    assert _on_ranks(check_megatron, world_size, (gpu_config(protocol=protocol), seed + world_size, "manager",
                                                  "cuda")) == [CASES] * world_size


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_megatrons_flex_dispatcher_runs_the_symmoe_manager_on_the_gpu(seed):
    assert _on_ranks(check_megatron, 2, (gpu_config(), seed + 5, "megatron", "cuda")) == [CASES] * 2


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_torchtitan_dispatcher_is_plain_torchs_bitwise_on_the_gpu(world_size, protocol, seed):
    assert _on_ranks(check_torchtitan, world_size, (gpu_config(protocol=protocol), seed + 30 + world_size,
                                                    "cuda")) == [CASES] * world_size


def test_the_layer_bench_runs_every_variant_on_the_gpu_and_they_agree_bitwise(tmp_path):
    """A small shape for one step: torch push and pull, the V1 shim, all_to_all_single (and DeepEP
    V1 where deep_ep imports), outputs and x gradients bitwise equal."""
    from symmoe.bench import layer
    out = tmp_path / "layer.json"
    rc = layer.main(["--world-sizes", "2", "--tokens", "256", "--config", "torch-push=configs/torch.yaml,protocol=push",
                     "--config", "torch-pull=configs/torch.yaml,protocol=pull", "--hidden", "512", "--topk", "8", "--experts", "32",
                     "--ffn-hidden", "256", "--repeats", "1", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    (res,) = json.loads(out.read_text())["results"]
    assert all(res["bitwise_vs_first"]["256"].values()), res["bitwise_vs_first"]
