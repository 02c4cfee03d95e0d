"""The host backend runs the real push/pull flow through shared memory and must agree
bitwise with symmoe.reference at every world size, for both output layouts."""
import pytest

from conftest import small_config
from symmoe.launch import spawn
from symmoe.testing import CHECK_ROUTINGS, check_cached_dispatch, check_dispatch_combine, check_num_worst_tokens


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_dispatch_and_combine_match_reference_bitwise(world_size, protocol, seed):
    cfg = small_config(protocol=protocol)
    checked = spawn(check_dispatch_combine, world_size, args=(cfg.to_dict(), seed + world_size))
    assert checked == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_the_receive_pool_holds_one_row_per_source_token_and_fills_to_its_last_row(layout, protocol, seed):
    """With the default recv_capacity the pool is W * T rows, fewer than the expert-major worst
    case a rank may receive; every rank sending all of its max_tokens tokens to one expert fills
    rank 0's pool to its last row, and the results stay bitwise equal to the reference."""
    W, routing = 4, CHECK_ROUTINGS[4]  # one expert: rank 0 receives every source's tokens
    cfg = small_config(protocol=protocol)
    lay = cfg.layout(W)
    assert lay.pool_rows == W * cfg.buffer.max_tokens_per_rank < lay.recv_rows
    full_ranks = True
    assert spawn(check_dispatch_combine, W, args=(cfg.to_dict(), seed, (routing,), (layout,), "cpu", 1, 1, False,
                                                  full_ranks)) == [1] * W


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_a_receive_pool_as_small_as_the_rows_received_is_enough(layout, protocol, seed):
    """buffer.recv_capacity set to exactly the most rows any rank receives: the pool shrinks
    with it (below W * T) and the results stay bitwise equal to the reference."""
    from symmoe import reference
    from symmoe.testing.checks import _case_inputs

    W, routing = 4, CHECK_ROUTINGS[4]
    cfg = small_config(protocol=protocol)
    inputs = _case_inputs(routing, W, cfg, seed)
    want = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                              cfg.buffer.num_experts, layout, cfg.buffer.expert_alignment)
    most = max(r.x.shape[0] for r in want.recv)
    tight = small_config(protocol=protocol, **{"buffer.recv_capacity": most})
    assert tight.layout(W).pool_rows == most < W * cfg.buffer.max_tokens_per_rank
    assert spawn(check_dispatch_combine, W, args=(tight.to_dict(), seed, (routing,), (layout,))) == [1] * W


def test_bfloat16_float16_and_float32_payloads_round_trip(seed):
    for dtype in ["bfloat16", "float16", "float32"]:
        cfg = small_config(**{"buffer.dtype": dtype})
        assert spawn(check_dispatch_combine, 2, args=(cfg.to_dict(), seed + 99)) == [len(CHECK_ROUTINGS) * 2] * 2


def test_repeated_calls_reuse_the_buffer(seed):
    cfg = small_config(protocol="push")
    assert spawn(check_dispatch_combine, 4, args=(cfg.to_dict(), seed + 5, CHECK_ROUTINGS[:2], ("rank", "expert"), "cpu", 3)) \
        == [12] * 4


@pytest.mark.parametrize("protocol", ["push", "pull"])
def test_several_combines_on_one_handle_each_match_reference(protocol, seed):
    """A backward pass combines again on a forward handle: each combine, with other expert
    outputs, must be exact (no leftovers of the previous one in the combine slots)."""
    cfg = small_config(protocol=protocol)
    assert spawn(check_dispatch_combine, 4, args=(cfg.to_dict(), seed + 6, CHECK_ROUTINGS[:3], ("rank", "expert"),
                                                  "cpu", 1, 3)) == [6] * 4


@pytest.mark.parametrize("protocol", ["push", "pull"])
def test_x_built_in_the_input_view_is_dispatched_where_it_lies(protocol, seed):
    """The Mega MoE way: the layer before writes x into the symmetric buffer; dispatch
    publishes nothing and still returns the reference's rows, leaving x as it was."""
    cfg = small_config(protocol=protocol)
    assert spawn(check_dispatch_combine, 4, args=(cfg.to_dict(), seed + 8, CHECK_ROUTINGS, ("rank", "expert"), "cpu",
                                                  1, 1, True)) == [len(CHECK_ROUTINGS) * 2] * 4


def test_input_view_is_x_shaped_in_the_buffer_and_refuses_more_than_max_tokens():
    from symmoe import Buffer
    from symmoe.errors import CapacityError, InputError

    cfg = small_config()
    with Buffer(None, cfg) as buf:
        T = cfg.buffer.max_tokens_per_rank
        v = buf.input_view(T)
        assert v.shape == (T, cfg.buffer.hidden) and v.dtype == buf.dtype and v.is_contiguous()
        assert v.data_ptr() == buf.memory.local.data_ptr() + buf.layout.offsets()["in_x"]
        assert buf.input_view(0).shape == (0, cfg.buffer.hidden)
        for bad in (T + 1, -1):
            with pytest.raises(CapacityError, match=rf"input_view\({bad}\): the input region holds 0 to "
                                                    rf"max_tokens_per_rank={T} tokens"):
                buf.input_view(bad)
        with pytest.raises(InputError, match=r"input_view\(2\.5\): num_tokens must be an int, got float"):
            buf.input_view(2.5)


def test_a_closed_buffer_refuses_every_call_before_touching_its_memory(seed):
    import torch

    from symmoe import Buffer
    from symmoe.errors import InputError
    from symmoe.workload import Routing, make_inputs

    cfg = small_config()
    b = cfg.buffer
    x = make_inputs(Routing("uniform"), num_tokens=8, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                    world_size=1, dtype=torch.bfloat16, seed=seed)[0]
    with Buffer(None, cfg) as buf:
        recv_x, _, _, _, handle, _ = buf.dispatch(x.x, x.topk_idx, x.topk_weights)
    buf.close()  # a second close does nothing
    calls = {"dispatch": lambda: buf.dispatch(x.x, x.topk_idx, x.topk_weights),
             "combine": lambda: buf.combine(recv_x, handle),
             "get_dispatch_layout": lambda: buf.get_dispatch_layout(x.topk_idx),
             "input_view": lambda: buf.input_view(8),
             "synchronize": buf.synchronize}
    for name, call in calls.items():
        with pytest.raises(InputError, match=rf"^{name}: this Buffer is closed \(Buffer.close\(\) or the end of its "
                                             r"`with` block\); create a new Buffer$"):
            call()


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("x_in_buffer", [False, True], ids=["x", "x_in_buffer"])
def test_cached_dispatch_moves_new_rows_along_the_handles_routing(protocol, x_in_buffer, seed):
    """dispatch(x, handle=...) after other dispatches: the reference's rows for the new x,
    the same handle back, and a combine on it still exact."""
    cfg = small_config(protocol=protocol)
    assert spawn(check_cached_dispatch, 4, args=(cfg.to_dict(), seed + 12, CHECK_ROUTINGS, ("rank", "expert"), "cpu",
                                                 x_in_buffer)) == [len(CHECK_ROUTINGS) * 2] * 4


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("world_size", [1, 4])
def test_num_worst_tokens_returns_worst_case_sized_outputs(world_size, protocol, seed):
    cfg = small_config(protocol=protocol)
    checked = spawn(check_num_worst_tokens, world_size, args=(cfg.to_dict(), seed + 31))
    assert checked == [len(CHECK_ROUTINGS) * 2] * world_size
