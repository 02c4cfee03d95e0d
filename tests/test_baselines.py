"""symmoe.bench.baselines: the all_to_all_single dispatch/combine agrees bitwise with
symmoe.reference on every routing the backends are checked on, and the baselines run
end to end on the CPU (gloo). CPU only; no assertion on times."""
from __future__ import annotations

import json

import pytest
import torch

from symmoe import reference
from symmoe.bench import baselines
from symmoe.launch import spawn
from symmoe.testing import CHECK_ROUTINGS, assert_bitwise
from symmoe.workload import Routing, make_inputs

HIDDEN, MAX_TOKENS, TOPK, EXPERTS = 64, 40, 4, 32
ROUTINGS = CHECK_ROUTINGS + (Routing("masked", mask_prob=1.0),)  # a case where nothing moves at all


def _token_counts(world_size: int, seed: int) -> list[int]:
    """Different counts per rank; with several ranks, one has no tokens."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, MAX_TOKENS + 1, (world_size,), generator=g).tolist()
    if world_size > 1:
        counts[int(torch.randint(world_size, (1,), generator=g))] = 0
    return counts


def _check_rank(rank: int, world_size: int, seed: int) -> int:
    """Every routing x dtype: a2a_dispatch/a2a_combine against the reference; returns cases."""
    checked = 0
    for i, routing in enumerate(ROUTINGS):
        for dtype in (torch.bfloat16, torch.float32):
            case_seed = seed + 101 * i + (7 if dtype == torch.float32 else 0)
            inputs = make_inputs(routing, num_tokens=_token_counts(world_size, case_seed), hidden=HIDDEN, topk=TOPK,
                                 num_experts=EXPERTS, world_size=world_size, dtype=dtype, seed=case_seed)
            ctx = f"rank {rank}/{world_size} routing={routing.kind} dtype={dtype} seed={case_seed}"
            xs, idxs, ws = [p.x for p in inputs], [p.topk_idx for p in inputs], [p.topk_weights for p in inputs]
            ref = reference.dispatch(xs, idxs, ws, EXPERTS, "rank")
            want = ref.recv[rank]
            recv, handle = baselines.a2a_dispatch(xs[rank], idxs[rank], ws[rank], EXPERTS)
            for name in ("x", "topk_idx", "topk_weights", "num_recv_tokens_per_expert", "src_rank", "src_token"):
                assert_bitwise(f"recv.{name}", getattr(recv, name), getattr(want, name), ctx)
            assert recv.expert_offsets is None, ctx
            ys = [torch.randn(ref.recv[r].x.shape, generator=torch.Generator().manual_seed(case_seed * 7 + r)).to(dtype)
                  for r in range(world_size)]
            want_c = reference.combine(ys, ref, idxs, ws, EXPERTS, "rank")[rank][0]
            assert_bitwise("combined_x", baselines.a2a_combine(ys[rank], handle), want_c, ctx)
            checked += 1
    return checked


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_a2a_dispatch_and_combine_match_reference_bitwise(world_size, seed):
    assert spawn(_check_rank, world_size, args=(seed + world_size,)) == [len(ROUTINGS) * 2] * world_size


def _run_main(rank: int, world_size: int, path: str) -> int:
    return baselines.main(["--tokens", "24", "--hidden", "32", "--topk", "4", "--experts", "8", "--warmup", "1",
                           "--repeats", "3", "--a2a-bytes", "4096", "--p2p-bytes", "4096", "--json", path])


def test_main_alone_runs_in_a_group_of_one(tmp_path, monkeypatch):
    """Outside torchrun and without a caller's group: a group of this process alone, on an
    in-process store (no port to find free first)."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    path = str(tmp_path / "baselines.json")
    assert _run_main(0, 1, path) == 0
    with open(path) as f:
        doc = json.load(f)
    assert doc["world_size"] == 1 and doc["results"]["reference_check"]["bitwise_equal"]
    assert not torch.distributed.is_initialized()


def test_main_runs_on_cpu_and_writes_json(tmp_path):
    path = str(tmp_path / "baselines.json")
    assert spawn(_run_main, 2, args=(path,)) == [0, 0]
    with open(path) as f:
        doc = json.load(f)
    assert {"date", "commit", "device", "command", "torch", "world_size", "shape", "results"} <= set(doc)
    assert doc["world_size"] == 2
    res = doc["results"]
    assert set(res) == {"reference_check", "a2a", "all_to_all", "p2p_copy", "all_to_all_vdev_2d"}
    assert res["reference_check"]["bitwise_equal"], res["reference_check"]["detail"]
    for op in ("dispatch", "combine"):
        assert {"median_us", "p10_us", "p90_us"} <= set(res["a2a"][op])
    assert len(res["a2a"]["ranks"]) == 2
    assert {"algbw_GBps", "busbw_GBps", "median_us"} <= set(res["all_to_all"])
    assert res["all_to_all"]["backend"] == "gloo"
    if not torch.cuda.is_available():
        assert res["p2p_copy"] == {"gpus": 0, "pairs": []}
        vdev = res["all_to_all_vdev_2d"]
        assert vdev["available"] is False and "CUDA is not available" in vdev["reason"], vdev
