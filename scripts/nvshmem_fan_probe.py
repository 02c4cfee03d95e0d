"""Why nvshmem's phased fan-out was slower than the same phases in torch push (session 28 C-D:
fan_kernel 203-215 µs built into the NVSHMEM module, relocatable device code; push's phases
143 µs of kernel). Since then it is built into symmoe_cuda like push (alone_fan_kernel,
csrc/kernels/alone.cuh): does it now run as fast, and does the process NVSHMEM runs in slow
anything? (Session 29, call A: 142.3 / 142.7 µs against dispatch_kernel's 159.2 and torch push's
145.4 / 145.0: the module was the cause.) One process, world size 1, the
bench's DeepSeek-V3 inputs, each cached expert-major dispatch timed as the bench times it (a
sleep kernel first, then events):

  1. torch push, before NVSHMEM starts in this process;
  2-4. nvshmem with kernel.fan_phases block (alone_fan_kernel), off (dispatch_kernel), block again;
  5. torch push again, with NVSHMEM running (its Buffer still open).

2 and 4 near 1: the module was the cause. 5 slower than 1: the process slows kernels.
    python scripts/nvshmem_fan_probe.py [--repeats 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import datetime, timezone

import torch

from symmoe.bench import _time, bench_config, probe_inputs
from symmoe.timing import sleep_cycles_for


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from symmoe.buffer import Buffer

    dev = torch.device("cuda", 0)
    sleep = sleep_cycles_for()
    x, idx, w, _, _ = probe_inputs(dev)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[tuple[str, float]] = []

    def cached_us(pr) -> float:
        _, handle = pr.dispatch(x, idx, w, "expert", 1)
        return statistics.median(_time(lambda: pr.dispatch_cached(x, handle), 5, a.repeats, sleep, lambda: None)) * 1e6

    def torch_push(label: str) -> None:
        with Buffer(None, bench_config("push", sms, backend="torch")) as buf:
            rows.append((label, cached_us(buf._protocol)))

    torch_push("1. torch push, before NVSHMEM")
    with Buffer(None, bench_config("push", sms, backend="nvshmem")) as nv:
        pr = nv._protocol
        for i, (mode, name) in enumerate(((1, "block (alone_fan_kernel)"), (0, "off (dispatch_kernel)"),
                                          (1, "block (alone_fan_kernel)"))):
            pr.fan_phases = mode
            rows.append((f"{i + 2}. nvshmem {name}", cached_us(pr)))
        torch_push("5. torch push, NVSHMEM running")
    lines = [f"{label:36s} {us:8.1f} us" for label, us in rows]
    print("cached expert-major dispatch, W=1, DeepSeek-V3 shape (median of the bench's timing)")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "commit": os.environ.get("SYMMOE_COMMIT", "unknown"), "device": torch.cuda.get_device_name(0),
                       "command": f"python scripts/nvshmem_fan_probe.py --repeats {a.repeats}",
                       "cached_expert_dispatch_us": dict(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
