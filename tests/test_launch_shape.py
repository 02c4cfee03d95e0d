"""symmoe/launch_shape.py: the one place that turns the config's kernel section and the GPU's
SMs into each kernel family's blocks. CPU only: the rules, and the check the bindings make of
the numbers they receive (csrc/bindings/launch_geometry.h)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from symmoe import ConfigError, InputError
from symmoe.config import KernelConfig
from symmoe.launch_shape import (MIN_HELD_SMS, GpuSms, LaunchShape, cuda_shape, grid_blocks, held_blocks, held_sms,
                                 low_latency_blocks, may_stream, nvshmem_shape)

H100 = GpuSms(132, 132)


def _kernel(**over) -> KernelConfig:
    return dataclasses.replace(KernelConfig(), **over)


# -- the SMs this process holds -------------------------------------------------------------
def test_without_an_mps_share_the_process_holds_every_sm():
    assert held_sms(132, None) == 132 and held_sms(132, "") == 132


@pytest.mark.parametrize("share,held", [("25", 33), ("100", 132), ("50.0", 66), ("33.9", 43), ("1", MIN_HELD_SMS)])
def test_an_mps_share_holds_its_percentage_rounded_down_and_at_least_two(share, held):
    assert held_sms(132, share) == held


@pytest.mark.parametrize("share", ["abc", "0", "-5", "150"])
def test_a_bad_mps_share_is_refused_naming_the_value(share):
    with pytest.raises(InputError, match=f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share!r}"):
        held_sms(132, share)


def test_gpu_sms_that_cannot_be_are_refused_naming_the_value():
    with pytest.raises(InputError, match="total=0"):
        GpuSms(0, 0)
    with pytest.raises(InputError, match="held=200 of total=132"):
        GpuSms(132, 200)
    with pytest.raises(InputError, match="held=0"):
        GpuSms(132, 0)


# -- grids ----------------------------------------------------------------------------------
@pytest.mark.parametrize("num_sms,want", [(24, 24), (132, 132), (1024, 132), (1, 1)])
def test_a_persistent_grid_is_num_sms_capped_by_the_gpu(num_sms, want):
    assert grid_blocks(_kernel(num_sms=num_sms), H100) == want


@pytest.mark.parametrize("num_sms,want", [(24, 24), (132, 33), (33, 33)])
def test_a_grid_that_waits_on_itself_is_capped_by_the_mps_share(num_sms, want):
    assert held_blocks(_kernel(num_sms=num_sms), GpuSms(132, 33)) == want
    assert low_latency_blocks(num_sms, GpuSms(132, 33), share=1) == want


def test_the_low_latency_grid_is_the_ranks_share_of_the_gpu():
    assert low_latency_blocks(0, GpuSms(132, 132), share=1) == 132  # every SM, one rank per GPU
    assert low_latency_blocks(0, GpuSms(132, 132), share=4) == 33  # four ranks split one GPU
    assert low_latency_blocks(0, GpuSms(132, 66), share=1) == 66  # an MPS share
    assert low_latency_blocks(40, GpuSms(132, 132), share=2) == 40
    assert low_latency_blocks(132, GpuSms(132, 132), share=2) == 66  # capped: receivers spin beside senders
    with pytest.raises(ConfigError, match="low_latency.num_sms"):
        low_latency_blocks(-1, GpuSms(132, 132), share=1)


@pytest.mark.parametrize("num_sms", [0, -3])
def test_num_sms_below_one_is_refused_naming_the_value(num_sms):
    with pytest.raises(ConfigError, match=f"kernel.num_sms = {num_sms}"):
        grid_blocks(_kernel(num_sms=num_sms), H100)
    with pytest.raises(ConfigError, match=f"kernel.num_sms = {num_sms}"):
        cuda_shape(_kernel(num_sms=num_sms), H100)


# -- the CUDA protocols ---------------------------------------------------------------------
def test_the_cuda_protocols_run_every_kernel_on_one_grid_capped_by_the_gpu():
    s = cuda_shape(_kernel(num_sms=24), H100)
    assert s == LaunchShape(sms=132, route=24, dispatch=24, combine=24, reduce=24, alone=24, tail=24)
    assert cuda_shape(_kernel(num_sms=1024), GpuSms(78, 78)).dispatch == 78
    # an MPS share does not cap them: their blocks need not be resident at once
    assert cuda_shape(_kernel(num_sms=132), GpuSms(132, 33)).dispatch == 132


def test_the_streamed_push_needs_the_group_s_gpu_sharing():
    k = _kernel(num_sms=132, push_mode="auto")
    assert may_stream(k, "push", 2) and not may_stream(k, "pull", 2) and not may_stream(k, "push", 1)
    assert not may_stream(_kernel(push_mode="unpack"), "push", 4)
    assert cuda_shape(k, H100).stream == 0  # no sharing gathered: push, then unpack
    assert cuda_shape(k, H100, sharing=(1, 132)).stream == 132
    assert cuda_shape(k, H100, sharing=(2, 132)).stream == 0  # auto under MPS: unpack
    assert cuda_shape(_kernel(num_sms=132, push_mode="stream"), H100, sharing=(4, 132)).stream == 33
    with pytest.raises(InputError, match="3 ranks share a GPU of 4 SMs"):
        cuda_shape(_kernel(num_sms=4, push_mode="stream"), GpuSms(4, 4), sharing=(3, 4))


# -- nvshmem --------------------------------------------------------------------------------
def test_nvshmem_channels_fit_num_sms_the_share_and_the_signal_words():
    k = _kernel(num_sms=24, num_channels=8)
    s = nvshmem_shape(k, H100, layout_channels=8)
    assert (s.channels, s.dispatch, s.combine, s.reduce) == (8, 16, 8, 24)
    assert (s.route, s.tail, s.alone, s.sms) == (132, 132, 24, 132)  # the routing and the tail: every SM
    assert nvshmem_shape(_kernel(num_sms=10, num_channels=8), H100, 8).channels == 5  # num_sms / 2
    assert nvshmem_shape(_kernel(num_sms=132, num_channels=64), GpuSms(132, 33), 64).channels == 16  # share / 2
    assert nvshmem_shape(_kernel(num_sms=132, num_channels=64), H100, 32).channels == 32  # the layout's words
    assert nvshmem_shape(_kernel(num_sms=1, num_channels=8), H100, 8).channels == 1  # one at least


def test_nvshmem_combine_and_reduction_stay_within_the_held_sms():
    s = nvshmem_shape(_kernel(num_sms=132, num_channels=128), GpuSms(132, 33), layout_channels=128)
    assert (s.combine, s.reduce, s.alone) == (33, 33, 132)


# -- what the bindings receive --------------------------------------------------------------
def test_the_kernel_args_mirror_the_bindings_geometry():
    text = (Path(__file__).resolve().parent.parent / "csrc" / "bindings" / "launch_geometry.h").read_text()
    body = text[text.index("struct LaunchGeometry {"):text.index("};", text.index("struct LaunchGeometry {"))]
    fields = re.findall(r"int (\w+);", body)
    assert fields == list(LaunchShape.KERNEL_FIELDS)
    assert f"kGeometryArgs = {len(fields)};" in text
    s = cuda_shape(_kernel(num_sms=24), H100)
    assert s.kernel_args() == [132, 24, 24, 24, 24, 24, 24]


@pytest.mark.build
def test_the_bindings_refuse_a_shape_launch_shape_could_not_make(cuda_module):
    good = cuda_shape(_kernel(num_sms=24), H100).kernel_args()
    cuda_module.check_launch_shape(good, 132)
    with pytest.raises(ValueError, match="expected 7 values .*got 6"):
        cuda_module.check_launch_shape(good[:6], 132)
    with pytest.raises(ValueError, match="sms=132, but this GPU has 78 SMs"):
        cuda_module.check_launch_shape(good, 78)
    for i, name in enumerate(LaunchShape.KERNEL_FIELDS[1:], 1):
        for bad in (0, 133):
            shape = list(good)
            shape[i] = bad
            with pytest.raises(ValueError, match=f"launch shape: {name}={bad} blocks, outside 1..132"):
                cuda_module.check_launch_shape(shape, 132)
