"""The low-latency mode (DeepEP V1's low_latency_dispatch / low_latency_combine) on the host
backend: the reference's definition, the Buffer API and the V1 shim, bitwise against the
reference, and the errors of bad use."""
import pytest
import torch

from conftest import small_config
from symmoe import Buffer, reference
from symmoe.compat import UnsupportedArgument, UnsupportedCall
from symmoe.errors import CapacityError, InputError
from symmoe.launch import spawn
from symmoe.low_latency import LowLatencyLayout
from symmoe.testing.low_latency import (check_deep_ep_v1_low_latency, check_layer_low_latency, check_low_latency,
                                       check_low_latency_fp8)
from symmoe.workload import Routing

import symmoe.compat.deep_ep_v1 as deep_ep

T_MAX = 16


def test_reference_packs_each_expert_by_source_rank_then_token_and_reduces_in_slot_order():
    # 2 ranks, 4 experts (2 per rank); rank 1 has a masked slot and names expert 3 twice.
    xs = [torch.arange(1, 4, dtype=torch.bfloat16).view(3, 1).repeat(1, 8),
          torch.arange(11, 13, dtype=torch.bfloat16).view(2, 1).repeat(1, 8)]
    idxs = [torch.tensor([[2, 0], [3, 2], [0, 1]]), torch.tensor([[2, -1], [3, 3]])]
    ref = reference.low_latency_dispatch(xs, idxs, num_experts=4, num_max_dispatch_tokens_per_rank=4)
    r1 = ref.recv[1]
    assert r1.recv_count.tolist() == [3, 2]  # expert 2: rank 0 tokens 0, 1 then rank 1 token 0; expert 3: 0/1, 1/1
    assert r1.recv_x[0, :3, 0].tolist() == [1.0, 2.0, 11.0]
    assert r1.src_info[0, :3].tolist() == [0, 1, 0] and r1.src_info[1, :2].tolist() == [1, 1]
    assert r1.layout_range[0].tolist() == [(0 << 32) | 2, (2 << 32) | 1]
    assert r1.recv_x.shape == (2, 2 * 4, 8)
    ws = [torch.tensor([[0.5, 0.25], [1.0, 2.0], [1.0, 1.0]]), torch.tensor([[3.0, 9.0], [0.5, 0.25]])]
    ys = [r.recv_x * 2 for r in ref.recv]
    out = reference.low_latency_combine(ys, ref, idxs, ws, num_experts=4)
    assert out[1][0, 0].item() == 3.0 * 22.0  # the masked slot adds nothing
    assert out[1][1, 0].item() == (0.5 + 0.25) * 24.0  # both slots of expert 3 read its one row
    assert out[0][1, 0].item() == 1.0 * 4.0 + 2.0 * 4.0


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dispatch_and_combine_match_the_reference_bitwise_with_and_without_hooks(world_size, seed):
    cfg = small_config()
    counts = spawn(check_low_latency, world_size, args=(cfg.to_dict(), seed + world_size, T_MAX))
    assert counts == [12] * world_size


def test_repeated_calls_alternate_the_two_halves_of_the_buffer_and_stay_exact(seed):
    cfg = small_config()
    routings = (Routing("masked", mask_prob=0.3, masked_tokens=0.1), Routing("zipf", zipf_s=2.0))
    assert spawn(check_low_latency, 2, args=(cfg.to_dict(), seed + 77, T_MAX, routings, "cpu", (False, True), 3)) \
        == [12, 12]


@pytest.mark.parametrize("world_size", [1, 2])
def test_fp8_dispatch_moves_deepeps_e4m3_rows_and_column_major_scales_bitwise(world_size, seed):
    cfg = small_config(**{"buffer.hidden": 256})
    assert spawn(check_low_latency_fp8, world_size, args=(cfg.to_dict(), seed + 3, T_MAX)) == [6] * world_size


def test_deep_ep_v1_shim_low_latency_mode_matches_the_reference(seed):
    cfg = small_config()
    assert spawn(check_deep_ep_v1_low_latency, 2, args=(cfg.to_dict(), seed + 5, T_MAX)) == [6, 6]


