"""symmoe_cuda's binding for a protocol without a Context of that module (nvshmem at one PE):
``alone`` checks its arguments before anything reaches CUDA and names the binding in its
errors. No call here reaches the GPU."""
import pytest

from symmoe.layout import BufferLayout

pytestmark = pytest.mark.build

NONE = (0, 0, 0, 0)  # done, err, err_host, stream: never used on these paths
SMS = 132  # the GPU the launch shape was made for


def _layout(world_size: int = 1) -> list[int]:
    return BufferLayout(world_size, 64, 256, 8, 32, 2).kernel_args()


def test_a_wrong_pointer_count_or_layout_is_refused_naming_it(cuda_module):
    with pytest.raises(ValueError, match="alone: expected 13 pointers, got 22"):
        cuda_module.alone(_layout(), True, 1, 512, 1, 10**9, [0] * 22, 1, 8, SMS, *NONE)
    with pytest.raises(ValueError, match=r"alone: layout of 3 values, expected \d+"):
        cuda_module.alone([1, 2, 3], True, 1, 512, 1, 10**9, [0] * 13, 1, 8, SMS, *NONE)
    with pytest.raises(ValueError, match="alone: fan_phases mode 4, must be 1, 2 or 3"):
        cuda_module.alone(_layout(), True, 1, 512, 1, 10**9, [0] * 13, 4, 8, SMS, *NONE)


@pytest.mark.parametrize("expert_major", [True, False])
def test_alone_launches_nothing_with_peers(cuda_module, expert_major):
    """With peers the protocol runs its own kernels: False, before anything reaches CUDA."""
    assert cuda_module.alone(_layout(2), expert_major, 1, 512, 1, 10**9, [0] * 13, 1, 8, SMS, *NONE) is False


def test_a_block_count_outside_the_gpu_s_sms_is_refused_naming_it(cuda_module):
    """The blocks come from symmoe/launch_shape.py: a count it could not have made is refused."""
    for blocks in (0, 133):
        with pytest.raises(ValueError, match=f"alone: blocks={blocks}, outside 1..132"):
            cuda_module.alone(_layout(), True, 1, 512, 1, 10**9, [0] * 13, 1, blocks, SMS, *NONE)
