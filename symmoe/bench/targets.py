"""The goal table of one multi-GPU run, from the JSON files that run wrote.

Two benchmark goals judge a multi-GPU run (``scripts/multigpu_check.sh`` prints the table
last): every backend moves its bytes at >= 0.80 of the NVLink all-to-all ceiling measured
in the same run, and the best backend of each op is >= 1.5x faster than the same op written
with ``torch.distributed.all_to_all_single`` (what a user without symmoe writes).

``python -m symmoe.bench.targets --bench bench.json --baselines baselines.json [--ab ab/results.json]
--md targets.md --json targets.json`` reads ``python -m symmoe.bench``, ``python -m
symmoe.bench.baselines`` and (optionally) ``symmoe ab`` output of the same run and writes a
Markdown table and a JSON with the same numbers; the Markdown also goes to stdout. Every
number comes from the inputs; only the two goals are constants here.

Definitions:

* NVLink all-to-all ceiling = NCCL ``all_to_all`` algbw measured in the same run
  (baselines ``results.all_to_all``: the slowest rank's equal-split all-to-all; bytes each rank
  sends, its own chunk included, per second). busbw and the slowest P2P copy are context.
* Bytes that must move per rank = rows x row_bytes, row_bytes = hidden x element size of the
  dtype. Rows: dispatch (both layouts): the rank's rank-major rows, one per (token,
  destination rank), its own included (expert-major duplicates are local writes); combine:
  rank-major rows for layout ``rank``, expert-major rows for layout ``expert`` (each
  (token, expert) output travels back: the fixed fp32 reduction order forbids pre-summing).
  Dispatch rows are counted where they arrive, combine rows where they leave. Rows are
  ``real_rows`` (padding rows, only with expert_alignment > 1, carry no data). The maximum
  over ranks counts: the slowest rank dominates.
* Time: bench's layout-level ``median_us``, which is already the slowest rank's median (max
  over ranks of the per-rank medians); the a2a baseline's is the same. ab's is the median
  over repeats of the per-repeat slowest rank (its "step time"), with L2 flushed before each
  call.
* ceiling time = bytes / algbw; ratio to ceiling = ceiling time / measured median; target
  ratio >= TARGET_RATIO.
* speedup vs a2a baseline = a2a (``all_to_all_single``) median of the same op / the row's
  median, rank-major rows only (the baseline is rank-major); the best backend of each op
  (bench rows) must reach TARGET_SPEEDUP.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from ..errors import SymmoeError
from .ops import BASE_OP, BASE_OPS, BUSY, LABEL, OPS, kernels_total, ops_of

TARGET_RATIO = 0.80  # goal: every backend at least 80 % of the NVLink all-to-all ceiling
TARGET_SPEEDUP = 1.5  # goal: the best backend at least 1.5x the all_to_all_single baseline
# Kernels that compute the routing and move no row: their names, past any namespace, start so.
ROUTING = ("route_", "plan_")
SCHEMA = "symmoe.targets/1"


def protocol_label(protocol: Any, x_in_buffer: Any) -> str:
    """A run with x built in Buffer.input_view is a variant of its protocol, shown apart."""
    return str(protocol) + (" (x in buffer)" if x_in_buffer else "")


def kernel_us(kernels: dict[str, float]) -> tuple[float, float]:
    """(all kernels, data kernels only: routing left out) device µs per call, from a bench
    rank's ``kernels_us[op]`` (all: ops.kernels_total; data: the sum of the others)."""
    total = kernels_total(kernels)
    data = sum(v for k, v in kernels.items() if k != BUSY and not k.rsplit("::", 1)[-1].startswith(ROUTING))
    return total, data