def _one_rank(seed, T=6, K=4, E=32, H=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    return x, idx, w


def test_bad_arguments_raise_naming_the_value_before_anything_moves(seed):
    x, idx, w = _one_rank(seed)
    with Buffer(None, small_config()) as buf:
        with pytest.raises(InputError, match="x is a torch.float32 tensor.*expected a torch.bfloat16"):
            buf.low_latency_dispatch(x.float(), idx, T_MAX, 32)
        with pytest.raises(InputError, match="topk_idx is a torch.int32 tensor"):
            buf.low_latency_dispatch(x, idx.int(), T_MAX, 32)
        with pytest.raises(CapacityError, match="6 tokens but num_max_dispatch_tokens_per_rank=5"):
            buf.low_latency_dispatch(x, idx, 5, 32)
        with pytest.raises(InputError, match="hidden=60.*multiple of 8"):
            buf.low_latency_dispatch(x[:, :60].contiguous(), idx, T_MAX, 32)
        with pytest.raises(InputError, match="hidden=64 with use_fp8=True.*multiple of 128"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32, use_fp8=True)
        with pytest.raises(InputError, match="use_ue8m0=True needs round_scale=True"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32, use_fp8=True, use_ue8m0=True)
        with pytest.raises(InputError, match="round_scale=True, use_ue8m0=False with use_fp8=False"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32, round_scale=True)
        assert buf._ll is None  # nothing was allocated by the refused calls
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T_MAX, 32)
        with pytest.raises(UnsupportedArgument, match="zero_copy=True"):
            buf.low_latency_combine(recv_x, idx, w, handle, zero_copy=True)
        with pytest.raises(InputError, match=r"x is a torch.bfloat16 tensor of shape \(32, 8, 64\).*\(32, 16, 64\)"):
            buf.low_latency_combine(recv_x[:, :8], idx, w, handle)
        with pytest.raises(InputError, match=r"topk_weights is a torch.float64.*\[6, 4\]"):
            buf.low_latency_combine(recv_x, idx, w.double(), handle)
        with pytest.raises(InputError, match="out is .*expected a contiguous torch.bfloat16 \\[6, 64\\]"):
            buf.low_latency_combine(recv_x, idx, w, handle, out=torch.empty(5, 64, dtype=torch.bfloat16))
        with Buffer(None, small_config()) as other:
            with pytest.raises(InputError, match="another Buffer"):
                other.low_latency_combine(recv_x, idx, w, handle)


def test_a_hook_must_run_once_before_the_next_call(seed):
    x, idx, w = _one_rank(seed)
    with Buffer(None, small_config()) as buf:
        recv_x, count, handle, _, hook = buf.low_latency_dispatch(x, idx, T_MAX, 32, return_recv_hook=True)
        with pytest.raises(InputError, match="receive hook of the previous low_latency_dispatch has not been called"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32)
        hook()
        with pytest.raises(InputError, match="already called"):
            hook()
        ref = reference.low_latency_dispatch([x], [idx], 32, T_MAX).recv[0]
        assert count.tolist() == ref.recv_count.tolist() and count.sum().item() == idx.numel()


def test_the_buffer_allocates_what_the_size_hint_says_and_reallocates_for_new_sizes(seed):
    x, idx, w = _one_rank(seed)
    with Buffer(None, small_config()) as buf:
        buf.low_latency_dispatch(x, idx, T_MAX, 32)
        assert buf._ll[1].nbytes == Buffer.get_low_latency_rdma_size_hint(T_MAX, 64, 1, 32, num_topk=4)
        first = buf._ll[1]
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, 2 * T_MAX, 32)
        assert buf._ll[1] is not first and recv_x.shape == (32, 2 * T_MAX, 64)
    assert LowLatencyLayout(128, 7168, 256, 8, 8).total_bytes == Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256)


