"""The one-GPU target table of the backend issues (torch, nvshmem, nccl), from one
``python -m symmoe.bench --json`` file.

``python -m symmoe.targets_one_gpu --bench bench.json --md targets.md --json targets.json``
writes a Markdown table and a JSON with the same numbers; the Markdown also goes to stdout.
Every number comes from the bench file; only the targets are constants here.

Targets at world size 1, DeepSeek-V3 shape (the issues' text):

* torch: rank-major dispatch and combine >= 85 % of the copy roofline; expert-major dispatch
  >= 2x the plain-torch version measured in the same run;
* nvshmem, nccl: dispatch and combine >= 85 % of the copy roofline (both layouts here).

A cached dispatch (``dispatch(x, handle=...)``, bench files since session 7) gets the
dispatch target in rows of its own: it is the dispatch DeepEP's intranode benchmark times. Its
plain-torch speed-up is the bench's: against ``index_select`` along a routing computed once in
files since session 33 (a2fe45f), against plain torch's whole dispatch (argsort included) before.

Definitions: ratio to roofline = (bytes that must move / copy roofline of the same run) /
whole-call median (``python -m symmoe.bench``'s own ``ratio_roofline``). The roofline is the
asymptote of a 1 GiB copy; a copy of exactly the op's bytes (``ratio_same_size_copy``, bench
files since session 8) pays the launch, ramp-up and tail an op of that size pays, and is the
second reading of the issues' "copy roofline for the bytes that must move": each ratio target
is judged against both, in two columns and two counts. For context the
table also sets the same bytes against the device time of the call's kernels, all of them
and the data kernels alone (routing kernels -- names starting with ``route_`` or ``plan_`` -- left out):
what the call would reach if the host added nothing, and if the routing came for free
(world size 1 only: the kernel times are rank 0's).
Several ranks on one GPU: aggregate bytes per second over the roofline, and the ratio to the
torch backend's push protocol at the same world size in the same file.
"""
from __future__ import annotations

from typing import Any

from .ops import BASE_OP, BASE_OPS, LABEL, ops_of
from .targets import TargetsError, _Doc, cli, kernel_us, load_json, protocol_label

TARGET_RATIO = 0.85
TARGET_SPEEDUP = 2.0  # expert-major dispatch of the torch backend vs plain torch

# (backend, layout, op; a cached dispatch as dispatch) -> ("ratio", 0.85) or ("speedup", 2.0); absent: no target.
TARGETS: dict[tuple[str, str, str], tuple[str, float]] = {
    ("torch", "rank", "dispatch"): ("ratio", TARGET_RATIO),
    ("torch", "rank", "combine"): ("ratio", TARGET_RATIO),
    ("torch", "expert", "dispatch"): ("speedup", TARGET_SPEEDUP),
    **{(b, lay, op): ("ratio", TARGET_RATIO)
       for b in ("nvshmem", "nccl") for lay in ("rank", "expert") for op in BASE_OPS},
}


def compute(bench: dict[str, Any], path: str = "bench.json", command: str = "") -> dict[str, Any]:
    """The table (JSON-able dict) from a parsed bench document."""
    d = _Doc(bench, "bench", path)
    results = d.get("results")
    if not isinstance(results, list) or not results:
        raise TargetsError(f"bench file {path}: 'results' holds no runs")
    torch_push = {}  # world size -> layout -> op -> median µs, for the ratio of W > 1 rows
    for i, r in enumerate(results):
        if (d.get("backend", r, f"results.{i}.") == "torch" and d.get("protocol", r, f"results.{i}.") == "push"
                and not r.get("x_in_buffer")):
            torch_push[int(d.num("world_size", r, f"results.{i}."))] = d.get("layouts", r, f"results.{i}.")
    rows = []
    for i, r in enumerate(results):
        pre = f"results.{i}."
        backend, protocol = d.get("backend", r, pre), protocol_label(d.get("protocol", r, pre), r.get("x_in_buffer"))
        W = int(d.num("world_size", r, pre))
        roof = d.num("copy_roofline_TBps", r, pre) * 1e12
        rank0 = d.get("ranks.0", r, pre)
        for layout, lrow in d.get("layouts", r, pre).items():
            for op in ops_of(lrow):
                o = d.get(op, lrow, f"{pre}layouts.{layout}.")
                us = d.num("median_us", o, f"{pre}layouts.{layout}.{op}.")
                nbytes = d.num("bytes", o, f"{pre}layouts.{layout}.{op}.")
                # Kernel times are rank 0's: set against one rank's bytes only at world size 1.
                kern, data = kernel_us(rank0.get(layout, {}).get("kernels_us", {}).get(op, {})) if W == 1 else (0, 0)
                ideal = nbytes / roof * 1e6  # µs at the roofline
                kind, goal = TARGETS.get((backend, layout, BASE_OP[op]), (None, None)) if W == 1 else (None, None)
                ratio = ideal / us
                speedup = o.get("speedup_vs_torch")
                value = ratio if kind == "ratio" else speedup if kind == "speedup" else None
                tp = torch_push.get(W, {}).get(layout, {}).get(op, {}).get("median_us")
                same = o.get("ratio_same_size_copy")
                rows.append({
                    "backend": backend, "protocol": protocol, "world_size": W, "layout": layout, "op": op,
                    "median_us": us, "bytes": nbytes, "TBps": nbytes / (us * 1e-6) / 1e12, "ratio_roofline": ratio,
                    "ratio_same_size_copy": same,
                    "kernels_us": kern or None, "ratio_kernels": ideal / kern if kern else None,
                    "data_kernels_us": data or None, "ratio_data_kernels": ideal / data if data else None,
                    "speedup_vs_plain_torch": speedup,
                    "vs_torch_push": (tp / us) if (W > 1 and tp and (backend, protocol) != ("torch", "push")) else None,
                    "mps_thread_percentage": r.get("mps_thread_percentage"),
                    "gpus": int(r.get("gpus", 1)),  # files before session 6: one GPU
                    "target": None if kind is None else {
                        "kind": kind, "goal": goal, "value": value, "met": value is not None and value >= goal,
                        # ratio targets, read against a copy of the same bytes (None: not measured)
                        "met_same_size_copy": (same >= goal) if kind == "ratio" and same is not None else None},
                })
    return {"schema": "symmoe.targets_one_gpu/1", "command": command,
            "input": {"path": path, "commit": bench.get("commit"), "date": bench.get("date"),
                      "device": bench.get("device"), "command": bench.get("command")},
            "target_ratio": TARGET_RATIO, "target_speedup": TARGET_SPEEDUP, "rows": rows}


