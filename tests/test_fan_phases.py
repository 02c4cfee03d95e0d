"""kernel.fan_phases: how the world-size-1 expert-major dispatch moves its rows, and the
configurations refused before any launch, and the words of a stall. CPU only: the rules, not the kernels
(tests/gpu/test_torch_backend.py and tests/gpu/test_nccl.py run those)."""
from __future__ import annotations

import pytest

from symmoe import ConfigError
from symmoe.config import Config
from symmoe.launch_shape import GpuSms, fan_phases_mode


def _config(phases: str, num_sms: int = 132) -> Config:
    return Config().replace(**{"kernel.fan_phases": phases, "kernel.num_sms": num_sms})


@pytest.mark.parametrize("phases,mode", [("off", 0), ("block", 1), ("grid", 2), ("steal", 3)])
def test_each_name_is_the_kernels_mode(phases, mode):
    assert fan_phases_mode(_config(phases), 1, GpuSms(132, 132)) == mode


def test_steal_is_the_default():
    assert fan_phases_mode(Config(), 1, GpuSms(132, 132)) == 3


def test_grid_needs_every_block_resident_and_names_the_share():
    with pytest.raises(ConfigError, match="132 blocks, this process holds 33 SMs"):
        fan_phases_mode(_config("grid"), 1, GpuSms(132, 33))
    assert fan_phases_mode(_config("grid", num_sms=33), 1, GpuSms(132, 33)) == 2


def test_with_peers_grid_is_not_refused_the_phases_run_alone_only():
    assert fan_phases_mode(_config("grid"), 4, GpuSms(132, 33)) == 2


def test_a_stall_names_what_its_stage_waited_for():
    """The words every GPU protocol raises StallError with (CUDA and nvshmem alike): a bulk load
    names its warp, a grid phase its number, the routing its chunk, any other stage the rank
    that never arrived."""
    from symmoe.protocol.base import stall_detail
    assert stall_detail("bulk copy", 37, 5) == "a bulk (TMA) load of warp 37 never completed in the kernel of barrier epoch 5"
    assert "reached its phase 2" in stall_detail("dispatch.phase", 2, 9) and "epoch 9" in stall_detail("dispatch.phase", 2, 9)
    assert stall_detail("dispatch.data", 3, 4) == "no arrival from rank 3 at barrier epoch 4"
    assert stall_detail("dispatch.route", 7, 2) == ("chunk 7 of the routing kernel was never counted (its block did not "
                                                    "run) in the dispatch of epoch 2")
