"""torch backend on the GPU: CUDA push/pull must agree bitwise with symmoe.reference at world
size 1 and at 2 and 4 processes on one GPU (CUDA MPS, overlapping devices allowed), and a
rank that never arrives must make the others raise StallError naming the stage."""
from __future__ import annotations

import os
import time
from unittest import mock

import pytest
import torch

from conftest import GPU_ENV, gpu_unusable, on_ranks
from symmoe.config import Config, from_dict
from symmoe.launch import spawn
from symmoe.testing import (CHECK_ROUTINGS, check_cached_dispatch, check_counts_summary, check_dispatch_combine,
                            check_num_worst_tokens)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _usable():
    """A GPU without what the backend needs (torch's symmetric memory, nvcc, ...) skips, saying why."""
    from symmoe.backends.torch_symm import TorchSymmMemory
    reason = TorchSymmMemory.unavailable_reason()
    if reason:
        gpu_unusable(f"torch backend unusable here: {reason}")

ENV = GPU_ENV


def gpu_config(**over) -> dict:
    base = {"backend": "torch", "buffer.hidden": 256, "buffer.max_tokens_per_rank": 96, "buffer.topk": 8,
            "buffer.num_experts": 64, "buffer.expert_alignment": 4, "buffer.dtype": "bfloat16",
            "kernel.timeout_s": 30.0, "kernel.num_sms": 16, "torch.allow_overlapping_devices": True}
    base.update(over)
    return Config().replace(**base).to_dict()


_on_ranks = on_ranks


def _run(world_size: int, cfg: dict, seed: int, routings=CHECK_ROUTINGS, layouts=("rank", "expert"), repeats=1,
         combines=1, x_in_buffer=False):
    return _on_ranks(check_dispatch_combine, world_size,
                     (cfg, seed, routings, layouts, "cuda", repeats, combines, x_in_buffer))


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("hidden", [256, 7168])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_bitwise_equal_to_reference(world_size, hidden, protocol, seed):
    cfg = gpu_config(protocol=protocol, **{"buffer.hidden": hidden})
    assert _run(world_size, cfg, seed + world_size + hidden) == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_routing_split_over_many_chunks(world_size, protocol, seed):
    """1024-2048 tokens per rank: the routing runs in 8-16 chunks of 128 tokens (one block
    each), and every position must continue across chunks as the reference numbers rows."""
    cfg = gpu_config(protocol=protocol, **{"buffer.hidden": 64, "buffer.max_tokens_per_rank": 2048,
                                          "kernel.num_sms": 32})
    assert _run(world_size, cfg, seed + 555 + world_size, CHECK_ROUTINGS[:4]) == [8] * world_size


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("num_sms, steps", [(8, 2), (4, 4)])
def test_routing_chunks_of_many_steps_a_warp(num_sms, steps, protocol, seed):
    """Few blocks, many tokens: up to 2048 tokens a rank in num_sms chunks, so each of a routing
    block's 32 warps numbers up to `steps` runs of 32 pairs (top-8: 2048 / num_sms / 32 * 8 / 32).
    route_chunk keeps a warp's first two steps in registers and parks the later ones' ranks in
    the positions table: both must number rows as the reference does."""
    cfg = gpu_config(protocol=protocol, **{"buffer.hidden": 64, "buffer.max_tokens_per_rank": 2048,
                                          "kernel.num_sms": num_sms})
    assert _run(2, cfg, seed + 556 + steps, CHECK_ROUTINGS[:4]) == [8, 8]


@pytest.mark.parametrize("layout", ["expert", "rank"])
@pytest.mark.parametrize("num_sms", [2, 4, 132])
@pytest.mark.parametrize("hidden", [64, 7168])
def test_alone_dispatch_on_few_and_many_blocks(hidden, num_sms, layout, seed):
    """World size 1: the routing kernel, then the alone kernels (kernels/alone.cuh) right behind
    it on 2, 4 or up to 132 blocks (as many as the GPU has), up to 2048 tokens. Expert-major each
    row goes to its slots' rows, rank-major to its one row. Rows, the handle's cached dispatch
    and num_worst_tokens outputs must be the reference's."""
    cfg = gpu_config(**{"buffer.hidden": hidden, "buffer.max_tokens_per_rank": 2048, "kernel.num_sms": num_sms,
                        "buffer.output_layout": layout})
    n, layouts = 4, (layout,)
    assert _run(1, cfg, seed + 557 + num_sms, CHECK_ROUTINGS[:n], layouts) == [n]
    assert _on_ranks(check_cached_dispatch, 1, (cfg, seed + 558, CHECK_ROUTINGS[:n], layouts, "cuda")) == [n]
    assert _on_ranks(check_num_worst_tokens, 1, (cfg, seed + 559, CHECK_ROUTINGS[:n], layouts, "cuda")) == [n]


