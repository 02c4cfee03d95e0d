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
MARKS = ("enter", "checked", "tables", "built", "planned", "routed", "first_push", "loop_end", "flushed", "walked",
         "scanned")
# (name, from mark, to mark): one warp's phases (those whose marks a kernel has)
PHASES = (("error check", "enter", "checked"), ("tables", "checked", "tables"), ("checks", "tables", "built"),
          ("plan", "checked", "built"), ("mover set-up", "built", "planned"), ("prologue", "enter", "planned"),
          ("first route", "planned", "routed"), ("first load", "routed", "first_push"),
          ("first push", "planned", "first_push"),
          ("loop", "first_push", "loop_end"), ("drain", "loop_end", "flushed"), ("warp", "enter", "flushed"))

# Marks only the routed kernel's routing chunks stamp (route_chunk's steps, RouteStep): a warp
# without them still counts, and their phases are taken over the warps that have them.
CHUNK_MARKS = ("walked", "scanned")

# The W=1 routed kernels' stamped builds (alone_fan_routed_kernel expert-major,
# alone_rows_routed_kernel rank-major; ``set_stamps(..., routed=True)``) write the same slots with
# these meanings (ROUTED_MARKS): enter, its ticket taken (checked), its routing chunk's pairs
# numbered (walked) and its counts scanned into the sums (scanned), its counts marked (counted,
# in loop_end's slot: its rounds end on their stores' completion, flushed; at once in a block
# that routes none), its chunk done (tables), the routing's end done (built; only the last
# ticket's block has one), the placed marks and the plan (planned), round 0's rows landed
# (routed) and stored (first_push), every round done (flushed). Rank-major there are no rounds:
# planned is the mover set up, routed / first_push the warp's first row before its copy is
# issued and after (at once for a warp that moves none), flushed its copies complete.
ROUTED_MARKS = tuple("counted" if m == "loop_end" else m for m in MARKS)
ROUTED_PHASES = (("ticket", "enter", "checked"), ("route chunk", "checked", "tables"),
                 ("chunk count", "checked", "counted"), ("count walk", "checked", "walked"),
                 ("count scan", "walked", "scanned"), ("count mark", "scanned", "counted"),
                 ("chunk place", "counted", "tables"),
                 ("routing end", "tables", "built"), ("marks + plan", "built", "planned"),
                 ("round 0 landed", "planned", "routed"), ("round 0 stores", "routed", "first_push"),
                 ("later rounds", "first_push", "flushed"), ("to first store", "enter", "routed"),
                 ("warp", "enter", "flushed"))


# The marks timeline_probe.py --routed reads block by block (rows_at): ticket taken, chunk counted,
# chunk routed, the routing's end, the plan, round 0 landed.
ROUTED_ROW_MARKS = ("checked", "walked", "scanned", "counted", "tables", "built", "planned", "routed")


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
    that missed a mark other than CHUNK_MARKS (one that never ran is all zero) is left out.
    Returns µs: per phase of ``spans`` the min / median / max over warps (a phase with a chunk
    mark: over the warps that stamped it; ``phases`` lists those present); ``start`` and ``end``
    (each warp's enter and flushed against the first warp's enter, globaltimer); ``at`` (each
    mark against the first warp's enter: where the warps are on the grid's clock); ``span``
    (first enter to last flushed); ``clock_ghz``; ``warps``."""
    m = len(marks)
    t = _blocks(stamps, warp_slots, marks).reshape(-1, m, 2)
    ix = {k: i for i, k in enumerate(marks)}
    core = [i for k, i in ix.items() if k not in CHUNK_MARKS]
    t = t[(t[:, core] != 0).all(dim=2).all(dim=1)]  # warps that stamped every mark but the chunk's own
    if t.shape[0] == 0:
        raise ValueError("stamps: no warp stamped every mark (was the timeline set before the call?)")
    ns, clk = t[:, :, 0].double(), t[:, :, 1].double()
    enter, flushed = ix["enter"], ix["flushed"]
    wall = ns[:, flushed] - ns[:, enter]
    cyc = clk[:, flushed] - clk[:, enter]
    ghz = statistics.median((cyc[wall > 0] / wall[wall > 0]).tolist()) if bool((wall > 0).any()) else float("nan")
    out: dict = {"warps": int(t.shape[0]), "clock_ghz": ghz}
    stamped = ns != 0  # [warps, marks]; only a routing chunk's warps have CHUNK_MARKS
    out["phases"] = []
    for name, a, b in spans:
        if a not in ix or b not in ix:
            continue
        has = stamped[:, ix[a]] & stamped[:, ix[b]]
        if not bool(has.any()):
            continue
        out["phases"].append(name)
        out[name] = _pct(((clk[has, ix[b]] - clk[has, ix[a]]) / ghz / 1e3).tolist())
    t0 = float(ns[:, enter].min())
    out["at"] = {k: _pct(((ns[stamped[:, i], i] - t0) / 1e3).tolist()) for k, i in ix.items()
                 if bool(stamped[:, i].any())}
    out["start"] = _pct(((ns[:, enter] - t0) / 1e3).tolist())
    out["end"] = _pct(((ns[:, flushed] - t0) / 1e3).tolist())
    out["span"] = float(ns[:, flushed].max() - t0) / 1e3
    return out


def rows_at(stamps: torch.Tensor, warp_slots: int, want: Sequence[str], marks: Sequence[str] = MARKS) -> dict:
    """Block by block: for each mark of ``want``, each block row's last warp to stamp it, in µs
    after the first warp's enter (None where no warp of the row stamped it). The routed kernel's
    rows are in ticket order: row b is chunk b's routing block, the last row the routing's end."""
    ns = _blocks(stamps, warp_slots, marks)[..., 0].double()
    entered = ns[:, :, marks.index("enter")]
    if not bool((entered != 0).any()):
        raise ValueError("stamps: no warp stamped its enter (was the timeline set before the call?)")
    t0 = float(entered[entered != 0].min())
    out = {}
    for k in want:
        col = ns[:, :, marks.index(k)]
        out[k] = [round((float(r[r != 0].max()) - t0) / 1e3, 3) if bool((r != 0).any()) else None for r in col]
    return out


def table(name: str, p: dict, at: bool = False) -> list[str]:
    """A few lines for one kernel's phases (µs: min / median / max over warps); ``at``: then
    each mark on the grid's clock."""
    lines = [f"{name}: {p['warps']} warps, span {p['span']:.1f} us, clock {p['clock_ghz']:.2f} GHz"]
    for k in ("start", *p["phases"], "end"):
        v = p[k]
        lines.append(f"  {k:<15} {v['min']:7.2f} {v['median']:7.2f} {v['max']:7.2f}")
    if at:
        lines.append("  at (µs after the first warp's enter):")
        lines += [f"    {k:<13} {v['min']:7.2f} {v['median']:7.2f} {v['max']:7.2f}" for k, v in p["at"].items()]
    return lines


def rows_table(rows: dict, every: int = 4) -> list[str]:
    """rows_at's marks as lines: every ``every``-th row and the last (µs after the first enter)."""
    n = len(next(iter(rows.values())))
    pick = sorted({*range(0, n, every), n - 1})
    cell = lambda v: f"{'-':>6}" if v is None else f"{v:6.2f}"  # noqa: E731
    lines = ["  by row (row b: the block that took ticket b), µs after the first warp's enter:",
             "    row         " + " ".join(f"{r:>6}" for r in pick)]
    lines += [f"    {k:<11} " + " ".join(cell(v[r]) for r in pick) for k, v in rows.items()]
    return lines