def _f(x: float | None, fmt: str, suffix: str = "") -> str:
    return "—" if x is None else format(x, fmt) + suffix


def markdown(res: dict[str, Any]) -> str:
    inp = res["input"]
    lines = [f"# symmoe one-GPU targets: {inp['device']}, commit {inp['commit']}", "",
             f"- bench: `{inp['path']}`, {inp['date']}, command `{inp['command']}`"]
    if res.get("command"):
        lines.append(f"- this table: `{res['command']}`")
    lines += [f"- targets at world size 1: whole call >= {res['target_ratio']:.2f} of the copy roofline "
              f"(torch: rank-major; nvshmem, nccl: both layouts), torch expert-major dispatch >= "
              f"{res['target_speedup']:g}x plain torch",
              "- x plain torch: against argsort + index_select for the dispatches that route, against index_select "
              "along the routing computed once for a cached dispatch (bench files since session 33)",
              "- kernels / data kernels: the same bytes against the device time of all the call's kernels, and of "
              "the kernels that move rows (routing left out): context, not the target",
              "",
              "- ratio to a same-size copy: a copy of exactly the op's bytes, timed the same way, over the op's time",
              "",
              "| backend | proto | W | layout | op | µs | TB/s | ratio to roofline | ratio to a same-size copy | "
              "kernels: ratio | data kernels: ratio | x plain torch | x torch push (same W) | target |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        t = r["target"]
        if t is None:
            verdict = "—"
        else:
            shown = f"{t['value']:.2f}" + ("x" if t["kind"] == "speedup" else "")
            goal = f"{t['goal']:g}x" if t["kind"] == "speedup" else f"{t['goal']:.2f}"
            verdict = f"{'met' if t['met'] else 'not met'} ({shown} vs {goal})"
            if t.get("met_same_size_copy") is not None:
                verdict += f"; vs same-size copy: {'met' if t['met_same_size_copy'] else 'not met'}"
        W = (f"{r['world_size']}" + (f" on {r['gpus']} GPUs" if r.get("gpus", 1) > 1 else "")
             + (f" ({r['mps_thread_percentage']} % MPS)" if r.get("mps_thread_percentage") else ""))
        lines.append(f"| {r['backend']} | {r['protocol']} | {W} | {r['layout']} | {LABEL[r['op']]} | {r['median_us']:.1f} | "
                     f"{r['TBps']:.2f} | {r['ratio_roofline']:.2f} | {_f(r.get('ratio_same_size_copy'), '.2f')} | "
                     f"{_f(r['ratio_kernels'], '.2f')} | "
                     f"{_f(r['ratio_data_kernels'], '.2f')} | {_f(r['speedup_vs_plain_torch'], '.2f', 'x')} | "
                     f"{_f(r['vs_torch_push'], '.2f', 'x')} | {verdict} |")
    with_target = [r for r in res["rows"] if r["target"]]
    met = [r for r in with_target if r["target"]["met"]]
    names = "; ".join(f"{r['backend']}/{r['protocol']} {r['layout']} {LABEL[r['op']]}" for r in met)
    lines += ["", f"Targets met: {len(met)} of {len(with_target)} rows" + (f" ({names})" if met else "") + "."]
    judged = [r for r in with_target if r["target"].get("met_same_size_copy") is not None]
    if judged:
        met2 = [r for r in judged if r["target"]["met_same_size_copy"]]
        names2 = "; ".join(f"{r['backend']}/{r['protocol']} {r['layout']} {LABEL[r['op']]}" for r in met2)
        lines.append(f"Ratio targets read against a same-size copy: {len(met2)} of {len(judged)} rows met"
                     + (f" ({names2})" if met2 else "") + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    def build(a, command: str) -> tuple[str, dict[str, Any]]:
        res = compute(load_json(a.bench, "bench"), a.bench, command=command)
        return markdown(res), res

    return cli("python -m symmoe.targets_one_gpu", __doc__.split("\n")[0],
               [("--bench", True, "python -m symmoe.bench --json output")], build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
