"""The order interleaved benchmarks run their implementations in (symmoe.bench.timing.balanced):
each runs right after each other one equally often, so no implementation always inherits the
state another library's calls left behind."""
from collections import Counter
from itertools import pairwise

import pytest

from symmoe.bench.timing import balanced


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_over_a_period_every_item_follows_every_other_item_equally_often(n):
    items = [f"impl{i}" for i in range(n)]
    period = n if n % 2 == 0 else 2 * n
    follows = Counter()
    for turn in range(period):
        row = balanced(items, turn)
        assert sorted(row) == sorted(items)  # each runs once a round
        follows.update(pairwise(row))
    assert len(follows) == n * (n - 1)  # every ordered pair occurs ...
    assert len(set(follows.values())) == 1  # ... equally often
    assert balanced(items, period) == balanced(items, 0)


def test_the_first_round_opens_with_the_first_item_and_lists_of_one_stay_as_they_are():
    assert balanced(["deepep", "push", "pull", "nvshmem"], 0)[0] == "deepep"
    assert balanced([], 3) == [] and balanced(["only"], 5) == ["only"]
    assert balanced(["a", "b"], 1) == ["b", "a"]
