"""nvshmem backend on the GPU: bitwise equal to symmoe.reference at 1 PE and at 2, 4 and 8
processes on one GPU (under CUDA MPS when its daemon runs: each rank gets 100 / W percent of
the SMs), and a rank that never arrives makes the others raise StallError.

On one node every peer is mapped, so the shared CUDA kernels run over the NVSHMEM heap (the
"shared kernels" cases); the push on the NVSHMEM device API, which a multi-node job runs, is
forced with SYMMOE_NVSHMEM_PUTS=1 (mapped peers by stores) or SYMMOE_NVSHMEM_STAGE=1 (every
peer by puts from staging copies), and most tests here exercise it.

Skipped without a CUDA GPU (conftest) or without nvshmem4py."""
from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from conftest import gpu_unusable
from symmoe.config import Config
from symmoe.launch import mps_share, spawn
from symmoe.testing import (CHECK_ROUTINGS, check_cached_dispatch, check_counts_summary, check_dispatch_combine,
                            check_num_worst_tokens)

pytestmark = pytest.mark.gpu


def _usable() -> None:
    from symmoe.backends.nvshmem import NvshmemMemory
    reason = NvshmemMemory.unavailable_reason()
    if reason:
        gpu_unusable(f"nvshmem backend unusable here: {reason}")


def _config(**over: Any) -> dict[str, Any]:
    base = {"backend": "nvshmem", "buffer.hidden": 256, "buffer.max_tokens_per_rank": 64, "buffer.topk": 4,
            "buffer.num_experts": 32, "buffer.expert_alignment": 4, "kernel.timeout_s": 30.0,
            "kernel.num_sms": 8, "kernel.num_channels": 4}
    base.update(over)
    return Config().replace(**base).to_dict()


def _env(world_size: int, shared: bool = False, **extra: str) -> dict[str, str]:
    """The ranks' environment: the put protocol unless ``shared`` (the shared CUDA kernels)."""
    env = {"NVSHMEM_DISABLE_NVLS": "1", **({} if shared else {"SYMMOE_NVSHMEM_PUTS": "1"}), **extra}
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_share(world_size, gpus=1) or 100)
    return env


def _run(world_size: int, cfg: dict[str, Any], seed: int, *args: Any, env: dict[str, str] | None = None) -> list:
    return spawn(check_dispatch_combine, world_size, args=(cfg, seed, *args),
                 env=env or _env(world_size), timeout_s=180.0)


CASES = len(CHECK_ROUTINGS) * 2


@pytest.mark.parametrize("transport", ["shared kernels", "puts"])
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_dispatch_combine_bitwise_equal_to_reference(world_size, transport, seed):
    _usable()
    env = _env(world_size, shared=transport == "shared kernels")
    checked = _run(world_size, _config(), seed + world_size, CHECK_ROUTINGS, ("rank", "expert"), "cuda", env=env)
    assert checked == [CASES] * world_size