DEFINITIONS = [
    "NVLink all-to-all ceiling = NCCL all_to_all algbw measured in the same run (the slowest rank's "
    "equal-split all-to-all: bytes each rank sends, its own chunk included, per second); busbw and the "
    "slowest P2P copy are shown for context.",
    "Bytes per rank = rows x row_bytes (row_bytes = hidden x element size of the dtype). Dispatch, both "
    "layouts: the rank's rank-major rows (one per (token, destination rank), its own included; expert-major "
    "duplicates are local writes). Combine: rank-major rows for layout rank, expert-major rows for layout "
    "expert (every (token, expert) output travels back: the fixed fp32 reduction order forbids pre-summing). "
    "Rows = real_rows (padding carries no data). The maximum over ranks is used: the slowest rank dominates.",
    "µs: bench's layout-level median_us, which is already the slowest rank's median (max over ranks of the "
    "per-rank medians); the a2a baseline's likewise; ab's is the median over repeats of the per-repeat "
    "slowest rank (step time), L2 flushed before each call.",
    "GB/s per rank = bytes per rank / µs. Ratio to ceiling = (bytes / algbw) / µs; target met when "
    f">= {TARGET_RATIO:.2f}.",
    "Speedup vs a2a = all_to_all_single baseline median of the same op / the row's median, rank-major only "
    f"(the baseline is rank-major); the best bench backend per op must reach {TARGET_SPEEDUP:g}x.",
    "Cached dispatch = dispatch(x, handle=...) along the routing of the last dispatch (DeepEP's cached "
    "dispatch, e.g. the backward of combine): the same rows and bytes as dispatch, no routing kernels and no "
    "host wait; judged against the same ceiling and a2a dispatch baseline, in rows of its own.",
    "Data kernels: ratio = (bytes / algbw) / rank 0's device time per call of the call's kernels other than "
    "the routing ones (names starting with route_ or plan_): context, not the target. It includes a kernel's waits for "
    "its peers, and leaves out the routing and the gaps between kernels.",
]


class TargetsError(SymmoeError, ValueError):
    """An input file is missing, not JSON, or lacks a field the table needs; names the file."""


# --------------------------------------------------------------------------- reading

