"""Session 41: summarized_result's host µs on a CPU-only machine (the after-wait work of an exact
dispatch), on test_counts' W=1 case. Run from the repository root: python results/session41/prof_summarized.py"""
import sys
import timeit

sys.path.insert(0, "tests")
import torch  # noqa: E402

from symmoe.protocol.counts import summarized_result, summary_of  # noqa: E402
from test_counts import CHECK_ROUTINGS, _case, _worst_case_outputs  # noqa: E402

lay, inputs, counts = _case(1, CHECK_ROUTINGS[1], seed=11)
mine = inputs[0]
in_rank = torch.ones((mine.x.shape[0], 1), dtype=torch.bool)
for layout in ("rank", "expert"):
    out = _worst_case_outputs(lay, layout)
    s = summary_of(counts, 0, 1, lay.local_experts)
    f = lambda: summarized_result(lay, s, counts, 0, layout, 1, lambda: None, out, mine.topk_idx,  # noqa: E731
                                  mine.topk_weights, in_rank, 5)
    print(f"{layout}: {min(timeit.repeat(f, number=2000, repeat=5)) / 2000 * 1e6:.1f} µs a call (best of 5 x 2000)")
