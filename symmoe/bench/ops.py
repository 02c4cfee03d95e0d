"""The ops a benchmark times, in table order, and how the tables name them.

``cached_dispatch`` is ``dispatch(x, handle=...)`` along the routing of the op's last
dispatch; it moves the same rows as ``dispatch``, so the same bytes apply to it; its
plain-torch baseline gathers along a routing computed once (older files hold only plain
torch's whole dispatch, which routes too). ``worst_dispatch`` (rank-major) is ``dispatch(...,
num_worst_tokens=W * T)``, DeepEP's worst-case sizes: the same rows again, and no host wait
on the CUDA protocols. Older files may lack either.

A rank's ``kernels_us[op]`` holds each kernel's device µs per call and (except in older files)
``BUSY``: the time some kernel of the call ran (the union of their intervals). A kernel
launched to follow another (programmatic dependent launch) starts early and waits for it, so
the per-kernel times overlap and their sum overstates the call; ``kernels_total`` reads BUSY
where a file has it.
"""
from __future__ import annotations

from typing import Any

OPS = ("dispatch", "worst_dispatch", "cached_dispatch", "combine")
BASE_OPS = ("dispatch", "combine")  # what baselines and targets know; the other dispatches count as dispatch
BASE_OP = {"dispatch": "dispatch", "worst_dispatch": "dispatch", "cached_dispatch": "dispatch", "combine": "combine"}
LABEL = {"dispatch": "dispatch", "worst_dispatch": "worst dispatch", "cached_dispatch": "cached dispatch",
         "combine": "combine"}


def ops_of(entry: dict[str, Any]) -> list[str]:
    """The ops an entry (a rank's or a summary's layout) holds, in table order."""
    return [op for op in OPS if op in entry]


BUSY = "(busy: the kernels' union)"


def kernels_total(kernels: dict[str, float]) -> float:
    """Device µs per call of a rank's ``kernels_us[op]``: BUSY, else (older files) the sum."""
    if BUSY in kernels:
        return kernels[BUSY]
    return sum(kernels.values())


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total