def test_deep_ep_v1_low_latency_calls_follow_deepeps_defaults_and_refuse_what_symmoe_lacks(seed):
    x, idx, w = _one_rank(seed)
    cfg = small_config()
    normal = deep_ep.Buffer(None, symmoe_config=cfg)
    try:
        with pytest.raises(UnsupportedCall, match="low_latency_mode=True"):
            normal.clean_low_latency_buffer(T_MAX, 64, 32)
    finally:
        normal.destroy()
    buf = deep_ep.Buffer(None, 0, 1 << 20, low_latency_mode=True, symmoe_config=cfg)
    try:
        with pytest.raises(InputError, match="hidden=64 with use_fp8=True"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32)  # DeepEP's default: FP8
        with pytest.raises(UnsupportedArgument, match="dispatch_wait_recv_cost_stats"):
            buf.low_latency_dispatch(x, idx, T_MAX, 32, dispatch_wait_recv_cost_stats=torch.zeros(1, 1), use_fp8=False)
        recv_x, count, handle, event, hook = buf.low_latency_dispatch(x, idx, T_MAX, 32, use_fp8=False)
        assert hook is None and len(handle) == 5
        with pytest.raises(UnsupportedArgument, match="use_logfmt=True"):
            buf.low_latency_combine(recv_x, idx, w, handle, use_logfmt=True)
        with pytest.raises(InputError, match="handle is .*pass the handle low_latency_dispatch returned"):
            buf.low_latency_combine(recv_x, idx, w, tuple(handle))
        with pytest.raises(UnsupportedCall, match="get_next_low_latency_combine_buffer"):
            buf.get_next_low_latency_combine_buffer(handle)
        buf.clean_low_latency_buffer(T_MAX, 64, 32)  # calls after it start their sequence again
        recv_x, count, handle, event, hook = buf.low_latency_dispatch(x, idx, T_MAX, 32, use_fp8=False)
        ref = reference.low_latency_dispatch([x], [idx], 32, T_MAX)
        combined, event, hook = buf.low_latency_combine(recv_x * 2, idx, w, handle)
        want = reference.low_latency_combine([ref.recv[0].recv_x * 2], ref, [idx], [w], 32)[0]
        assert torch.equal(combined.view(torch.int16), want.view(torch.int16))
    finally:
        buf.destroy()


@pytest.mark.build
def test_the_kernel_module_takes_the_layouts_geometry_and_names_the_stages_the_engine_reports():
    from symmoe import build
    from symmoe.protocol.low_latency import CudaLowLatency
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    mod = build.load("symmoe_ll")
    stages = {v: k for k, v in mod.STAGES.items()}
    assert {k: stages[k] for k in CudaLowLatency.STAGE_NAMES} == CudaLowLatency.STAGE_NAMES
    assert stages[CudaLowLatency.BAD_EXPERT] == "bad expert"
    geometry = LowLatencyLayout(128, 7168, 256, 8, 8).kernel_geometry(3)
    assert len(geometry) == 17 and geometry[:7] == [3, 8, 32, 256, 8, 128, 7168]
    with pytest.raises(ValueError, match="17 values"):
        mod.LowLatency(geometry[:-1], 0, 0, 0, 0, 0, 1.0, 1)


def test_the_benchmark_reports_each_implementations_slowest_rank_and_the_graph_check():
    from symmoe.bench.low_latency import markdown, summarize
    rank = lambda us, same: {"cells": {"128": {"median_us": {"symmoe-ll": {"dispatch": us, "combine": 2 * us},  # noqa: E731
                                                             "step-graph": {"step": 3 * us}},
                                              "graph_bitwise": same}}, "notes": {}}
    res = summarize(2, [rank(10.0, True), rank(14.0, False)])
    assert {(r["impl"], r["op"]): r["us"] for r in res["rows"]} == {
        ("symmoe-ll", "dispatch"): 14.0, ("symmoe-ll", "combine"): 28.0, ("step-graph", "step"): 42.0}
    assert res["graph_bitwise"] == {"128": False}
    assert "| 2 | 128 | step-graph | step | 42 |" in markdown([res])


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_layers_low_latency_forward_matches_its_normal_forward(world_size, seed):
    cfg = small_config()
    layer = {"ffn_hidden": 32, "shared_ffn_hidden": 16, "seed": seed % 1000}
    assert spawn(check_layer_low_latency, world_size, args=(cfg.to_dict(), seed + 11, layer, T_MAX)) == [1] * world_size


def test_the_layers_low_latency_forward_refuses_a_buffer_that_is_not_bfloat16(seed):
    from symmoe.nn import MoELayer
    cfg = small_config(**{"buffer.dtype": "float32"})
    with Buffer(None, cfg) as buf:
        layer = MoELayer(buf, ffn_hidden=8)
        with pytest.raises(InputError, match="buffer's dtype is torch.float32"):
            layer.forward_low_latency(torch.randn(4, cfg.buffer.hidden), T_MAX)


