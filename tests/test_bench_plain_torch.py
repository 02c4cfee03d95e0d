"""symmoe.bench's plain-torch dispatches at world size 1, the baselines of every speed-up the
bench reports: each moves exactly the reference's rows, and the cached one gathers along a
routing computed once, as our cached dispatch reuses its handle's. CPU only."""
from __future__ import annotations

import pytest
import torch

from symmoe import reference
from symmoe.bench import gpu as bench
from symmoe.testing import CHECK_ROUTINGS, assert_bitwise
from symmoe.workload import make_inputs

HIDDEN, TOKENS, TOPK, EXPERTS = 32, 40, 4, 16
# The bench draws uniform routings; with masked slots plain torch's argsort would put their
# rows first, so those routings are no baseline.
UNMASKED = [r for r in CHECK_ROUTINGS if r.kind not in ("masked", "one_expert")]


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_plain_torch_dispatches_move_the_reference_rows(layout, seed):
    for i, routing in enumerate(UNMASKED):
        (inp,) = make_inputs(routing, num_tokens=[TOKENS], hidden=HIDDEN, topk=TOPK, num_experts=EXPERTS,
                             world_size=1, dtype=torch.bfloat16, seed=seed + i)
        assert (inp.topk_idx >= 0).all()
        want = reference.dispatch([inp.x], [inp.topk_idx], [inp.topk_weights], EXPERTS, layout).recv[0].x
        fns = bench.torch_dispatches(inp.x, inp.topk_idx)[layout]
        assert set(fns) == {"dispatch", "cached_dispatch"}
        for op, fn in fns.items():
            assert_bitwise(f"plain torch {op}", fn(), want, f"routing={routing.kind} layout={layout} seed={seed + i}")


def test_the_cached_baseline_routes_once_and_the_whole_dispatch_every_call(seed):
    (inp,) = make_inputs(CHECK_ROUTINGS[0], num_tokens=[TOKENS], hidden=HIDDEN, topk=TOPK, num_experts=EXPERTS,
                         world_size=1, dtype=torch.bfloat16, seed=seed)
    idx = inp.topk_idx.clone()
    fns = bench.torch_dispatches(inp.x, idx)["expert"]
    before = fns["cached_dispatch"]()
    idx.copy_(idx.flip(0))  # a new routing in the same tensor: only the whole dispatch sees it
    assert torch.equal(fns["cached_dispatch"](), before)
    assert torch.equal(fns["dispatch"](), inp.x.index_select(0, torch.argsort(idx.flatten(), stable=True) // TOPK))


def test_the_baselines_time_each_plain_torch_op_once_per_layout(monkeypatch, seed):
    """_torch_baselines' table (its CUDA timing replaced: each op runs once, 1 µs)."""
    (inp,) = make_inputs(CHECK_ROUTINGS[0], num_tokens=[TOKENS], hidden=HIDDEN, topk=TOPK, num_experts=EXPERTS,
                         world_size=1, dtype=torch.bfloat16, seed=seed)
    ran = []
    monkeypatch.setattr(bench, "_time", lambda fn, *a, **k: (ran.append(fn()), [1e-6])[1])
    ys = {lay: reference.dispatch([inp.x], [inp.topk_idx], [inp.topk_weights], EXPERTS, lay).recv[0].x
          for lay in ("rank", "expert")}
    base = bench._torch_baselines(inp.x, inp.topk_idx, inp.topk_weights, ys["rank"], ys["expert"], 1, 1, 0)
    assert {lay: sorted(ops) for lay, ops in base.items()} == {
        lay: ["cached_dispatch", "combine", "dispatch"] for lay in ("rank", "expert")}
    assert all(o["median_us"] == pytest.approx(1.0) for ops in base.values() for o in ops.values())
    assert len(ran) == 6 and all(isinstance(t, torch.Tensor) for t in ran)
