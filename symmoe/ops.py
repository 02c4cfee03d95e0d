"""The ops a benchmark times, in table order, and how the tables name them.

``cached_dispatch`` is ``dispatch(x, handle=...)`` along the routing of the op's last
dispatch (bench files since session 7 hold it); it moves the same rows as ``dispatch``, so
the same bytes and the same baselines apply to it.
"""
from __future__ import annotations

from typing import Any

OPS = ("dispatch", "cached_dispatch", "combine")
BASE_OPS = ("dispatch", "combine")  # what baselines and targets know; a cached dispatch counts as dispatch
BASE_OP = {"dispatch": "dispatch", "cached_dispatch": "dispatch", "combine": "combine"}
LABEL = {"dispatch": "dispatch", "cached_dispatch": "cached dispatch", "combine": "combine"}


def ops_of(entry: dict[str, Any]) -> list[str]:
    """The ops an entry (a rank's or a summary's layout) holds, in table order."""
    return [op for op in OPS if op in entry]