@pytest.mark.parametrize("worst", [0, 1024])
@pytest.mark.parametrize("hidden", [256, 7168])
def test_rank_major_rows_of_tokens_without_a_row_are_left_out(hidden, worst, seed):
    """World size 1, rank-major: with token 0 and every third token masked whole, and
    buffer.recv_capacity below the token count, every later row moves up (alone_rows_kernel
    puts token t at its routing position, not at row t). The rows, the cached dispatch's rows
    and the combine must be the reference's; with num_worst_tokens the tail also fills the rows
    past the received ones and counts the rows per expert."""
    from symmoe import reference
    from symmoe.buffer import Buffer
    from symmoe.testing import assert_bitwise

    T, E = 1024, 64
    cfg = gpu_config(**{"buffer.hidden": hidden, "buffer.max_tokens_per_rank": T, "kernel.num_sms": 132,
                        "buffer.num_experts": E, "buffer.output_layout": "rank", "buffer.recv_capacity": 3 * T // 4})
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, x2 = (torch.randn(T, hidden, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    idx = torch.rand(T, E, device="cuda", generator=g).topk(8, dim=1).indices
    idx[torch.rand(T, 8, device="cuda", generator=g) < 0.3] = -1
    idx[::3] = -1  # token 0 among them: every later row is shifted
    w = torch.rand(T, 8, device="cuda", generator=g)
    want = reference.dispatch([x], [idx], [w], E, "rank")
    rows = want.recv[0].x.shape[0]
    assert rows < 3 * T // 4 < T - 1
    r = reference.pad_recv(want.recv[0], worst)  # unchanged when worst is 0
    r2 = reference.pad_recv(reference.dispatch([x2], [idx], [w], E, "rank").recv[0], worst)
    with mock.patch.dict(os.environ, ENV), Buffer(None, from_dict(cfg)) as buf:
        rx, ri, rw, per_expert, handle, _ = buf.dispatch(x, idx, w, num_worst_tokens=worst)
        for name, got, exp in (("x", rx, r.x), ("topk_idx", ri, r.topk_idx), ("topk_weights", rw, r.topk_weights)):
            assert_bitwise(name, got, exp, f"dispatch (num_worst_tokens={worst})")
        got = per_expert.tolist() if worst else per_expert
        assert got == r.num_recv_tokens_per_expert.tolist(), (got, r.num_recv_tokens_per_expert)
        assert_bitwise("x", buf.dispatch(x2, handle=handle)[0], r2.x, "cached dispatch")
        y = (rx.float() * 1.5).to(torch.bfloat16)
        out, _, _ = buf.combine(y, handle)
        exp, _ = reference.combine([y[:rows]], want, [idx], [w], E, "rank")[0]
        assert_bitwise("combined_x", out, exp, "combine")
        buf.synchronize()


def test_rank_major_worst_outputs_are_final_for_the_next_op_on_the_stream(seed):
    """World size 1, rank-major, num_worst_tokens: alone_rows_kernel starts on the routing's placed
    marks and the tail kernel follows it; the stream must still order every store before the
    next op queued on it: 12 dispatches of 4096 tokens at hidden 7168, each read by clones
    queued right after it (no host wait between), must hold the reference's rows, ids, weights
    and per-expert counts."""
    from symmoe import reference
    from symmoe.buffer import Buffer
    from symmoe.testing import assert_bitwise

    T, E, H, K = 4096, 64, 7168, 8
    cfg = gpu_config(**{"buffer.hidden": H, "buffer.max_tokens_per_rank": T, "kernel.num_sms": 132,
                        "buffer.num_experts": E, "buffer.output_layout": "rank"})
    g = torch.Generator(device="cuda").manual_seed(seed + 581)
    inputs, snaps = [], []
    with mock.patch.dict(os.environ, ENV), Buffer(None, from_dict(cfg)) as buf:
        for _ in range(12):
            x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
            idx = torch.rand(T, E, device="cuda", generator=g).topk(K, dim=1).indices
            idx[:, 1:][torch.rand(T, K - 1, device="cuda", generator=g) < 0.3] = -1
            w = torch.rand(T, K, device="cuda", generator=g)
            rx, ri, rw, per_expert, _, _ = buf.dispatch(x, idx, w, num_worst_tokens=T)
            snaps.append((rx.clone(), ri.clone(), rw.clone(), per_expert.clone()))
            inputs.append((x, idx, w))
        buf.synchronize()
    for i, ((x, idx, w), (sx, si, sw, sp)) in enumerate(zip(inputs, snaps)):
        r = reference.pad_recv(reference.dispatch([x], [idx], [w], E, "rank").recv[0], T)
        for name, got, exp in (("x", sx, r.x), ("topk_idx", si, r.topk_idx), ("topk_weights", sw, r.topk_weights)):
            assert_bitwise(name, got, exp, f"dispatch {i}, read right after it")
        assert sp.tolist() == r.num_recv_tokens_per_expert.tolist(), (i, sp.tolist())


@pytest.mark.parametrize("layout", ["expert", "rank"])
@pytest.mark.parametrize("num_sms", [8, 132])
def test_steal_hands_the_later_rounds_to_whichever_block_asks_and_moves_the_same_rows(num_sms, layout, seed):
    """kernel.fan_phases=steal at world size 1: round 0 is block b's group of 16 tokens, the later
    groups go to the blocks that ask first (1984-3968 tokens, up to 248 groups: 8 blocks ask for
    all but 8 of them, 132 blocks for up to 116). The dispatch and the cached dispatch (both
    layouts; expert-major, alone_fan_kernel) must move the reference's rows, twice in a row (the
    counter is zero again after each launch), and their num_worst_tokens outputs too."""
    cfg = gpu_config(**{"buffer.hidden": 7168, "buffer.max_tokens_per_rank": 3968, "kernel.num_sms": num_sms,
                        "buffer.output_layout": layout, "kernel.fan_phases": "steal"})
    n, layouts = 3, (layout,)
    assert _run(1, cfg, seed + 572 + num_sms, CHECK_ROUTINGS[:n], layouts, repeats=2) == [2 * n]
    assert _on_ranks(check_cached_dispatch, 1, (cfg, seed + 573, CHECK_ROUTINGS[:n], layouts, "cuda")) == [n]
    assert _on_ranks(check_num_worst_tokens, 1, (cfg, seed + 574, CHECK_ROUTINGS[:n], layouts, "cuda")) == [n]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_other_payload_dtypes(dtype, seed):
    cfg = gpu_config(**{"buffer.dtype": dtype, "buffer.hidden": 136})
    assert _run(2, cfg, seed + 77, CHECK_ROUTINGS[:3]) == [6, 6]


def test_repeated_calls_and_big_pieces(seed):
    # hidden 16384 fp32: rows of 64 KiB move in several bulk pieces; repeats reuse the buffer.
    cfg = gpu_config(protocol="pull", **{"buffer.dtype": "float32", "buffer.hidden": 16384,
                                        "buffer.max_tokens_per_rank": 24, "buffer.topk": 4, "buffer.num_experts": 16})
    assert _run(4, cfg, seed + 9, CHECK_ROUTINGS[:2], repeats=3) == [12] * 4


@pytest.mark.parametrize("protocol", ["pull", "push"])
def test_x_built_in_the_input_view_is_dispatched_where_it_lies(protocol, seed):
    """Buffer.input_view: pull's peers read x in place (no publish copy); x is left as it was."""
    assert _run(2, gpu_config(protocol=protocol), seed + 96, x_in_buffer=True) == [len(CHECK_ROUTINGS) * 2] * 2


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_cached_dispatch_moves_new_rows_along_the_handles_routing(world_size, protocol, seed):
    """dispatch(x, handle=...) after other dispatches overwrote the routing it published: the
    reference's rows for the new x, the same handle back, and a combine on it still exact."""
    args = (gpu_config(protocol=protocol), seed + 97 + world_size, CHECK_ROUTINGS, ("rank", "expert"), "cuda", world_size == 2)
    assert _on_ranks(check_cached_dispatch, world_size, args) == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_num_worst_tokens_returns_the_worst_case_outputs_without_a_copy(world_size, protocol, seed):
    """num_worst_tokens=N: N rows, the reference's first, then x 0, ids -1, weights 0; a cached
    dispatch too; N below the most rows any rank receives raises CapacityError on every rank."""
    args = (gpu_config(protocol=protocol), seed + 131 + world_size, CHECK_ROUTINGS, ("rank", "expert"), "cuda")
    assert _on_ranks(check_num_worst_tokens, world_size, args) == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("protocol", ["pull", "push"])
def test_back_to_back_combines_on_one_handle(protocol, seed):
    """Three combines in a row on one handle (a backward pass), each with other expert outputs."""
    assert _run(2, gpu_config(protocol=protocol), seed + 95, CHECK_ROUTINGS[:3], combines=3) == [6, 6]


# -- the streamed push (kernel.push_mode=stream; under MPS "auto" keeps push + unpack) -------
STREAM = {"protocol": "push", "kernel.push_mode": "stream"}


@pytest.mark.parametrize("hidden", [256, 7168])
@pytest.mark.parametrize("world_size", [2, 4])
def test_streamed_push_is_bitwise_equal_to_reference(world_size, hidden, seed):
    """One kernel of sender and receiver channels: receivers copy rows out of the pool as
    the senders' tail words announce them; both layouts, every routing kind."""
    cfg = gpu_config(**STREAM, **{"buffer.hidden": hidden})
    assert _run(world_size, cfg, seed + 4343 + world_size + hidden) == [len(CHECK_ROUTINGS) * 2] * world_size


@pytest.mark.parametrize("receivers", [1, 3])
def test_streamed_push_over_many_chunks_and_channels(receivers, seed):
    """2048 tokens per rank on 32 SMs: 31 or 29 sender blocks (channels), several chunks (and
    tail signals) each, and 1 or 3 receiver blocks serving all of them (31; or 10, 10 and 9
    channels each), and a routing split over 16 chunks; three dispatches in a row on the
    same buffer."""
    cfg = gpu_config(**STREAM, **{"buffer.hidden": 64, "buffer.max_tokens_per_rank": 2048, "kernel.num_sms": 32,
                                  "kernel.stream_receivers": receivers})
    assert _run(2, cfg, seed + 556 + receivers, CHECK_ROUTINGS[:4], repeats=3) == [24, 24]


@pytest.mark.parametrize("check", [check_cached_dispatch, check_num_worst_tokens])
def test_streamed_push_cached_and_worst_case_dispatch(check, seed):
    args = (gpu_config(**STREAM), seed + 199, CHECK_ROUTINGS, ("rank", "expert"), "cuda")
    if check is check_cached_dispatch:
        args += (True,)
    assert _on_ranks(check, 2, args) == [len(CHECK_ROUTINGS) * 2] * 2


def test_single_process_world_size_one_without_process_group(seed):
    cfg = gpu_config()
    assert _run(1, cfg, seed + 5, CHECK_ROUTINGS[:2]) == [4]


def test_calls_record_an_event_unless_told_not_to(seed):
    """By default dispatch and combine return an event recorded after their work on the stream;
    record_event=False (the V1 shim's async_finish=False, DeepEP's default) returns one holding
    no CUDA event, and the results are the same."""
    from symmoe.buffer import Buffer

    g = torch.Generator().manual_seed(seed)
    T, E, K = 48, 64, 8
    x = torch.randn(T, 256, generator=g).to("cuda", torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).cuda()
    w = torch.rand(T, K, generator=g).cuda()
    with mock.patch.dict(os.environ, ENV), Buffer(None, from_dict(gpu_config())) as buf:
        rx, _, _, _, handle, ev = buf.dispatch(x, idx, w)
        out, _, cev = buf.combine(rx, handle)
        assert isinstance(ev.event, torch.cuda.Event) and isinstance(cev.event, torch.cuda.Event)
        cev.synchronize()
        assert ev.event.query() and cev.event.query()
        rx2, _, _, _, handle2, quiet = buf.dispatch(x, idx, w, record_event=False)
        out2, _, cquiet = buf.combine(rx2, handle2, record_event=False)
        assert quiet.event is None and cquiet.event is None
        assert torch.equal(rx2.view(torch.int16), rx.view(torch.int16))
        assert torch.equal(out2.view(torch.int16), out.view(torch.int16))


def test_a_timeline_buffer_smaller_than_the_grid_needs_is_refused():
    from symmoe.bench import timeline
    from symmoe.buffer import Buffer

    with mock.patch.dict(os.environ, ENV), Buffer(None, from_dict(gpu_config())) as buf:
        ctx = buf._protocol.ctx
        need = buf._protocol.shape.dispatch * timeline.words(buf._protocol.mod.STAMP_WARPS)
        with pytest.raises(ValueError, match=f"words={need - 1}.*needs {need}"):
            ctx.set_stamps(1 << 20, need - 1)
        ctx.set_stamps(0)  # the normal kernels: nothing to size


# -- what the host reads after its wait ----------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_routing_kernel_leaves_the_host_the_matrix_s_summary(world_size, seed):
    assert _on_ranks(check_counts_summary, world_size, (gpu_config(), seed + 17)) == [3 * len(CHECK_ROUTINGS)] * world_size


# -- a rank that never arrives -------------------------------------------------------------
def _absent_peer(rank: int, world_size: int, cfg_dict: dict, stage: str) -> tuple:
    from symmoe import Buffer, StallError

    cfg = from_dict(cfg_dict)
    timeout = cfg.kernel.timeout_s
    b = cfg.buffer
    torch.manual_seed(rank)
    T = 32
    x = torch.randn(T, b.hidden, device="cuda").to(torch.bfloat16)
    idx = torch.rand(T, b.num_experts, device="cuda").topk(b.topk, dim=1).indices
    w = torch.rand(T, b.topk, device="cuda")
    with Buffer(None, cfg) as buf:
        if rank == 1 and stage == "dispatch.counts":
            time.sleep(3 * timeout + 2)  # arrives only after rank 0 gave up
            return ("absent",)
        if stage in ("combine.data", "barrier"):
            rx, ri, rw, _, handle, _ = buf.dispatch(x, idx, w)
            if rank == 1:
                time.sleep(3 * timeout + 2)
                return ("absent",)
        t0 = time.monotonic()
        try:
            if stage == "dispatch.counts":
                buf.dispatch(x, idx, w)
            elif stage == "barrier":  # the stream-ordered barrier the benchmark starts calls with
                buf._protocol.barrier_on_stream()
                buf.synchronize()
            else:
                buf.combine(rx, handle)
                buf.synchronize()
        except StallError as e:
            return ("stall", e.stage, time.monotonic() - t0, str(e))
        return ("no error",)


@pytest.mark.parametrize("stage", ["dispatch.counts", "combine.data", "barrier"])
def test_absent_rank_raises_stall_error_naming_the_stage(stage):
    timeout = 2.0
    cfg = gpu_config(**{"kernel.timeout_s": timeout})
    out = spawn(_absent_peer, 2, args=(cfg, stage), env=ENV, timeout_s=120.0)
    assert out[1] == ("absent",)
    kind, got_stage, waited, msg = out[0]
    assert kind == "stall" and got_stage == stage, out[0]
    assert waited < timeout + 5.0, out[0]
    assert "rank 0" in msg and "rank 1" in msg, msg


@pytest.mark.parametrize("kind", ["range", "duplicate"])
def test_bad_expert_id_raises_on_every_rank_and_the_buffer_stays_usable(kind):
    """Expert ids are checked inside the routing kernel (no host sync): the bad rank's error
    names the id and token, the others name the bad rank, nothing moved, and the next dispatch
    on the same buffers is bitwise equal to the reference."""
    from symmoe.testing.faults import bad_expert_id, expect_bad_expert_id_errors

    cfg = gpu_config()
    out = spawn(bad_expert_id, 2, args=(cfg, kind, 11), env=ENV, timeout_s=180.0)
    expect_bad_expert_id_errors(out, kind, cfg["buffer"]["num_experts"])


def test_bad_expert_id_with_num_worst_tokens_raises_by_synchronize_on_every_rank():
    """A num_worst_tokens dispatch does not wait for the routing kernel's checks: the same
    errors come back by synchronize() (or the next call), and the buffer stays usable."""
    from symmoe.testing.faults import bad_expert_id, expect_bad_expert_id_errors

    cfg = gpu_config()
    out = spawn(bad_expert_id, 2, args=(cfg, "range", 12, 64), env=ENV, timeout_s=180.0)
    expect_bad_expert_id_errors(out, "range", cfg["buffer"]["num_experts"])
    assert all("num_worst_tokens=64" in msg for msg in out), out


@pytest.mark.parametrize("protocol", ["pull", "push"])
def test_receiver_over_capacity_raises_on_every_rank(protocol):
    """Every token to expert 0 with buffer.recv_capacity 40 (rank 0 would receive 2 x 96): every
    rank raises CapacityError naming rank 0's rows and buffer.recv_capacity, decided from the
    same counts matrix everywhere."""
    from symmoe.testing.faults import overflow

    cfg = gpu_config(protocol=protocol, **{"buffer.recv_capacity": 40})
    out = spawn(overflow, 2, args=(cfg,), env=ENV, timeout_s=180.0)
    for msg in out:
        assert "rank 0 would receive 192 rows" in msg and "recv_capacity" in msg, msg


@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("worst", [0, 64])
def test_alone_bad_expert_id_and_over_capacity_raise_and_the_buffer_stays_usable(worst, layout):
    """World size 1 (the alone kernels start on the routing's placed chunks, before the bad-id
    flag and the counts are known; the expert-major one loads its first rows even before
    that): an out-of-range id raises InputError naming it, at exact sizes and with
    num_worst_tokens, and the next dispatch on the Buffer is bitwise exact; every token to one
    expert past buffer.recv_capacity raises CapacityError."""
    from symmoe.testing.faults import bad_expert_id, overflow

    cfg = gpu_config(**{"buffer.output_layout": layout})
    (msg,) = _on_ranks(bad_expert_id, 1, (cfg, "range", 14 + worst, worst))
    assert f"expert id {cfg['buffer']['num_experts'] + 7} (token 3)" in msg, msg
    if worst:
        assert f"num_worst_tokens={worst}" in msg, msg
        return
    (msg,) = _on_ranks(overflow, 1, (gpu_config(**{"buffer.recv_capacity": 40, "buffer.output_layout": layout}),))
    assert "rank 0 would receive 96 rows" in msg and "recv_capacity" in msg, msg


@pytest.mark.parametrize("phases", ["off", "block", "grid", "steal"])
@pytest.mark.parametrize("protocol", ["pull", "push"])
@pytest.mark.parametrize("hidden", [256, 7168])
def test_fan_out_in_phases_matches_the_reference(hidden, protocol, phases, seed):
    """kernel.fan_phases at world size 1 (steal is the default; off runs the bulk-copy mover):
    expert-major rows loaded whole into shared memory and stored in phases, over several rounds
    (up to 1024 tokens on 16 blocks of at most 16 rows), bitwise as the reference; then dispatch
    along a cached handle and num_worst_tokens outputs through the same kernel. The rank-major
    layout runs the mover beside it."""
    cfg = gpu_config(protocol=protocol, **{"buffer.hidden": hidden, "buffer.max_tokens_per_rank": 1024,
                                           "kernel.fan_phases": phases})
    n = len(CHECK_ROUTINGS)
    assert _run(1, cfg, seed + 261 + hidden) == [2 * n]
    layouts = ("rank", "expert")
    assert _on_ranks(check_cached_dispatch, 1, (cfg, seed + 262, CHECK_ROUTINGS, layouts, "cuda")) == [2 * n]
    assert _on_ranks(check_num_worst_tokens, 1, (cfg, seed + 263, CHECK_ROUTINGS, layouts, "cuda")) == [2 * n]


@pytest.mark.parametrize("protocol", ["pull", "push"])
def test_rows_split_into_small_copy_pieces(protocol):
    # kernel.copy_bytes=128: each 512-byte row moves as 4 bulk pieces spread over warps.
    cfg = gpu_config(protocol=protocol, **{"kernel.copy_bytes": 128})
    assert _run(1, cfg, 31, CHECK_ROUTINGS) == [len(CHECK_ROUTINGS) * 2]
