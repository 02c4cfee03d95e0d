"""The low-latency mode on the GPU (torch backend): the kernels bitwise against the reference
at world size 1, 2 and 4 (processes sharing the GPU under MPS), with and without receive
hooks, FP8 rows included; a captured CUDA graph of dispatch -> expert op -> combine replayed 1000 times; DeepEP
V2's decode step (ElasticBuffer, symmoe_low_latency) captured and replayed, the normal mode refusing capture; the
MoE layer's inference forward captured and replayed; and a rank that never sends making the
others raise StallError naming the stage."""
from __future__ import annotations

import pytest

from symmoe.testing.checks import CHECK_ROUTINGS
from symmoe.testing.low_latency import (absent_rank_low_latency, check_elastic_graph_replay, check_graph_replay,
                                       check_layer_low_latency, check_low_latency, check_low_latency_fp8)

from test_torch_backend import _on_ranks, _usable, gpu_config  # noqa: F401  (the fixture too)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size, hidden", [(1, 256), (2, 256), (4, 256), (2, 7168), (4, 7168)])
def test_low_latency_dispatch_and_combine_match_the_reference_bitwise(world_size, hidden, seed):
    cfg = gpu_config(**{"buffer.hidden": hidden})
    T_max = 128 if hidden == 7168 else 48
    counts = _on_ranks(check_low_latency, world_size, (cfg, seed + world_size, T_max, CHECK_ROUTINGS, "cuda",
                                                      (False, True), 1))
    assert counts == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("world_size, hidden", [(2, 2048), (4, 7168)])
def test_fp8_dispatch_moves_e4m3_rows_and_scales_bitwise(world_size, hidden, seed):
    cfg = gpu_config(**{"buffer.hidden": hidden})
    assert _on_ranks(check_low_latency_fp8, world_size, (cfg, seed + 21, 64, "cuda")) == [6] * world_size


@pytest.mark.parametrize("round_scale", [False, True])
def test_the_fp8_rows_kernel_equals_quantize_and_pack_bitwise(round_scale, seed):
    """One kernel does use_fp8's cast (kernels/fp8_pack.cuh); its rows equal symmoe.fp8's torch
    ops on the same GPU bit for bit, on blocks that probe the cast's edges: all zeros (amax
    clamped to 1e-4), amax exactly 448 times a power of two, values that land on e4m3
    subnormals, and bfloat16's largest magnitudes."""
    import torch

    from symmoe import build, fp8
    from symmoe.low_latency import fp8_row_bytes
    g = torch.Generator().manual_seed(seed)
    T, H = 37, 1024
    x = torch.randn(T, H, generator=g) * torch.exp2(torch.randint(-12, 12, (T, 1), generator=g).float())
    x[0] = 0
    x[1, :128] = 448.0 * 2.0 ** -3
    x[2, 128:256] *= 1e-6
    x[3, 256:384] = torch.finfo(torch.bfloat16).max * torch.sign(torch.randn(128, generator=g))
    x = x.to(torch.bfloat16).cuda()
    want = fp8.pack(*fp8.quantize(x, "float32", round_scale), torch.zeros_like(x))
    got = torch.zeros_like(x)
    build.load("symmoe_ll").fp8_pack(x.data_ptr(), got.data_ptr(), T, H, round_scale,
                                     torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    moved = fp8_row_bytes(H)  # what the dispatch moves of each row
    assert torch.equal(got.view(torch.uint8)[:, :moved], want.view(torch.uint8)[:, :moved])


@pytest.mark.parametrize("hooks", [False, True])
def test_a_captured_step_replays_1000_times_bitwise_equal_to_eager(hooks, seed):
    cfg = gpu_config(**{"buffer.hidden": 2048})
    assert _on_ranks(check_graph_replay, 2, (cfg, seed + 3, 64, 1000, 100, hooks)) == [10, 10]


def test_deep_ep_v2s_decode_step_is_captured_on_the_low_latency_engine_and_the_normal_mode_refuses(seed):
    cfg = gpu_config(**{"buffer.hidden": 2048})
    assert _on_ranks(check_elastic_graph_replay, 2, (cfg, seed + 5, 64, 200, 50)) == [4, 4]


def test_a_captured_moe_layer_inference_forward_replays_bitwise_equal_to_eager(seed):
    cfg = gpu_config(**{"buffer.hidden": 2048})
    layer = {"ffn_hidden": 256, "shared_ffn_hidden": 128, "seed": seed % 1000}
    assert _on_ranks(check_layer_low_latency, 2, (cfg, seed + 9, layer, 64, "cuda", 20)) == [21, 21]


def test_a_rank_that_never_sends_makes_the_others_raise_stall_error_naming_the_stage(seed):
    cfg = gpu_config(**{"kernel.timeout_s": 2.0})
    out = _on_ranks(absent_rank_low_latency, 2, (cfg, seed, 32))
    assert out[1] == "absent"
    assert out[0].startswith("StallError: rank 0: stage 'low_latency_dispatch.receive'"), out[0]
    assert "rank 1's rows" in out[0]
