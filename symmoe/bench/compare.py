"""Bench JSONs of one shape side by side: a change against its baseline, run in the same call.

``python -m symmoe.bench.compare BASE.json OTHER.json [...]`` prints one line per (backend,
protocol, world size, x placement, layout, op) found in the first file: each run's median µs,
its ratio to the first run's and, where the bench measured them, its ratio to a same-size copy
and its speed-up over plain torch; then the kernels' device µs per call of rank 0 (the
profiler's, without host gaps); then, where the JSON has it, the host's work after the exact
dispatch's one counts wait (``dispatch_host_phases_timed``, rank 0): a call whose host work
outlasts its kernel is host-bound, whatever its kernel did; then the host's µs inside each call
with the GPU idle before it (``<op>_host``, rank 0). Runs are named by their JSON's commit, or
by ``--labels``.
Several runs of one tree (A/B/A/B) read as the spread that a difference has to exceed.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .ops import LABEL, kernels_total, ops_of

Key = tuple[str, str, int, bool, str, str]
NAME_COLUMNS = 5  # backend, protocol, W, layout, op: left-aligned; the runs' columns right-aligned


def _key(r: dict[str, Any], layout: str, op: str) -> Key:
    return (r["backend"], r["protocol"], int(r["world_size"]), bool(r.get("x_in_buffer")), layout, op)


def _name(key: Key) -> list[str]:
    """A line's name columns (x in the buffer marks the protocol with *)."""
    backend, proto, ws, xbuf, layout, op = key
    return [backend, proto + ("*" if xbuf else ""), str(ws), layout, LABEL[op]]


def rows_of(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """Every op of a bench JSON (``python -m symmoe.bench --json``), keyed for matching."""
    out: dict[Key, dict[str, Any]] = {}
    for r in doc.get("results", []):
        for layout, row in r["layouts"].items():
            kernels = r["ranks"][0][layout].get("kernels_us", {})
            for op in ops_of(row):
                out[_key(r, layout, op)] = {**row[op], "kernels_us": kernels_total(kernels.get(op, {}))}
    return out


def after_wait_of(doc: dict[str, Any]) -> dict[Key, float]:
    """Rank 0's median µs of host work after the exact dispatch's counts wait, per layout."""
    out: dict[Key, float] = {}
    for r in doc.get("results", []):
        for layout in r["layouts"]:
            phases = r["ranks"][0][layout].get("dispatch_host_phases_timed")
            if phases and "after_wait" in phases:
                out[_key(r, layout, "dispatch")] = phases["after_wait"]["median_us"]
    return out


def host_of(doc: dict[str, Any]) -> dict[Key, float]:
    """Rank 0's median host µs inside each call, the GPU idle before it (``<op>_host``): what a
    call costs the host where no queued GPU work hides it."""
    out: dict[Key, float] = {}
    for r in doc.get("results", []):
        for layout, row in r["layouts"].items():
            mine = r["ranks"][0][layout]
            for op in ops_of(row):
                if f"{op}_host" in mine:
                    out[_key(r, layout, op)] = mine[f"{op}_host"]["median_us"]
    return out


def compare(docs: list[dict[str, Any]], labels: list[str]) -> str:
    """The side-by-side tables of ``docs`` (the first is the baseline)."""
    if len(docs) < 2:
        raise ValueError(f"{len(docs)} JSON file(s) given; a comparison needs at least 2")
    if len(labels) != len(docs):
        raise ValueError(f"{len(labels)} label(s) for {len(docs)} files; give one per file")
    runs = [rows_of(d) for d in docs]
    if not runs[0]:
        raise ValueError("the first file has no results (expected the JSON of python -m symmoe.bench --json)")
    times, kernels = [], []
    for key, base in runs[0].items():
        t, k = _name(key), _name(key)
        for run in runs:
            o = run.get(key)
            if o is None:
                t.append("-")
                k.append("-")
                continue
            cell = f"{o['median_us']:.1f}"
            if o is not base:
                cell += f" ({o['median_us'] / base['median_us']:.3f})"
            if "ratio_same_size_copy" in o:  # four places: 0.84989 must not read as a 0.85 target met
                cell += f" {o['ratio_same_size_copy']:.4f}"
            if "speedup_vs_torch" in o:
                cell += f" {o['speedup_vs_torch']:.2f}x"
            t.append(cell)
            k.append(f"{o['kernels_us']:.1f}")
        times.append(t)
        kernels.append(k)
    head = ["backend", "proto", "W", "layout", "op", *labels]
    lines = ["median µs (ratio to the first run), ratio to a same-size copy, speed-up over plain torch",
             *_aligned([head, *times]), "", "kernels, device µs per call (rank 0)", *_aligned([head, *kernels])]
    for title, of in (("host after the counts wait, median µs (rank 0, timed dispatches)", after_wait_of),
                      ("host inside the call, median µs (rank 0, the GPU idle before it)", host_of)):
        found = [of(d) for d in docs]
        host = [[*_name(key), *(f"{f[key]:.1f}" if key in f else "-" for f in found)]
                for key in runs[0] if any(key in f for f in found)]
        if host:
            lines += ["", title, *_aligned([head, *host])]
    return "\n".join(lines)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]

    def line(r: list[str]) -> str:
        return "  ".join(cell.ljust(w) if c < NAME_COLUMNS else cell.rjust(w)
                         for c, (cell, w) in enumerate(zip(r, widths)))
    return [line(r) for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m symmoe.bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="bench JSONs; the first is the baseline")
    p.add_argument("--labels", default=None, help="comma-separated names of the runs (default: each JSON's commit)")
    a = p.parse_args(argv)
    try:
        docs = []
        for path in a.files:
            with open(path) as f:
                docs.append(json.load(f))
            if not docs[-1].get("results"):
                raise ValueError(f"{path}: no results (expected the JSON of python -m symmoe.bench --json)")
        labels = a.labels.split(",") if a.labels else [str(d.get("commit", "?"))[:12] for d in docs]
        print(compare(docs, labels))
    except (OSError, json.JSONDecodeError, ValueError, KeyError) as e:
        print(f"python -m symmoe.bench.compare: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
