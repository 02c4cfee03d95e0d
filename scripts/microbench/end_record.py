"""When the host records an event on a stream whose kernel is already running, how long after
that kernel does the event complete? The bench's sleep way records the end event while the
sleep kernel still runs; an exact-size dispatch records it after its counts wait, mid-kernel.

A same-size copy (the rank bench's 58.7 MB) timed from a start event, the end event recorded:
  queued   right after the copy's launch (during the sleep), as the bench times a copy;
  mid+D    D µs after the host saw the stream reach the copy (a pinned word set by a copy-engine
           write queued just before it), while the copy runs: as the exact dispatch's end.
Also an event recorded right after the launch in the mid rows ("before"), as timing_probe's
"early". Medians of 30, µs.   python scripts/microbench/end_record.py
"""
from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    dev = torch.device("cuda", 0)
    cycles = int(1000e-6 * 1.98e9)  # a 1 ms sleep, as symmoe.timing.sleep_cycles_for
    src = torch.empty(4096 * 7168 * 2, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    one = torch.ones(1, dtype=torch.int32, device=dev)
    zero = torch.zeros(1, dtype=torch.int32, pin_memory=True)

    def once(delay_us: float | None) -> tuple[float, float, bool | None]:
        flag.copy_(zero)
        a, e, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda._sleep(cycles)
        flag.copy_(one, non_blocking=True)  # the host sees this just before the copy starts
        a.record()
        dst.copy_(src)
        e.record()
        busy = None
        if delay_us is not None:
            while int(flag[0]) == 0:
                pass
            t = time.perf_counter() + delay_us * 1e-6
            while time.perf_counter() < t:
                pass
            busy = not e.query()
        b.record()
        b.synchronize()
        return a.elapsed_time(e) * 1e3, a.elapsed_time(b) * 1e3, busy

    for _ in range(5):
        once(None), once(0.0)
    print(f"{'end recorded':14}{'before':>9}{'end':>9}{'end - before':>14}  GPU busy at the end's record")
    for name, d in (("queued", None), ("mid+0", 0.0), ("mid+10", 10.0), ("mid+20", 20.0), ("queued", None)):
        r = [once(d) for _ in range(30)]
        e, b = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
        busy = "-" if d is None else f"{sum(x[2] for x in r)} of {len(r)}"
        print(f"{name:14}{e:9.1f}{b:9.1f}{b - e:14.1f}  {busy}")


if __name__ == "__main__":
    main()
