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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="torch")
    p.add_argument("--protocols", default="push,pull")
    p.add_argument("--variant", action="append", default=[], help="k=v,k=v: torch push again with these")
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
    print(f"{'':40}" + "".join(f"{k:>9}" for k in ("sleep", "after", "stream", "kernel")) + "   ratio to copy (sleep / after / stream)")
    c = rows["copy"]
    for name, r in rows.items():
        ratios = " / ".join(f"{c[k] / r[k]:.3f}" for k in ("sleep", "after", "stream"))
        print(f"{name:40}" + "".join(f"{r[k]:9.1f}" for k in ("sleep", "after", "stream", "kernel")) + f"   {ratios}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
