"""FP8 dispatch: (x_e4m3, scales) rows move as bytes, bitwise equal to symmoe.reference on the
host backend in both protocols and layouts, with DeepGEMM's grouped layout and scale layout
for expert-major outputs; bad FP8 input is refused before anything moves."""
import pytest
import torch

from conftest import small_config
from symmoe import Buffer, fp8, reference
from symmoe.errors import InputError
from symmoe.launch import spawn
from symmoe.testing import CHECK_ROUTINGS, check_fp8_dispatch

H = 256  # two UE8M0 words per row: 2 x 4 scales of 128 channels


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_fp8_rows_and_scales_match_the_reference_bitwise(world_size, protocol, seed):
    cfg = small_config(protocol=protocol, **{"buffer.hidden": H})
    cases = len(CHECK_ROUTINGS) * 2 * 2
    assert spawn(check_fp8_dispatch, world_size, args=(cfg.to_dict(), seed + world_size)) == [cases] * world_size
