"""A data kernel's timeline, read from the stamps its warps write (csrc/common/stamps.cuh):
where one call's time goes between the launch, the prologue (plan tables, mover set-up), the
copy loop and the final drain of the bulk stores. ``scripts/timeline_probe.py`` collects them.

Each warp stamps (globaltimer ns, clock64) at the marks ``MARKS``. The globaltimer is common
to all SMs, so it places warps against each other (launch skew, the last warp's end); clock64
counts the SM's cycles, finer than the globaltimer's steps, and measures the phases inside
one warp (converted to ns at the clock rate the kernel ran at, taken from the two together).
"""
from __future__ import annotations

import statistics
from typing import Sequence

import torch

# stamps.cuh's StampMark in order (tests/test_timeline.py reads the header)
MARKS = ("enter", "checked", "tables", "built", "planned", "routed", "first_push", "loop_end", "flushed")
# (name, from mark, to mark): one warp's phases (those whose marks a kernel has)
PHASES = (("error check", "enter", "checked"), ("tables", "checked", "tables"), ("checks", "tables", "built"),
          ("plan", "checked", "built"), ("mover set-up", "built", "planned"), ("prologue", "enter", "planned"),
          ("first route", "planned", "routed"), ("first load", "routed", "first_push"),
          ("first push", "planned", "first_push"),
          ("loop", "first_push", "loop_end"), ("drain", "loop_end", "flushed"), ("warp", "enter", "flushed"))


def words(warp_slots: int, marks: Sequence[str] = MARKS) -> int:
    """int64 words of one block's timeline: [warp_slots][len(marks)][ns, clock]."""
    return warp_slots * len(marks) * 2


def _pct(xs: Sequence[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"min": s[0], "median": statistics.median(s), "max": s[-1]}


def _blocks(stamps: torch.Tensor, warp_slots: int, marks: Sequence[str]) -> torch.Tensor:
    """The stamps on the host as [blocks][warp_slots][len(marks)][ns, clock]; ValueError when
    they are not whole blocks."""
    m = len(marks)
    if stamps.numel() % words(warp_slots, marks):
        raise ValueError(f"stamps: {stamps.numel()} words is not a whole number of blocks of "
                         f"{warp_slots} warps x {m} marks x 2")
    return stamps.detach().to("cpu", torch.int64).view(-1, warp_slots, m, 2)


def phases(stamps: torch.Tensor, warp_slots: int, marks: Sequence[str] = MARKS,
           spans: Sequence[tuple[str, str, str]] = PHASES) -> dict:
    """stamps: the kernel's int64 words, [blocks][warp_slots][len(marks)][2] flattened; a warp
    that missed a mark (one that never ran is all zero) is left out.
    Returns µs: per phase of ``spans`` the min / median / max over warps (``phases`` lists those
    whose marks ``marks`` has); ``start`` and ``end`` (each warp's enter and flushed against the
    first warp's enter, globaltimer); ``at`` (each mark against the first warp's enter: where the
    warps are on the grid's clock); ``span`` (first enter to last flushed); ``clock_ghz``;
    ``warps``."""
    m = len(marks)
    t = _blocks(stamps, warp_slots, marks).reshape(-1, m, 2)
    ix = {k: i for i, k in enumerate(marks)}
    t = t[(t != 0).all(dim=2).all(dim=1)]  # warps that stamped every mark
    if t.shape[0] == 0:
        raise ValueError("stamps: no warp stamped every mark (was the timeline set before the call?)")
    ns, clk = t[:, :, 0].double(), t[:, :, 1].double()
    enter, flushed = ix["enter"], ix["flushed"]
    wall = ns[:, flushed] - ns[:, enter]
    cyc = clk[:, flushed] - clk[:, enter]
    ghz = statistics.median((cyc[wall > 0] / wall[wall > 0]).tolist()) if bool((wall > 0).any()) else float("nan")
    out: dict = {"warps": int(t.shape[0]), "clock_ghz": ghz}
    out["phases"] = [name for name, a, b in spans if a in ix and b in ix]
    for name, a, b in spans:
        if name in out["phases"]:
            out[name] = _pct(((clk[:, ix[b]] - clk[:, ix[a]]) / ghz / 1e3).tolist())
    t0 = float(ns[:, enter].min())
    out["at"] = {k: _pct(((ns[:, i] - t0) / 1e3).tolist()) for k, i in ix.items()}
    out["start"] = _pct(((ns[:, enter] - t0) / 1e3).tolist())
    out["end"] = _pct(((ns[:, flushed] - t0) / 1e3).tolist())
    out["span"] = float(ns[:, flushed].max() - t0) / 1e3
    return out


def table(name: str, p: dict) -> list[str]:
    """A few lines for one kernel's phases (µs: min / median / max over warps)."""
    lines = [f"{name}: {p['warps']} warps, span {p['span']:.1f} us, clock {p['clock_ghz']:.2f} GHz"]
    for k in ("start", *p["phases"], "end"):
        v = p[k]
        lines.append(f"  {k:<15} {v['min']:7.2f} {v['median']:7.2f} {v['max']:7.2f}")
    return lines
