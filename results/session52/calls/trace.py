"""Session 52 probe: each kernel of a W=1 torch push dispatch that routes (DeepSeek-V3 shape),
its start and end relative to the call's first kernel (profiler trace, median of 10 calls),
per layout, exact sizes and num_worst_tokens; and the host's counts wait measured from the
start event behind a sleep (the bench's way), where the host spins until the counts arrive.
Run from a tree: python trace.py OUT.json"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import torch

from symmoe.bench import bench_config, probe_inputs
from symmoe.buffer import Buffer
from symmoe.timing import sleep_cycles_for


def kernel_spans(fn, calls: int = 10) -> dict[str, dict[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    per: dict[str, list[tuple[float, float]]] = {}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        prof.export_chrome_trace(path)
        ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    ev.sort(key=lambda e: e["ts"])
    # calls: a gap of more than 50 µs between kernels starts a new call
    groups, cur = [], []
    for e in ev:
        if cur and e["ts"] - max(c["ts"] + c["dur"] for c in cur) > 50:
            groups.append(cur)
            cur = []
        cur.append(e)
    groups.append(cur)
    for g in groups:
        t0 = g[0]["ts"]
        for e in g:
            name = e["name"].split("<")[0].split("(")[0].replace("void ", "").replace("symmoe::", "")
            per.setdefault(name, []).append((e["ts"] - t0, e["ts"] + e["dur"] - t0))
    return {k: {"start": statistics.median(s for s, _ in v), "end": statistics.median(e for _, e in v), "n": len(v)}
            for k, v in per.items()}


def counts_wait(buf: Buffer, x, idx, w, layout: str, alignment: int, repeats: int = 20) -> dict[str, float]:
    """Start event behind a sleep, the call; the host's clock from the call's start to the end of
    its counts wait, and the call's event time."""
    proto = buf._protocol
    sleep = sleep_cycles_for(300.0)
    out = {"call_us": [], "wait_end_to_return_us": [], "event_us": []}
    for _ in range(repeats + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep)
        a.record()
        t0 = time.perf_counter()
        proto.dispatch(x, idx, w, layout, alignment)
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        out["call_us"].append((t1 - t0) * 1e6)
        out["wait_end_to_return_us"].append((t1 - proto.wait_marks[1]) * 1e6)
        out["event_us"].append(a.elapsed_time(b) * 1e3)
    return {k: statistics.median(v[3:]) for k, v in out.items()}


def main() -> None:
    torch.cuda.set_device(0)
    x, idx, w, _, _ = probe_inputs(torch.device("cuda"))
    res = {}
    cfg = bench_config("push")
    al = cfg.buffer.expert_alignment
    with Buffer(None, cfg) as buf:
        proto = buf._protocol
        for layout in ("rank", "expert"):
            res[layout] = {"exact": kernel_spans(lambda: proto.dispatch(x, idx, w, layout, al)),
                           "counts_wait": counts_wait(buf, x, idx, w, layout, al)}
            if layout == "rank":
                res[layout]["worst"] = kernel_spans(lambda: proto.dispatch(x, idx, w, layout, al, x.shape[0]))
    print(json.dumps(res, indent=1))
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
