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
and at worst size (num_worst_tokens, no wait), the four ways; the exact one also to an event
recorded right before its counts wait ("early", after every launch of the call): whether the exact
call's end event, recorded after the wait, costs it time the worst-size call does not pay.
Then the exact one's wait watched, in a pass of its own after the timed ones: whether the host's wait
ended while the GPU was still busy (counts seen early) or after it went idle, how many 1 ms spins
it took, and three events of the call: before the wait, right after it, the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from symmoe.bench import bench_config, kernel_breakdown, probe_inputs
from symmoe.config import PROTOCOLS, parse_key_value
from symmoe.ops import kernels_total
from symmoe.timing import sleep_cycles_for


def ways(fn, sleep_cycles: int, repeats: int = 20, marks: list | None = None) -> dict[str, float]:
    """``fn`` timed the four ways. ``marks``: where ``fn`` records events of its own (an exact
    dispatch's before its counts wait), "early" is the median start -> the last of them, in the
    "sleep" way. Each timed call's result is released after the end event, as the bench does."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {"sleep": [], "after": [], "stream": [], "early": []}
    for _ in range(repeats):
        for way in ("sleep", "after"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            if way == "after":
                fn()
            if marks is not None:
                marks.clear()
            a.record()
            done = fn()
            b.record()
            b.synchronize()
            del done
            out[way].append(a.elapsed_time(b) * 1e3)
            if way == "sleep" and marks:
                out["early"].append(a.elapsed_time(marks[-1]) * 1e3)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        a.record()
        for _ in range(20):
            fn()
        b.record()
        b.synchronize()
        out["stream"].append(a.elapsed_time(b) * 1e3 / 20)
    res = {k: statistics.median(v) for k, v in out.items() if v}
    res["kernel"] = kernels_total(kernel_breakdown(fn))  # the union: the per-kernel sum counted the union again
    return res


def exact_ways(pr, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
               sleep_cycles: int) -> dict[str, dict[str, float]]:
    """The W=1 rank dispatch that routes, exact and worst size, timed the four ways; the exact
    one also to an event recorded where it enters its counts wait ("early"; the worst-size
    call has no wait)."""
    marks: list[torch.cuda.Event] = []
    wait = pr._wait_counts

    def marked(*args):  # the protocol's own wait, behind an event recorded on the current stream
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append(e)
        return wait(*args)

    pr._wait_counts = marked  # this instance only: the probe's, dropped with its Buffer
    return {f"torch/push routed, {name} size": ways(lambda worst=worst: pr.dispatch(x, idx, w, "rank", 1, worst),
                                                   sleep_cycles, marks=marks)
            for name, worst in (("exact", 0), ("worst", x.shape[0]))}


def wait_seen(pr, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, sleep_cycles: int,
              repeats: int = 20) -> dict[str, float]:
    """The exact dispatch's wait watched, the bench's way (sleep, start, call, end): per call,
    whether the GPU was still busy when the wait returned (the early event not yet done), host
    µs from the wait's return to the GPU done, the wait's spins, and events from the start to
    before the wait / right after it / the end."""
    wait, counting = pr._wait_counts, pr._counts_wait
    spins = [0]

    class Spins:  # the protocol's CountsWait, each spin of up to max_s counted
        def wait(self, *args):
            spins[0] += 1
            return counting.wait(*args)

    seen: list[tuple] = []

    def watched(*args):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        spins[0] = 0
        got = wait(*args)
        t = time.perf_counter()
        busy = not e0.query()
        e1.record()
        seen.append((e0, e1, t, busy, spins[0]))
        return got

    pr._wait_counts, pr._counts_wait = watched, Spins()
    try:
        for _ in range(5):
            pr.dispatch(x, idx, w, "rank", 1)
        torch.cuda.synchronize()
        seen.clear()
        rec = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            a.record()
            done = pr.dispatch(x, idx, w, "rank", 1)
            b.record()
            e0, e1, t, busy, n = seen[-1]
            while not e0.query():
                pass
            gap = (time.perf_counter() - t) * 1e6
            b.synchronize()
            del done
            rec.append((busy, gap, n, a.elapsed_time(e0) * 1e3, a.elapsed_time(e1) * 1e3, a.elapsed_time(b) * 1e3))
    finally:
        pr._wait_counts, pr._counts_wait = wait, counting
    med = lambda i: statistics.median(r[i] for r in rec)  # noqa: E731
    return {"busy_at_wait_end": sum(r[0] for r in rec), "calls": len(rec), "wait_end_to_gpu_done_us": med(1),
            "spins": med(2), "before_wait": med(3), "after_wait": med(4), "end": med(5)}


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
    if a.exact:
        with Buffer(None, bench_config("push", sms)) as buf:
            rows.update(exact_ways(buf._protocol, x, idx, w, sleep))
            seen = wait_seen(buf._protocol, x, idx, w, sleep)
    print(f"{'':40}" + "".join(f"{k:>9}" for k in ("sleep", "after", "stream", "kernel")) + "   ratio to copy (sleep / after / stream)")
    c = rows["copy"]
    for name, r in rows.items():
        ratios = " / ".join(f"{c[k] / r[k]:.4f}" for k in ("sleep", "after", "stream"))
        print(f"{name:40}" + "".join(f"{r[k]:9.1f}" for k in ("sleep", "after", "stream", "kernel")) + f"   {ratios}")
    for name, r in rows.items():
        if "early" in r:
            print(f"{name}: start -> before its counts wait {r['early']:.1f} µs (sleep way: {r['sleep']:.1f})")
    if a.exact:
        print(f"exact size, its wait watched: ended with the GPU busy in {seen['busy_at_wait_end']} of "
              f"{seen['calls']} calls, {seen['wait_end_to_gpu_done_us']:.1f} host µs before the GPU was done, "
              f"{seen['spins']:.0f} spin(s); events from the start: before the wait {seen['before_wait']:.1f}, "
              f"after it {seen['after_wait']:.1f}, end {seen['end']:.1f} µs (medians)")
        rows["torch/push routed, exact size, wait watched"] = seen
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