def load_json(path: str, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; a TargetsError naming ``what`` and the file otherwise."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise TargetsError(f"{what} file {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise TargetsError(f"{what} file {path}: not valid JSON ({e})") from None
    except OSError as e:
        raise TargetsError(f"{what} file {path}: cannot read ({e})") from None
    if not isinstance(doc, dict):
        raise TargetsError(f"{what} file {path}: expected a JSON object, got {type(doc).__name__}")
    return doc


class _Doc:
    """One input document; ``get("a.b.0.c")`` names the file and the field when it is missing."""

    def __init__(self, doc: dict[str, Any], what: str, path: str):
        self.doc, self.what, self.path = doc, what, path

    def get(self, dotted: str, base: Any = None, prefix: str = "") -> Any:
        cur = self.doc if base is None else base
        for part in dotted.split("."):
            try:
                cur = cur[int(part)] if isinstance(cur, list) else cur[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise TargetsError(f"{self.what} file {self.path}: missing field {prefix}{dotted} "
                                   f"(is it {self.what} output?)") from None
        return cur

    def num(self, dotted: str, base: Any = None, prefix: str = "") -> float:
        v = self.get(dotted, base, prefix)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TargetsError(f"{self.what} file {self.path}: field {prefix}{dotted} = {v!r} is not a number")
        return float(v)


def _element_size(dtype: str) -> int:
    import torch  # symmoe imports torch anyway; it knows every dtype's size

    t = getattr(torch, dtype, None)
    if not isinstance(t, torch.dtype):
        raise TargetsError(f"unknown dtype {dtype!r}")
    return t.itemsize


def _rows(d: _Doc, rank: dict[str, Any], layout: str, prefix: str) -> int:
    # Padding rows (expert_alignment > 1) carry no data; older files may lack real_rows.
    entry = d.get(layout, rank, prefix)
    return int(d.num("real_rows" if "real_rows" in entry else "rows", entry, f"{prefix}{layout}."))


# --------------------------------------------------------------------------- computing

def _row(source: str, backend: str, protocol: str, layout: str, op: str, median_us: float, nbytes: float | None,
         algbw_Bps: float, baseline_us: float | None, target: bool, data_us: float | None = None) -> dict[str, Any]:
    ratio = None if nbytes is None else (nbytes / algbw_Bps) / (median_us * 1e-6)
    ceiling_us = None if nbytes is None else nbytes / algbw_Bps * 1e6
    speedup = None if baseline_us is None else baseline_us / median_us
    return {"source": source, "backend": backend, "protocol": protocol, "layout": layout, "op": op,
            "median_us": median_us, "bytes_per_rank": nbytes,
            "GBps_per_rank": None if nbytes is None else nbytes / (median_us * 1e-6) / 1e9,
            "ceiling_us": ceiling_us,
            "ratio_to_ceiling": ratio,
            # context: the same bytes over rank 0's data kernels alone (what the call would reach
            # with the routing free and no gaps between kernels); bench rows only
            "data_kernels_us": data_us or None,
            "ratio_data_kernels": ceiling_us / data_us if (ceiling_us and data_us) else None,
            # a2a rows are the reference point, not something with a target
            "target_met": (ratio >= TARGET_RATIO) if (target and ratio is not None) else None,
            "speedup_vs_a2a": speedup}


def compute(bench: dict[str, Any], baselines: dict[str, Any], ab: dict[str, Any] | None = None,
            paths: dict[str, str] | None = None, command: str = "") -> dict[str, Any]:
    """The target table (JSON-able dict) from the parsed bench, baselines and ab documents."""
    paths = {"bench": "bench.json", "baselines": "baselines.json", "ab": "ab results.json", **(paths or {})}
    B, P = _Doc(bench, "bench", paths["bench"]), _Doc(baselines, "baselines", paths["baselines"])
    A = _Doc(ab, "ab", paths["ab"]) if ab is not None else None
    notes: list[str] = []

    # The ceiling and the baseline, from the same run.
    W = int(P.num("world_size"))
    bw = P.get("results.all_to_all")
    algbw = P.num("algbw_GBps", bw, "results.all_to_all.") * 1e9
    if algbw <= 0:
        raise TargetsError(f"baselines file {P.path}: results.all_to_all.algbw_GBps = {algbw / 1e9} is not positive")
    p2p = P.get("results.p2p_copy")
    ceiling = {"algbw_GBps": algbw / 1e9, "busbw_GBps": P.num("busbw_GBps", bw, "results.all_to_all."),
               "backend": bw.get("backend"), "nbytes_per_rank": bw.get("nbytes_per_rank"),
               "median_us": bw.get("median_us"),
               "p2p_min_GBps": (p2p or {}).get("min_GBps"), "p2p_median_GBps": (p2p or {}).get("median_GBps")}
    if ceiling["p2p_min_GBps"] is None:
        notes.append(f"baselines: no P2P copy pairs ({(p2p or {}).get('gpus', 0)} GPU(s) visible to rank 0)")
    a2a = {op: P.num(f"results.a2a.{op}.median_us") for op in BASE_OPS}
    a2a_ranks = P.get("results.a2a.ranks")
    a2a_row_bytes = {int(P.num(f"results.a2a.ranks.{i}.row_bytes")) for i in range(len(a2a_ranks))}
    a2a_rows = [int(P.num(f"results.a2a.ranks.{i}.recv_rows")) for i in range(len(a2a_ranks))]
    shape = P.get("shape")

    rows: list[dict[str, Any]] = []
    # The baseline itself: it receives recv_rows in dispatch and sends them back in combine.
    a2a_bytes = max(a2a_rows) * max(a2a_row_bytes) if a2a_rows else None
    if len(a2a_row_bytes) > 1:
        notes.append(f"baselines: ranks report different a2a row_bytes {sorted(a2a_row_bytes)}")
    for op in BASE_OPS:
        rows.append(_row("a2a baseline", "all_to_all_single", str(bw.get("backend", "?")), "rank", op, a2a[op],
                         a2a_bytes, algbw, a2a[op], target=False))

    # bench: every backend/protocol/layout/op at this world size.
    results = B.get("results")
    if not isinstance(results, list) or not results:
        raise TargetsError(f"bench file {B.path}: results is empty or not a list (is it bench output?)")
    bench_rows = []
    shape_checked = False
    for i, r in enumerate(results):
        pre = f"results.{i}."
        ws = int(B.num("world_size", r, pre))
        backend = str(B.get("backend", r, pre))
        protocol = protocol_label(B.get("protocol", r, pre), r.get("x_in_buffer"))
        name = f"{backend}/{protocol}"
        if ws != W:
            notes.append(f"bench {name} at world size {ws} left out: the baselines ran at world size {W}")
            continue
        dtype = str(B.get("dtype", r, pre))
        row_bytes = int(B.num("hidden", r, pre)) * _element_size(dtype)
        ranks = B.get("ranks", r, pre)
        if len(ranks) != ws:
            notes.append(f"bench {name}: {len(ranks)} per-rank entries for world size {ws}")
        layouts = B.get("layouts", r, pre)
        rows_of = {layout: [_rows(B, rk, layout, f"{pre}ranks.{j}.") for j, rk in enumerate(ranks)]
                   for layout in ("rank", "expert") if layout in layouts}
        rank_rows = rows_of["rank"] if "rank" in rows_of else [_rows(B, rk, "rank", f"{pre}ranks.{j}.")
                                                               for j, rk in enumerate(ranks)]
        for j, rk in enumerate(ranks):
            # bench's own byte count is (real rows + tokens) x its row size: check ours against it.
            got = rk.get("rank", {}).get("combine_bytes")
            if got is not None and got != (rank_rows[j] + int(rk.get("tokens", 0))) * row_bytes:
                notes.append(f"bench {name} rank {j}: combine_bytes {got} != (real_rows + tokens) x "
                             f"{row_bytes} (hidden x {dtype} size): bench's row size differs from ours")
            for layout in rows_of:
                e = rk[layout]
                if e.get("real_rows") is not None and e.get("rows") != e.get("real_rows"):
                    notes.append(f"bench {name} rank {j} {layout}: {e['rows']} rows of which {e['real_rows']} "
                                 "real (padding not counted)")
        for layout in rows_of:
            for op in ops_of(layouts[layout]):
                # Dispatch moves one row per (token, destination rank) in both layouts.
                nrows = max(rank_rows) if BASE_OP[op] == "dispatch" else max(rows_of[layout])
                t = B.num(f"{layout}.{op}.median_us", layouts, f"{pre}layouts.")
                slowest = max(B.num(f"{layout}.{op}.median_us", rk, f"{pre}ranks.{j}.") for j, rk in enumerate(ranks))
                if abs(slowest - t) > 1e-6 * max(t, 1.0):
                    notes.append(f"bench {name} {layout} {op}: layout median {t:.3f} µs is not the slowest "
                                 f"rank's median {slowest:.3f} µs")
                _, data = kernel_us(ranks[0].get(layout, {}).get("kernels_us", {}).get(op, {}))
                row = _row("bench", backend, protocol, layout, op, t, nrows * row_bytes, algbw,
                           a2a[BASE_OP[op]] if layout == "rank" else None, target=True, data_us=data)
                rows.append(row)
                bench_rows.append(row)
        # The speedup compares different draws of the routing when the shapes or routings differ.
        if shape and not shape_checked:
            shape_checked = True
            theirs = {"tokens": r.get("tokens_per_rank"), "hidden": r.get("hidden"), "topk": r.get("topk"),
                      "experts": r.get("num_experts"), "dtype": dtype}
            if "routing" in r:  # older bench files do not record their routing
                theirs.update(routing=r.get("routing"), seed=r.get("seed"))
            diff = [f"{k} {shape.get(k)} vs {v}" for k, v in theirs.items() if shape.get(k) != v]
            if diff:
                notes.append("baselines shape differs from bench (" + ", ".join(diff) + "): speedups compare "
                             "different workloads")
            if a2a_rows and a2a_row_bytes != {row_bytes}:
                notes.append(f"baselines a2a row_bytes {sorted(a2a_row_bytes)} != bench row_bytes {row_bytes}")
            if a2a_rows and a2a_rows != rank_rows:
                notes.append(f"the a2a baseline ({shape.get('routing')} routing, seed {shape.get('seed')}) and bench "
                             f"({r.get('routing', 'its own draws')}, seed {r.get('seed', '?')}) route different tokens: rank-major rows per rank {a2a_rows} (a2a) vs "
                             f"{rank_rows} (bench); the speedup is a ratio of medians, not normalised by rows")

    # ab: Buffer API, L2 flushed, step time = per-repeat slowest rank.
    ab_info = None
    if A is not None:
        ab_info = _ab_rows(A, W, algbw, a2a, shape or {}, rows, notes)

    inputs = {
        "bench": {"path": B.path, "commit": bench.get("commit"), "date": bench.get("date"),
                  "command": bench.get("command"), "device": bench.get("device"), "torch": bench.get("torch")},
        "baselines": {"path": P.path, "commit": baselines.get("commit"), "date": baselines.get("date"),
                      "command": baselines.get("command"), "device": baselines.get("device"),
                      "torch": baselines.get("torch"), "shape": shape},
    }
    if ab_info is not None:
        inputs["ab"] = ab_info
    commits = {k: v.get("commit") for k, v in inputs.items()}
    if len(set(commits.values())) > 1:
        notes.insert(0, "COMMITS DIFFER between the inputs: " + ", ".join(f"{k} {v}" for k, v in commits.items()))
    if inputs.get("ab", {}).get("git_dirty"):
        notes.insert(0, "ab ran from a working tree with uncommitted changes (git_dirty)")
    devices = {k: v.get("device") for k, v in inputs.items()}
    if len(set(devices.values())) > 1:
        notes.insert(0, "DEVICES DIFFER between the inputs: " + ", ".join(f"{k} {v}" for k, v in devices.items()))
    above = [r for r in rows if r["ratio_to_ceiling"] is not None and r["ratio_to_ceiling"] > 1]
    if above:
        notes.append(f"{len(above)} row(s) beat the 'ceiling' (ratio > 1): NCCL's all_to_all is a measured "
                     "reference, not a hard limit of the links")

    return {"schema": SCHEMA, "world_size": W, "device": bench.get("device"), "command": command,
            "inputs": inputs, "definitions": DEFINITIONS, "target_ratio": TARGET_RATIO,
            "target_speedup": TARGET_SPEEDUP, "ceiling": ceiling,
            "a2a_baseline_us": a2a, "rows": rows, "summary": _summary(rows, bench_rows),
            "notes": list(dict.fromkeys(notes))}  # one backend's note often repeats for the next


def _ab_rows(A: _Doc, W: int, algbw: float, a2a: dict[str, float], shape: dict[str, Any],
             rows: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    env = A.doc.get("environment") or {}
    info = {"path": A.path, "commit": env.get("git_commit"), "git_dirty": env.get("git_dirty"),
            "date": env.get("date"), "command": env.get("command"),
            "device": (env.get("gpus") or [None])[0], "torch": env.get("torch")}
    status = A.doc.get("status")
    if status != "ok":
        notes.append(f"ab status is {status!r}, not 'ok'")
    if A.doc.get("fallback"):
        notes.append(f"ab ran its fallback section (smaller shape): {A.doc['fallback']}")
    ws = int(A.num("world_size"))
    if ws != W:
        notes.append(f"ab left out: it ran at world size {ws}, the baselines at {W}")
        return info
    wl = A.get("spec.workload")
    layout = str(A.get("output_layout", wl, "spec.workload."))
    info["workload"] = A.doc["spec"].get("workload_text")
    ranks = A.get("ranks")
    # ab counts the rows a rank receives in dispatch (and sends back in combine), own rows included,
    # padding not: rank-major rows for layout rank, (token, expert) rows for layout expert.
    nbytes = max(int(A.num(f"ranks.{j}.bytes.rows")) * int(A.num(f"ranks.{j}.bytes.row_bytes"))
                 for j in range(len(ranks)))
    for j in range(len(ranks)):
        total = A.doc["ranks"][j]["bytes"].get("total_bytes")
        if total is not None and total != A.num(f"ranks.{j}.bytes.rows") * A.num(f"ranks.{j}.bytes.row_bytes"):
            notes.append(f"ab rank {j}: bytes.total_bytes {total} != rows x row_bytes")
    # Its speedups compare different workloads when ab's routing or shape is not the baseline's.
    theirs = {"tokens": wl.get("tokens_per_rank"), "hidden": wl.get("hidden"), "topk": wl.get("topk"),
              "experts": wl.get("num_experts"), "dtype": wl.get("dtype"),
              "routing": (wl.get("routing") or {}).get("kind")}
    diff = [f"{k} {v} vs {shape.get(k)}" for k, v in theirs.items() if shape and v != shape.get(k)]
    if diff:
        notes.append("ab workload differs from the a2a baseline's (" + ", ".join(diff) + "): ab moves other row counts, its speedups compare different workloads")
    timers = {str(rk.get("timer")) for rk in ranks}
    if timers != {"cuda-events"}:
        notes.append(f"ab timer {sorted(timers)}: not CUDA events, so no L2 flush before each call")
    for v in A.get("spec.variants"):
        name = str(v.get("name"))
        for op in ops_of(A.get(f"stats.{name}")):  # older ab files time no cached dispatch
            t = A.num(f"stats.{name}.{op}.step.median") * 1e6  # ab stores seconds
            # An expert-major ab run does not record the rank-major rows its dispatch moves.
            nb = nbytes if (layout == "rank" or op == "combine") else None
            protocol = protocol_label(v.get("protocol"), v.get("x_in_buffer"))
            rows.append(_row(f"ab {name}", str(v.get("backend")), protocol, layout, op, t, nb, algbw,
                             a2a[BASE_OP[op]] if layout == "rank" else None, target=True))
    if layout != "rank":
        notes.append("ab ran expert-major: its dispatch rows are not recorded, so no dispatch ratio for ab")
    return info


def _summary(rows: list[dict[str, Any]], bench_rows: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [r for r in rows if r["target_met"] is not None]
    best = {}
    for op in OPS:
        cands = [r for r in bench_rows if r["op"] == op and r["speedup_vs_a2a"] is not None]
        if cands:
            b = max(cands, key=lambda r: r["speedup_vs_a2a"])
            best[op] = {"backend": b["backend"], "protocol": b["protocol"], "median_us": b["median_us"],
                        "speedup_vs_a2a": b["speedup_vs_a2a"], "met": b["speedup_vs_a2a"] >= TARGET_SPEEDUP}
    return {"ratio_rows": len(judged), "ratio_met": sum(r["target_met"] for r in judged),
            "ratio_met_rows": [_label(r) for r in judged if r["target_met"]],
            "best_speedup": best}


def _label(r: dict[str, Any]) -> str:
    return f"{r['source']} {r['backend']}/{r['protocol']} {r['layout']} {LABEL[r['op']]}"


# --------------------------------------------------------------------------- writing

def _f(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    """The Markdown report: header, definitions, notes, the table, then which goals are met."""
    c, inp = res["ceiling"], res["inputs"]
    commits = {k: v.get("commit") for k, v in inp.items()}
    same = len(set(commits.values())) == 1
    lines = [f"# symmoe multi-GPU goals: world size {res['world_size']}, {res['device']}", ""]
    lines.append("- commit: " + (f"{next(iter(commits.values()))} (all inputs)" if same else
                                 "**inputs from different commits**: "
                                 + ", ".join(f"{k} {v}" for k, v in commits.items())))
    for k, v in inp.items():
        extra = f", {v['workload']}" if v.get("workload") else ""
        lines.append(f"- {k}: `{v['path']}`, {v.get('date')}, device {v.get('device')}, torch {v.get('torch')}, "
                     f"command `{v.get('command')}`{extra}")
    if res.get("command"):
        lines.append(f"- this table: `{res['command']}`")
    mib = c["nbytes_per_rank"] / 2**20 if c.get("nbytes_per_rank") else None
    lines.append(f"- ceiling: {c.get('backend')} all_to_all algbw **{c['algbw_GBps']:.1f} GB/s** "
                 f"({_f(mib, 'g')} MiB per rank, {_f(c.get('median_us'), '.1f')} µs, slowest rank); "
                 f"busbw {c['busbw_GBps']:.1f} GB/s; P2P copy min {_f(c.get('p2p_min_GBps'), '.1f')} GB/s "
                 f"(median {_f(c.get('p2p_median_GBps'), '.1f')})")
    a2a = res["a2a_baseline_us"]
    lines.append(f"- a2a baseline (all_to_all_single, rank-major): dispatch {a2a['dispatch']:.1f} µs, "
                 f"combine {a2a['combine']:.1f} µs (slowest rank's median)")
    lines += ["", "Definitions:", ""] + [f"- {d}" for d in res["definitions"]]
    if res["notes"]:
        lines += ["", "Notes on the inputs:", ""] + [f"- {n}" for n in res["notes"]]
    lines += ["", "| source | backend | protocol | layout | op | µs | MB/rank | GB/s per rank | ratio to ceiling | "
                  f"target met (>= {res['target_ratio']:.2f}) | speedup vs a2a | data kernels: ratio |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        met = "—" if r["target_met"] is None else ("yes" if r["target_met"] else "no")
        mb = None if r["bytes_per_rank"] is None else r["bytes_per_rank"] / 1e6
        sp = "—" if r["speedup_vs_a2a"] is None else f"{r['speedup_vs_a2a']:.2f}x"
        lines.append(f"| {r['source']} | {r['backend']} | {r['protocol']} | {r['layout']} | {LABEL[r['op']]} | "
                     f"{r['median_us']:.1f} | {_f(mb, '.1f')} | {_f(r['GBps_per_rank'], '.1f')} | "
                     f"{_f(r['ratio_to_ceiling'], '.3f')} | {met} | {sp} | "
                     f"{_f(r.get('ratio_data_kernels'), '.2f')} |")
    s = res["summary"]
    lines += ["", f"Targets: ratio to ceiling >= {res['target_ratio']:.2f} met by {s['ratio_met']} of "
                  f"{s['ratio_rows']} rows" + (f" ({'; '.join(s['ratio_met_rows'])})" if s["ratio_met_rows"] else "")
              + "."]
    for op, b in s["best_speedup"].items():
        lines.append(f"Best {LABEL[op]} vs a2a baseline: {b['backend']}/{b['protocol']} {b['speedup_vs_a2a']:.2f}x "
                     f"(target {res['target_speedup']:g}x: {'met' if b['met'] else 'NOT met'}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command line: the input files, then ``--md`` and ``--json``; the Markdown is written
    where asked and printed. Exit 2 with the message of a TargetsError."""
    prog = "python -m symmoe.bench.targets"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--bench", required=True, help="python -m symmoe.bench --json output")
    p.add_argument("--baselines", required=True, help="python -m symmoe.bench.baselines --json output")
    p.add_argument("--ab", default=None, help="symmoe ab results.json (optional)")
    p.add_argument("--md", default=None, help="write the Markdown here")
    p.add_argument("--json", default=None, help="write the JSON here")
    argv = list(argv) if argv is not None else sys.argv[1:]
    a = p.parse_args(argv)
    try:
        bench = load_json(a.bench, "bench")
        base = load_json(a.baselines, "baselines")
        ab = load_json(a.ab, "ab") if a.ab else None
        res = compute(bench, base, ab, {"bench": a.bench, "baselines": a.baselines, "ab": a.ab or ""},
                      command=" ".join([prog, shlex.join(argv)]))
    except TargetsError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    md = markdown(res)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
