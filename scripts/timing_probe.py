"""Where a W=1 cached rank-major dispatch's time goes besides its kernel: the same call and a
same-size copy timed four ways (median µs, events unless said):
  sleep     the bench's way: sleep kernel, start event, the call, end event
  after     sleep, one untimed call, start event, the call, end event (the timed kernel follows
            one of its own: same shared-memory carveout, launch queued behind it)
  stream    20 calls back to back between two events, per call (host-bound wherever the
            host takes longer to enqueue a call than the GPU to run it: 45-125 us here)
  kernel    the profiler's kernel time (bench.kernel_breakdown)
python scripts/timing_probe.py --backends torch,nvshmem --protocols push,pull \
    --variant kernel.copy_bytes=7168,kernel.copy_depth=4   (torch push again with these values)
--exact: also the W=1 rank dispatch that routes, at exact size (the host waits for its counts)
and at worst size (num_worst_tokens, no wait), the bench's way; the exact one also with a second
end event recorded right before its counts wait ("early", after every launch of the call): whether the
exact call's end event, recorded after the wait, costs it time the worst-size call does not pay.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from symmoe.bench import bench_config, kernel_breakdown, probe_inputs
from symmoe.config import PROTOCOLS, parse_key_value
from symmoe.timing import sleep_cycles_for


def ways(fn, sleep_cycles: int, repeats: int = 20) -> dict[str, float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {"sleep": [], "after": [], "stream": []}
    for _ in range(repeats):
        for way in ("sleep", "after"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            if way == "after":
                fn()
            a.record()
            fn()
            b.record()
            b.synchronize()
            out[way].append(a.elapsed_time(b) * 1e3)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        a.record()
        for _ in range(20):
            fn()
        b.record()
        b.synchronize()
        out["stream"].append(a.elapsed_time(b) * 1e3 / 20)
    res = {k: statistics.median(v) for k, v in out.items()}
    res["kernel"] = sum(kernel_breakdown(fn).values())
    return res


def exact_ways(pr, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, sleep_cycles: int,
               repeats: int = 20) -> dict[str, dict[str, float]]:
    """The W=1 rank dispatch that routes, exact and worst size: median µs start -> end (the
    bench's), start -> early (an event recorded where the call enters its counts wait; the
    worst-size call has none) and the profiler's kernel time."""
    marks: list[torch.cuda.Event] = []
    wait = pr._wait_counts

    def marked(*args):  # the protocol's own wait, behind an event recorded on the current stream
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append(e)
        return wait(*args)

    pr._wait_counts = marked  # this instance only: the probe's, dropped with its Buffer
    out: dict[str, dict[str, float]] = {}
    for name, worst in (("exact", 0), ("worst", x.shape[0])):
        fn = lambda: pr.dispatch(x, idx, w, "rank", 1, worst)  # noqa: E731
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        full, early = [], []
        for _ in range(repeats):
            marks.clear()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            a.record()
            done = fn()
            b.record()
            b.synchronize()
            del done  # after the end event, as the bench releases it
            full.append(a.elapsed_time(b) * 1e3)
            if marks:
                early.append(a.elapsed_time(marks[-1]) * 1e3)
        out[name] = {"sleep": statistics.median(full), "kernel": sum(kernel_breakdown(fn).values())}
        if early:
            out[name]["early"] = statistics.median(early)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="torch")
    p.add_argument("--protocols", default="push,pull")
    p.add_argument("--variant", action="append", default=[], help="k=v,k=v: torch push again with these")
    p.add_argument("--exact", action="store_true", help="also the W=1 rank dispatch that routes, exact and worst size")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
    from symmoe.buffer import Buffer

    sleep = sleep_cycles_for()
    x, idx, w, src, dst = probe_inputs(torch.device("cuda", 0))
    rows = {"copy": ways(lambda: dst.copy_(src), sleep)}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for backend in a.backends.split(","):
        for proto in a.protocols.split(","):
            if proto not in PROTOCOLS[backend]:
                continue
            with Buffer(None, bench_config(proto, sms, backend=backend)) as buf:
                pr = buf._protocol
                _, handle = pr.dispatch(x, idx, w, "rank", 1)
                rows[f"{backend}/{proto}"] = ways(lambda: pr.dispatch_cached(x, handle), sleep)
    for v in a.variant:
        over = dict(parse_key_value(kv) for kv in v.split(","))
        with Buffer(None, bench_config("push", sms, **over)) as buf:
            pr = buf._protocol
            _, handle = pr.dispatch(x, idx, w, "rank", 1)
            rows[f"push {v.replace('kernel.', '')}"] = ways(lambda: pr.dispatch_cached(x, handle), sleep)
    exact = {}
    if a.exact:
        with Buffer(None, bench_config("push", sms)) as buf:
            exact = exact_ways(buf._protocol, x, idx, w, sleep)
    print(f"{'':40}" + "".join(f"{k:>9}" for k in ("sleep", "after", "stream", "kernel")) + "   ratio to copy (sleep / after / stream)")
    c = rows["copy"]
    for name, r in rows.items():
        ratios = " / ".join(f"{c[k] / r[k]:.3f}" for k in ("sleep", "after", "stream"))
        print(f"{name:40}" + "".join(f"{r[k]:9.1f}" for k in ("sleep", "after", "stream", "kernel")) + f"   {ratios}")
    for name, r in exact.items():
        early = f"{r['early']:.1f}" if "early" in r else "-"
        print(f"torch/push routed, {name} size: sleep {r['sleep']:.1f}  early {early}  kernel {r['kernel']:.1f}"
              f"   ratio to copy (sleep) {c['sleep'] / r['sleep']:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**rows, **{f"routed_{k}": v for k, v in exact.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
