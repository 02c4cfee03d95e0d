"""Where a W=1 cached dispatch's kernel time goes, warp by warp (symmoe/bench/timeline.py): the
launch skew, the prologue, the copy loop and the drain of the pull and push kernels, next to
the call's event time and a same-size copy's. The bench's shape (DeepSeek-V3, 4096 tokens).
    python scripts/timeline_probe.py --backends torch,nccl --protocols push,pull --json out.json
    --variant kernel.copy_depth=3,kernel.copy_bytes=7168   (every kernel again with these values)
nvshmem's dispatch kernel has no stamps: it is not probed. The stamped kernels are a build of
their own (kStamps, csrc/common/stamps.cuh): up to 16 warps per block let them keep their
stamps in registers (push 80, pull 96, no spills), where the kernels of a normal call have 64.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import datetime, timezone

import torch

from symmoe.backends import BACKENDS
from symmoe.bench import timeline
from symmoe.bench.gpu import _time, bench_config, probe_inputs
from symmoe.bench.timing import sleep_cycles_for
from symmoe.config import parse_key_value
from symmoe.launch_shape import gpu_sms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="torch")
    p.add_argument("--protocols", default="push,pull")
    p.add_argument("--layouts", default="rank")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--variant", action="append", default=[], help="k=v,k=v: every kernel again with these")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
    from symmoe.buffer import Buffer

    sleep = sleep_cycles_for()
    x, idx, w, src, dst = probe_inputs(torch.device("cuda", 0))
    copy_us = statistics.median(_time(lambda: dst.copy_(src), 5, a.repeats, sleep, lambda: None)) * 1e6
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("SYMMOE_COMMIT", "unknown"), "device": torch.cuda.get_device_name(0),
           "command": "python scripts/timeline_probe.py " + " ".join(
               f"--{k}" if v is True else f"--{k} {v}" for k, v in vars(a).items()
               if k not in ("json", "variant") and v is not False)
           + "".join(f" --variant {v}" for v in a.variant),
           "copy_us": copy_us, "kernels": {}}
    lines = [f"copy of the rank-major bytes (dst.copy_): {copy_us:.1f} us (event)"]
    sms = gpu_sms(torch.device("cuda", 0)).total
    cases = [(b, p, lay, v) for v in ["", *a.variant] for b in a.backends.split(",") for p in a.protocols.split(",")
             for lay in a.layouts.split(",") if p in BACKENDS[b].protocols and b != "nvshmem"]
    for backend, proto, layout, variant in cases:
        over = dict(parse_key_value(kv) for kv in variant.split(",")) if variant else {}
        with Buffer(None, bench_config(proto, sms, backend=backend, **over)) as buf:
            pr = buf._protocol
            mod, ctx = pr.mod, pr.ctx
            _, handle = pr.dispatch(x, idx, w, layout, 1)
            call = lambda: pr.dispatch_cached(x, handle)  # noqa: E731
            for _ in range(5):
                call()
            stamps = torch.zeros(pr.shape.dispatch * timeline.words(mod.STAMP_WARPS), dtype=torch.int64,
                                 device="cuda")
            ctx.set_stamps(stamps.data_ptr(), stamps.numel())
            runs, event = [], []
            try:
                for _ in range(a.repeats):
                    event.append(_time(call, 0, 1, sleep, stamps.zero_)[0] * 1e6)  # stamps cleared first
                    runs.append(timeline.phases(stamps, mod.STAMP_WARPS))
            finally:
                ctx.set_stamps(0)
            # the run whose span is the median one, whole (its numbers belong together)
            mid = sorted(runs, key=lambda r: r["span"])[len(runs) // 2]
            name = f"{backend}/{proto} {layout} cached dispatch" + (f" [{variant}]" if variant else "")
            ev = statistics.median(event)
            out["kernels"][name] = {"event_us": ev, "median_run": mid,
                                    "spans_us": [r["span"] for r in runs]}
            lines += [""] + timeline.table(name, mid)
            lines.append(f"  event {ev:.1f} us; ratio to the copy {copy_us / ev:.3f}")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
