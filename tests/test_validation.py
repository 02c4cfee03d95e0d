"""Bad calls raise a symmoe error that names the value and what is allowed, before any
data moves; faults across ranks (stalls, overflow, config mismatch) fail on every rank."""
import os

import pytest
import torch

import symmoe
from conftest import small_config
from symmoe.launch import RankFailed, spawn
from symmoe.testing.faults import absent_rank, mismatched_configs, overflow, raise_after_alloc


@pytest.fixture(scope="module")
def buf():
    with symmoe.Buffer(None, small_config()) as b:
        yield b


def good(buf, tokens=6):
    cfg = buf.config.buffer
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(cfg.num_experts, generator=g)[:cfg.topk] for _ in range(tokens)])
    return torch.randn(tokens, cfg.hidden, generator=g).bfloat16(), idx, torch.rand(tokens, cfg.topk, generator=g)


def test_good_call_works(buf):
    x, idx, w = good(buf)
    assert buf.dispatch(x, idx, w)[0].shape[1] == x.shape[1]


def bad_dispatch_cases():
    H, K, E, T = 64, 4, 32, 48
    x = torch.randn(6, H).bfloat16()
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(6)])
    w = torch.rand(6, K)
    dup = idx.clone()
    dup[2, 1] = dup[2, 0]
    return [
        ("x float32", (x.float(), idx, w), {}, "x has dtype torch.float32"),
        ("x 3-d", (x.view(2, 3, H), idx, w), {}, "x must have 2 dimensions"),
        ("x wrong hidden", (torch.randn(6, H + 8).bfloat16(), idx, w), {}, "hidden size 72"),
        ("x not contiguous", (torch.randn(H, 6).bfloat16().t(), idx, w), {}, "contiguous"),
        ("x a list", (x.tolist(), idx, w), {}, "x must be a torch.Tensor, got list"),
        ("too many tokens", (torch.randn(T + 1, H).bfloat16(), torch.zeros(T + 1, K, dtype=torch.long),
                             torch.rand(T + 1, K)), {}, "max_tokens_per_rank=48"),
        ("idx float", (x, idx.float(), w), {}, "topk_idx has dtype torch.float32"),
        ("idx wrong k", (x, idx[:, :2].contiguous(), w), {}, "topk=4"),
        ("idx rows", (x, idx[:5].contiguous(), w), {}, "topk_idx has 5 rows but x has 6"),
        ("expert id too big", (x, idx.masked_fill(idx == idx[3, 2], E), w), {}, f"expert id {E}"),
        ("expert id < -1", (x, idx.masked_fill(idx == idx[0, 0], -2), w), {}, "expert id -2"),
        ("duplicate expert", (x, dup, w), {}, "row 2 names expert"),
        ("weights float64", (x, idx, w.double()), {}, "topk_weights has dtype torch.float64"),
        ("weights shape", (x, idx, w[:, :3].contiguous()), {}, "must match topk_idx"),
        ("layout", (x, idx, w), {"output_layout": "token"}, "output_layout='token'"),
        ("alignment 0", (x, idx, w), {"expert_alignment": 0}, "expert_alignment=0"),
        ("alignment over pool", (x, idx, w), {"output_layout": "expert", "expert_alignment": 64},
         "exceeds buffer.expert_alignment=4"),
        ("num_worst_tokens < 0", (x, idx, w), {"num_worst_tokens": -1}, "num_worst_tokens=-1; allowed: an integer >= 0"),
        ("num_worst_tokens bool", (x, idx, w), {"num_worst_tokens": True}, "num_worst_tokens=True"),
    ]


@pytest.mark.parametrize("case", bad_dispatch_cases(), ids=lambda c: c[0])
def test_bad_dispatch_arguments(buf, case):
    _, args, kwargs, msg = case
    with pytest.raises(symmoe.InputError) as e:
        buf.dispatch(*args, **kwargs)
    assert msg in str(e.value), str(e.value)


def test_bad_dispatch_moves_nothing(buf):
    x, idx, w = good(buf)
    before = buf.memory.local.clone()
    with pytest.raises(symmoe.InputError):
        buf.dispatch(x, idx.masked_fill(idx == idx[0, 0], 99), w)
    assert torch.equal(before, buf.memory.local)


