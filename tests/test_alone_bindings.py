"""symmoe_cuda's bindings for a protocol without a Context of that module (nvshmem at one PE):
``alone`` and ``alone_routed`` check their arguments before anything reaches CUDA, name the
binding in their errors, and say where they do not apply by launching nothing (False), so the
protocol runs its own kernels. No call here reaches the GPU."""
import pytest

from symmoe.layout import BufferLayout

pytestmark = pytest.mark.build

NONE = (0, 0, 0, 0)  # done, err, err_host, stream: never used on these paths


def _layout(world_size: int = 1) -> list[int]:
    return BufferLayout(world_size, 64, 256, 8, 32, 2).kernel_args()


def _routed(cuda_module, layout=None, ptrs=22, tokens=64, mode=1, blocks=8, expert_major=True, **tail):
    # layout, expert_major, idx64, tokens, alignment, capacity, epoch, timeout_ns, ptrs, mode, blocks, ...
    return cuda_module.alone_routed(_layout() if layout is None else layout, expert_major, True, tokens, 1, 512, 1, 10**9,
                            [0] * ptrs, mode, blocks, *NONE, **tail)


def test_a_wrong_pointer_count_layout_or_mode_is_refused_naming_it(cuda_module):
    with pytest.raises(ValueError, match="alone_routed: expected 22 pointers, got 13"):
        _routed(cuda_module, ptrs=13)
    with pytest.raises(ValueError, match=r"alone_routed: layout of 3 values, expected \d+"):
        _routed(cuda_module, layout=[1, 2, 3])
    with pytest.raises(ValueError, match="alone: expected 13 pointers, got 22"):
        cuda_module.alone(_layout(), True, 1, 512, 1, 10**9, [0] * 22, 1, 8, *NONE)
    with pytest.raises(ValueError, match="alone_fan_routed_kernel: fan_phases mode 4, must be 1, 2 or 3"):
        _routed(cuda_module, mode=4)


def test_a_folded_num_worst_tokens_tail_is_rank_major_only_and_needs_its_pointers(cuda_module):
    """The repair kernel does the tail only rank-major; expert-major the caller launches it."""
    with pytest.raises(ValueError, match="alone_routed: worst -1, must be >= 0"):
        _routed(cuda_module, expert_major=False, worst=-1)
    with pytest.raises(ValueError, match="rank-major only .* expert_major 1, per_expert 16, deferred 32"):
        _routed(cuda_module, worst=64, per_expert=16, deferred=32)
    with pytest.raises(ValueError, match="needs per_expert and deferred .* per_expert 0, deferred 32"):
        _routed(cuda_module, expert_major=False, worst=64, deferred=32)
    with pytest.raises(ValueError, match="per_expert 16, deferred 0"):
        _routed(cuda_module, expert_major=False, worst=64, per_expert=16)


@pytest.mark.parametrize("case", ["peers", "fan_phases off", "no token", "one block"])
def test_alone_routed_launches_nothing_where_it_does_not_apply(cuda_module, case):
    """Peers, no phased fan-out, no token, or a grid of one block (no block left to route
    while another moves rows): False, and the caller routes with its own kernels."""
    kw = {"peers": {"layout": _layout(2)}, "fan_phases off": {"mode": 0}, "no token": {"tokens": 0},
          "one block": {"blocks": 1}}[case]
    assert _routed(cuda_module, **kw) is False


def test_the_routed_scratch_holds_every_chunk_in_whole_16_byte_words(cuda_module):
    """Its words: two int64 marks a block, a 16-byte ticket (with the sums' counters), the
    routing's int64 end word in 16 bytes, then the totals, the sums and a row a block of 1 + E
    counts each, rounded up to 4 words; a multiple of 4 words (16 bytes) throughout."""
    for blocks, experts in ((2, 3), (8, 32), (132, 256)):
        words = cuda_module.routed_scratch_words(blocks, experts)
        stride = (1 + experts + 3) // 4 * 4
        assert words % 4 == 0
        assert words >= 4 * blocks + 8 + (2 + blocks) * (1 + experts)
        assert words == 4 * blocks + 8 + (2 + blocks) * stride
    assert cuda_module.routed_scratch_words(9, 32) > cuda_module.routed_scratch_words(8, 32)
    assert cuda_module.routed_scratch_words(8, 36) > cuda_module.routed_scratch_words(8, 32)  # 37 counts take 40 words, 33 take 36
