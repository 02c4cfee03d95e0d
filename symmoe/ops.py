"""The ops a benchmark times, in table order, and how the tables name them.

``cached_dispatch`` is ``dispatch(x, handle=...)`` along the routing of the op's last
dispatch (bench files since session 7 hold it); it moves the same rows as ``dispatch``, so
the same bytes apply to it; its plain-torch baseline gathers along a routing computed once
(since session 33; earlier files hold only plain torch's whole dispatch, which routes too).
``worst_dispatch`` (rank-major, bench files since session 12) is ``dispatch(...,
num_worst_tokens=W * T)``, DeepEP's worst-case sizes: the same rows again, and no host wait
on the CUDA protocols.
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