def test_bad_combine_arguments(buf):
    x, idx, w = good(buf)
    rx, _, rw, _, handle, _ = buf.dispatch(x, idx, w)
    cases = [
        ((rx.float(), handle), "x has dtype torch.float32"),
        ((rx[:-1].contiguous(), handle), "one row per received row"),
        ((rx, "handle"), "must be the DispatchHandle"),
        ((rx, handle, rw.double()), "allowed: torch.float32"),
    ]
    for args, msg in cases:
        with pytest.raises(symmoe.InputError, match=msg):
            buf.combine(*args)
    with symmoe.Buffer(None, small_config()) as other, pytest.raises(symmoe.InputError, match="another Buffer"):
        other.combine(rx, handle)
    _, _, erw, _, ehandle, _ = buf.dispatch(x, idx, w, output_layout="expert")
    with pytest.raises(symmoe.InputError, match="only for rank-major"):
        buf.combine(torch.zeros(ehandle.num_recv_rows, 64).bfloat16(), ehandle, erw)


def test_bad_cached_dispatch_arguments(buf):
    """dispatch(x, handle=...) moves x along the handle's routing: anything that would
    route again, or x of another token count, is refused naming it."""
    x, idx, w = good(buf)
    *_, handle, _ = buf.dispatch(x, idx, w, output_layout="expert")
    cases = [
        ((x, idx, w), {"handle": handle}, "takes no topk_idx/topk_weights"),
        ((x[:5].contiguous(),), {"handle": handle}, "x has 5 tokens; the handle's dispatch had 6"),
        ((x.float(),), {"handle": handle}, "x has dtype torch.float32"),
        ((x,), {"handle": handle, "output_layout": "rank"}, "output_layout='rank'; the handle was made with 'expert'"),
        ((x,), {"handle": handle, "expert_alignment": 8}, "expert_alignment=8; the handle was made with 4"),
        ((x,), {"handle": "handle"}, "must be the DispatchHandle"),
        ((x,), {}, "topk_idx is None; dispatch needs topk_idx and topk_weights, or handle="),
        ((x, idx), {}, "topk_weights is None"),
    ]
    for args, kwargs, msg in cases:
        with pytest.raises(symmoe.InputError, match=msg):
            buf.dispatch(*args, **kwargs)
    with symmoe.Buffer(None, small_config()) as other, pytest.raises(symmoe.InputError, match="another Buffer"):
        other.dispatch(x, handle=handle)


def test_get_dispatch_layout_validates(buf):
    x, idx, w = good(buf)
    with pytest.raises(symmoe.InputError, match="num_experts=16"):
        buf.get_dispatch_layout(idx, 16)
    per_rank, rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx)
    assert rdma is None and per_rank.tolist() == [6] and int(per_expert.sum()) == idx.numel()


def test_ranks_with_different_configs_fail_together_naming_the_keys():
    out = spawn(mismatched_configs, 2, args=(small_config().to_dict(),))
    for msg in out:
        assert "buffer.hidden" in msg and "kernel.timeout_s" in msg, msg


def test_a_rank_that_never_arrives_makes_the_others_raise_naming_the_stage():
    out = spawn(absent_rank, 4, args=(small_config(**{"kernel.timeout_s": 1.0}).to_dict(),), timeout_s=60)
    for msg in out[:3]:
        assert "stage 'dispatch.counts'" in msg and "rank(s) [3]" in msg and "1 s" in msg, msg


def test_receive_pool_overflow_raises_on_every_rank():
    out = spawn(overflow, 2, args=(small_config(**{"buffer.recv_capacity": 40}).to_dict(),))
    for msg in out:
        assert "rank 0 would receive 96 rows" in msg and "recv_capacity" in msg, msg


def test_shared_memory_is_released_when_a_rank_raises():
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(RankFailed, match="rank 0 fails on purpose"):
        spawn(raise_after_alloc, 2, args=(small_config().to_dict(),))
    leaked = {f for f in set(os.listdir("/dev/shm")) - before if f.startswith("symmoe-")}
    assert not leaked


def test_a_rank_that_aborts_at_interpreter_exit_fails_the_run():
    """A library whose finalisation aborts after the rank's work returned is a failure, not a pass."""
    from symmoe.testing.faults import abort_at_exit

    with pytest.raises(RankFailed, match=r"rank 1: returned its result, then exited with code 3"):
        spawn(abort_at_exit, 2, args=(1,))
    assert spawn(abort_at_exit, 2, args=(-1,)) == [0, 1]


def test_more_combine_slots_than_the_gpu_reduction_holds_is_refused_naming_both():
    from symmoe.config import Config
    from symmoe.errors import InputError
    from symmoe.protocol.base import MAX_SLOTS, check_combine_slots

    cfg = Config().replace(**{"buffer.num_experts": 130})  # topk <= 32: only the world size gets there
    with pytest.raises(InputError, match=r"max\(world_size, topk\) = 65; at most 64 with the nvshmem protocol"):
        check_combine_slots(cfg.layout(65), "nvshmem protocol")
    check_combine_slots(Config().replace(**{"buffer.num_experts": 128}).layout(MAX_SLOTS), "nvshmem protocol")