def test_the_low_latency_config_key_is_checked():
    from symmoe.config import Config
    from symmoe.errors import ConfigError
    assert Config().low_latency.num_sms == 0  # the rank's share of the GPU (symmoe.launch_shape.low_latency_blocks)
    assert Config().replace(**{"low_latency.num_sms": 64}).low_latency.num_sms == 64
    with pytest.raises(ConfigError, match=r"low_latency.num_sms.*must be in \[0, 1024\]"):
        Config().replace(**{"low_latency.num_sms": -1})


def test_the_benchmark_turns_the_kernels_stamps_into_phases_and_prints_the_slowest_rank():
    from symmoe.bench.low_latency import markdown, phase_medians, summarize
    # ns: dispatch send 0..10000, receive 12000 (waited 15000) .. 20000; combine 30000.. shifted
    call = [0, 0, 10_000, 12_000, 15_000, 20_000, 30_000, 0, 34_000, 35_000, 36_000, 40_000]
    slower = [v + (5_000 if i in (4, 5) else 0) for i, v in enumerate(call)]  # waits 5 µs longer
    p = phase_medians([call, call, slower])
    assert p["dispatch"] == {"send": 10.0, "gap": 2.0, "wait": 3.0, "recv": 5.0, "device": 20.0}
    assert p["combine"] == {"send": 4.0, "gap": 1.0, "wait": 1.0, "recv": 4.0, "device": 10.0}
    rank = lambda ph: {"cells": {"128": {"median_us": {"symmoe-ll": {"dispatch": 1.0, "combine": 1.0}},  # noqa: E731
                                         "graph_bitwise": True, "phases_us": ph}}, "notes": {}}
    late = phase_medians([slower])
    md = markdown([summarize(2, [rank(p), rank(late)])])
    assert "| 2 | 128 | dispatch | 10.0 | 2.0 | 8.0 | 5.0 | 25.0 |" in md  # each phase's slowest rank
    assert "| 2 | 128 | combine | 4.0 | 1.0 | 1.0 | 4.0 | 10.0 |" in md
    assert "low-latency op" not in markdown([summarize(2, [rank(p), rank(None)])])


def test_the_benchmark_prints_rank_0s_host_split_beside_the_hosts_speed():
    from symmoe.bench.low_latency import markdown, summarize
    split = {"python_loop_us": 2500.0, "launch_us": 4.1,
             "dispatch+combine": {"call": 240.0, "Buffer.low_latency_dispatch": 180.0, "ll.dispatch_send": 9.0},
             "fp8 dispatch": {"call": 300.0, "engine.fp8_rows": 20.0}}
    rank = lambda s: {"cells": {"128": {"median_us": {"symmoe-ll": {"dispatch": 1.0}}, "graph_bitwise": True,  # noqa: E731
                                        **({"host_split_us": s} if s else {})}}, "notes": {}}
    res = summarize(4, [rank(split), rank({"python_loop_us": 1.0})])
    assert res["host_split_us"] == {"128": split}  # rank 0's
    md = markdown([res])
    assert "W=4, 128 tokens, rank 0, host µs per call (python loop 2500.0 µs, one launch 4.1 µs):" in md
    assert "- dispatch+combine: call 240.0, Buffer.low_latency_dispatch 180.0, ll.dispatch_send 9.0" in md
    assert "- fp8 dispatch: call 300.0, engine.fp8_rows 20.0" in md
    assert "host µs per call" not in markdown([summarize(4, [rank(None)])])


def test_the_gpu_engine_s_outputs_are_the_host_engine_s_shapes_and_dtypes():
    """CudaLowLatency makes its five outputs in one symmoe_host call (made on the CPU here): the
    shapes and dtypes of _Engine._outputs, which the host engine and the kernels use."""
    from types import SimpleNamespace

    from symmoe import build
    from symmoe.protocol.low_latency import CudaLowLatency, _Engine

    lay = LowLatencyLayout(16, 256, 32, 4, 8)
    for hidden in (256, 128):
        engine = SimpleNamespace(lay=lay, device=torch.device("cpu"), _host=build.load("symmoe_host"))
        got, want = CudaLowLatency._outputs(engine, hidden), _Engine._outputs(engine, hidden)
        assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in want]
        assert all(t.is_contiguous() for t in got)