@pytest.mark.parametrize("check", [check_cached_dispatch, check_num_worst_tokens], ids=["cached", "worst"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_shared_kernels_over_the_heap_run_cached_and_worst_case_dispatch(world_size, check, seed):
    """One node: the protocol is the shared CUDA push over the NVSHMEM heap, as over torch's
    symmetric memory, and its cached and num_worst_tokens dispatches are the reference's."""
    _usable()
    assert spawn(_protocol_name, world_size, env=_env(world_size, shared=True), timeout_s=120.0) == ["push"] * world_size
    got = spawn(check, world_size, args=(_config(), seed + 7000 + world_size, CHECK_ROUTINGS, ("rank", "expert"),
                                         "cuda"), env=_env(world_size, shared=True), timeout_s=180.0)
    assert got == [CASES] * world_size


def _protocol_name(rank: int, world_size: int) -> str:
    from symmoe import Buffer
    from symmoe.config import from_dict
    from symmoe.protocol.cuda import CudaPush

    with Buffer(None, from_dict(_config())) as buf:
        assert isinstance(buf._protocol, CudaPush), type(buf._protocol).__name__
        return buf.protocol


@pytest.mark.parametrize("world_size", [2, 4])
def test_rows_stream_through_rings_shorter_than_a_channel_s_share(world_size, seed):
    """kernel.ring_rows=3: a channel's share of up to 16 rows from one source (64 tokens, 4
    channels) wraps its ring several times, so senders wait on the receivers' head counters
    before reusing a slot. Bitwise, both layouts, twice on one buffer; at 2 PEs also through
    the put path (staged) and with a cached dispatch."""
    _usable()
    cfg = _config(**{"kernel.ring_rows": 3})
    assert _run(world_size, cfg, seed + 300 + world_size, CHECK_ROUTINGS, ("rank", "expert"), "cuda",
                2) == [2 * CASES] * world_size
    if world_size == 2:
        staged = _env(2, SYMMOE_NVSHMEM_STAGE="1")
        assert _run(2, cfg, seed + 310, CHECK_ROUTINGS, ("rank", "expert"), "cuda", env=staged) == [CASES] * 2
        got = spawn(check_cached_dispatch, 2, args=(cfg, seed + 320, CHECK_ROUTINGS, ("rank", "expert"), "cuda"),
                    env=_env(2), timeout_s=180.0)
        assert got == [CASES] * 2


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_plan_kernel_leaves_the_host_the_matrix_s_summary(world_size, seed):
    _usable()
    checked = spawn(check_counts_summary, world_size, args=(_config(), seed + 100 + world_size), env=_env(world_size),
                    timeout_s=180.0)
    assert checked == [3 * len(CHECK_ROUTINGS)] * world_size


def test_payload_dtypes_and_staged_puts(seed):
    """fp16/fp32 rows, and the IBGDA-style path that puts from symmetric staging copies (or
    from x itself when it was built in Buffer.input_view)."""
    _usable()
    for dtype in ("float16", "float32"):
        assert _run(2, _config(**{"buffer.dtype": dtype}), seed + 77, CHECK_ROUTINGS[:3], ("rank", "expert"),
                    "cuda") == [6, 6]
    staged = _env(2, SYMMOE_NVSHMEM_STAGE="1")
    assert _run(2, _config(), seed + 78, CHECK_ROUTINGS, ("rank", "expert"), "cuda", env=staged) == [CASES] * 2
    # x built in Buffer.input_view is already symmetric: the puts read it there, no staging copy.
    assert _run(2, _config(), seed + 79, CHECK_ROUTINGS[:3], ("rank", "expert"), "cuda", 1, 1, True, env=staged) == [6, 6]


def test_deepseek_shape_many_channels_and_repeats(seed):
    """Large rows (7168 bf16), top-8 of 64 experts, several channels and chunks, buffer reuse."""
    _usable()
    cfg = _config(**{"buffer.hidden": 7168, "buffer.max_tokens_per_rank": 512, "buffer.topk": 8,
                     "buffer.num_experts": 64, "kernel.num_sms": 16, "kernel.num_channels": 8})
    assert _run(4, cfg, seed + 91, CHECK_ROUTINGS[:2], ("rank", "expert"), "cuda", 2) == [8] * 4


def test_back_to_back_combines_on_one_handle(seed):
    """Three combines in a row on one handle, each with other expert outputs: a peer still
    reducing the previous combine must not see its slots overwritten (barrier "combine.done")."""
    _usable()
    assert _run(2, _config(), seed + 93, CHECK_ROUTINGS[:3], ("rank", "expert"), "cuda", 1, 3) == [6, 6]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_cached_dispatch_moves_new_rows_along_the_handles_routing(world_size, seed):
    """dispatch(x, handle=...) after other dispatches: the handle's own routing tables, the
    reference's rows for the new x, and a combine on the handle still exact (staged puts at 2)."""
    _usable()
    env = _env(world_size, SYMMOE_NVSHMEM_STAGE="1") if world_size == 2 else _env(world_size)
    got = spawn(check_cached_dispatch, world_size, args=(_config(), seed + 5000 + world_size, CHECK_ROUTINGS,
                                                         ("rank", "expert"), "cuda"), env=env, timeout_s=180.0)
    assert got == [CASES] * world_size


@pytest.mark.parametrize("world_size", [1, 2])
def test_num_worst_tokens_returns_the_worst_case_outputs_without_a_copy(world_size, seed):
    """num_worst_tokens=N: N rows, the reference's first, then x 0, ids -1, weights 0 (cached
    dispatch too); fewer than some rank receives raises CapacityError on every rank."""
    _usable()
    got = spawn(check_num_worst_tokens, world_size, args=(_config(), seed + 6000 + world_size, CHECK_ROUTINGS,
                                                          ("rank", "expert"), "cuda"), env=_env(world_size),
                timeout_s=180.0)
    assert got == [CASES] * world_size


@pytest.mark.parametrize("phases", ["off", "block", "grid", "steal"])
@pytest.mark.parametrize("hidden", [256, 7168])
def test_one_pe_fan_out_in_phases_matches_the_reference(hidden, phases, seed):
    """Alone, the expert-major dispatch runs the CUDA protocols' phased fan-out (alone_fan_kernel;
    off: dispatch_kernel's warps copy each row once per slot) and the rank-major one their mover
    (alone_rows_kernel, many tokens a warp): up to 1024 tokens on 8 blocks of at most 16 rows,
    so several rounds, bitwise as the reference with the combine after it;
    then (hidden 256: each spawn starts NVSHMEM, and the row size changes nothing there) a
    cached dispatch and num_worst_tokens outputs through the same kernel."""
    _usable()
    cfg = _config(**{"buffer.hidden": hidden, "buffer.max_tokens_per_rank": 1024, "kernel.fan_phases": phases})
    layouts = ("rank", "expert")
    assert _run(1, cfg, seed + 400 + hidden, CHECK_ROUTINGS, layouts, "cuda") == [CASES]
    if hidden != 256:
        return
    for check, offset in ((check_cached_dispatch, 401), (check_num_worst_tokens, 402)):
        got = spawn(check, 1, args=(cfg, seed + offset + hidden, CHECK_ROUTINGS, layouts, "cuda"), env=_env(1),
                    timeout_s=180.0)
        assert got == [CASES]


def test_one_pe_dispatch_on_32_blocks_at_the_deepseek_hidden_size(seed):
    """Alone, the plan kernel, then symmoe_cuda's alone kernels on 32 blocks (1024 tokens at
    hidden 7168): both layouts' rows, combine, a cached dispatch and num_worst_tokens outputs are
    the reference's."""
    _usable()
    cfg = _config(**{"buffer.hidden": 7168, "buffer.max_tokens_per_rank": 1024, "kernel.num_sms": 32})
    layouts = ("rank", "expert")
    for check, offset in ((check_dispatch_combine, 411), (check_cached_dispatch, 412), (check_num_worst_tokens, 413)):
        got = spawn(check, 1, args=(cfg, seed + offset, CHECK_ROUTINGS, layouts, "cuda"), env=_env(1),
                    timeout_s=180.0)
        assert got == [CASES]


@pytest.mark.parametrize("kind", ["range", "duplicate"])
def test_bad_expert_id_raises_on_every_rank_and_the_buffer_stays_usable(kind):
    """Expert ids are checked inside the routing kernel: the bad rank names the id and token,
    the other names the bad rank, nothing moved, and the next dispatch is bitwise exact."""
    from symmoe.testing.faults import bad_expert_id, expect_bad_expert_id_errors
    _usable()
    cfg = _config()
    out = spawn(bad_expert_id, 2, args=(cfg, kind, 12), env=_env(2), timeout_s=180.0)
    expect_bad_expert_id_errors(out, kind, cfg["buffer"]["num_experts"])


def test_bad_expert_id_with_num_worst_tokens_raises_by_synchronize_on_every_rank():
    """num_worst_tokens: no host wait, so the routing kernel's verdict comes back by
    synchronize() (or the next call) on every rank, and the buffer stays usable."""
    from symmoe.testing.faults import bad_expert_id, expect_bad_expert_id_errors
    _usable()
    cfg = _config()
    out = spawn(bad_expert_id, 2, args=(cfg, "range", 13, 64), env=_env(2), timeout_s=180.0)
    expect_bad_expert_id_errors(out, "range", cfg["buffer"]["num_experts"])
    assert all("num_worst_tokens=64" in msg for msg in out), out


def test_receiver_over_capacity_raises_on_every_rank():
    """Every token to expert 0 with buffer.recv_capacity 40: the kernels move nothing and every rank
    raises CapacityError (decided from the same counts matrix everywhere)."""
    from symmoe.testing.faults import overflow
    _usable()
    out = spawn(overflow, 2, args=(_config(**{"buffer.recv_capacity": 40}),), env=_env(2), timeout_s=180.0)
    assert all("recv_capacity" in m for m in out), out


def test_one_pe_bad_expert_id_and_over_capacity_move_nothing_and_raise():
    """Alone (the alone kernels): an out-of-range id raises InputError naming it, and the next
    dispatch is bitwise exact; every token to one expert past buffer.recv_capacity raises
    CapacityError."""
    from symmoe.testing.faults import bad_expert_id, overflow
    _usable()
    cfg = _config()
    (msg,) = spawn(bad_expert_id, 1, args=(cfg, "range", 14), env=_env(1), timeout_s=180.0)
    assert f"expert id {cfg['buffer']['num_experts'] + 7} (token 3)" in msg and "moved nothing on any rank" in msg, msg
    (msg,) = spawn(overflow, 1, args=(_config(**{"buffer.recv_capacity": 40}),), env=_env(1), timeout_s=180.0)
    assert "recv_capacity" in msg, msg


def absent_rank(rank: int, world_size: int, config: dict[str, Any]) -> tuple[str, float]:
    """The last rank never calls dispatch (as if it died); the others must raise in time."""
    from symmoe import Buffer, StallError
    from symmoe.config import from_dict
    from symmoe.workload import Routing, make_inputs

    cfg = from_dict(config)
    b = cfg.buffer
    buf = Buffer(None, cfg)
    inp = make_inputs(Routing("uniform"), num_tokens=8, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                      world_size=world_size, dtype=torch.bfloat16, seed=3)[rank]
    if rank == world_size - 1:
        time.sleep(cfg.kernel.timeout_s * 2)
        buf.memory.mark_broken()  # it "died": no collective teardown
        return "absent", 0.0
    t0 = time.monotonic()
    try:
        buf.dispatch(inp.x.cuda(), inp.topk_idx.cuda(), inp.topk_weights.cuda())
    except StallError as e:
        return str(e), time.monotonic() - t0
    return "no error", time.monotonic() - t0


@pytest.mark.parametrize("world_size,transport", [(2, "puts"), (4, "puts"), (2, "shared kernels")])
def test_absent_rank_raises_stall_error_naming_the_stage(world_size, transport):
    _usable()
    timeout = 3.0
    out = spawn(absent_rank, world_size, args=(_config(**{"kernel.timeout_s": timeout}),),
                env=_env(world_size, shared=transport == "shared kernels"), timeout_s=120.0)
    assert out[-1][0] == "absent"
    for rank, (msg, elapsed) in enumerate(out[:-1]):
        assert f"rank {rank}: stage 'dispatch.counts'" in msg, msg
        assert f"no arrival from rank {world_size - 1}" in msg, msg
        assert elapsed < timeout + 10, elapsed


def test_memory_peer_bases_and_barrier():
    _usable()
    assert spawn(_memory_check, 2, env=_env(2), timeout_s=120.0) == [True, True]


def _memory_check(rank: int, world_size: int) -> bool:
    from symmoe import Buffer
    from symmoe.config import from_dict

    with Buffer(None, from_dict(_config())) as buf:
        mem = buf.memory
        bases = mem.peer_bases.tolist()
        assert bases[rank] == mem.local.data_ptr() and all(b != 0 for b in bases)  # one GPU: all mapped
        # A store through the peer view lands in the peer's segment.
        peer, off = 1 - rank, buf.layout.offsets()["combine_x"]
        mem.peer(peer)[off: off + 8].fill_(rank + 1)
        torch.cuda.synchronize()
        mem.barrier("test")
        assert mem.local[off: off + 8].tolist() == [peer + 1] * 8
        mem.barrier("test.done")
    return True


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_low_latency_mode_over_the_heap_is_the_references_bitwise(world_size, seed):
    """One node: the low-latency kernels run over the NVSHMEM heap (nvshmem_ptr peers) as over
    torch's symmetric memory, with and without receive hooks."""
    from symmoe.testing.low_latency import check_low_latency
    _usable()
    got = spawn(check_low_latency, world_size, args=(_config(), seed + 9000 + world_size, 32, CHECK_ROUTINGS, "cuda"),
                env=_env(world_size, shared=True), timeout_s=180.0)
    assert got == [CASES] * world_size
