"""When the host records an event on a stream whose kernel is already running, how long after
that kernel does the event complete? The bench's sleep way records the end event while the
sleep kernel still runs; an exact-size dispatch records it after its counts wait, mid-kernel.

A same-size copy (the rank bench's 58.7 MB) timed from a start event, the end event recorded:
  queued   right after the copy's launch (during the sleep), as the bench times a copy;
  mid+D    D µs after the host saw the stream reach the copy (a pinned word set by a copy-engine
           write queued just before it), while the copy runs: as the exact dispatch's end.
Also an event recorded right after the copy's launch ("before"), as timing_probe's "early". The
mid rows ask the stream whether the copy still ran when the end was recorded (one event query),
except the "no query" rows; the "no before" rows record no such event (the end is the only one
after the copy). The "held" rows queue, after the copy, a stream wait on a pinned word
(cuStreamWaitValue32 through libcuda) that the host sets just before it records the end: does a
front end held on a semaphore pick the end up sooner than one that went idle? Medians of 30, µs.
    PYTHONPATH=. python scripts/microbench/end_record.py   (symmoe importable: its sleep_cycles_for)
"""
from __future__ import annotations

import ctypes
import statistics
import time

import torch

from symmoe.timing import sleep_cycles_for


def stream_wait_value():
    """libcuda's cuStreamWaitValue32 (GEQ), or None where it cannot be found."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
        f = getattr(cu, name, None)
        if f is not None:
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            f.restype = ctypes.c_int
            return f
    return None


def main() -> None:
    dev = torch.device("cuda", 0)
    cycles = sleep_cycles_for()  # the bench's sleep in front of a timed call
    src = torch.empty(4096 * 7168 * 2, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    one = torch.ones(1, dtype=torch.int32, device=dev)

    hold = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    hold_np, wait_value, ticket = hold.numpy(), stream_wait_value(), [0]

    def once(delay_us: float | None, query: bool = True, mark: bool = True,
             held: bool = False) -> tuple[float, float, bool | None]:
        flag.zero_()
        a, e, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda._sleep(cycles)
        flag.copy_(one, non_blocking=True)  # the host sees this just before the copy starts
        a.record()
        dst.copy_(src)
        if mark:
            e.record()
        if held:
            ticket[0] += 1
            rc = wait_value(torch.cuda.current_stream().cuda_stream, hold.data_ptr(), ticket[0], 0)
            assert rc == 0, f"cuStreamWaitValue32: CUresult {rc}"
        busy = None
        if delay_us is not None:
            while int(flag[0]) == 0:
                pass
            t = time.perf_counter() + delay_us * 1e-6
            while time.perf_counter() < t:
                pass
            busy = not e.query() if query and mark else None
        if held:
            hold_np[0] = ticket[0]
        b.record()
        b.synchronize()
        return a.elapsed_time(e) * 1e3 if mark else float("nan"), a.elapsed_time(b) * 1e3, busy

    for _ in range(5):
        once(None), once(0.0)
    print(f"{'end recorded':18}{'before':>9}{'end':>9}{'end - before':>14}  GPU busy at the end's record")
    rows = (("queued", None, True, True), ("queued, no before", None, True, False), ("mid+0", 0.0, True, True),
            ("mid+10", 10.0, True, True), ("mid+20", 20.0, True, True), ("mid+0, no query", 0.0, False, True),
            ("mid+10, no query", 10.0, False, True), ("mid+10, no before", 10.0, False, False),
            ("queued", None, True, True), ("queued, no before", None, True, False))
    if wait_value is not None:
        rows += (("held mid+10", 10.0, False, False, True), ("mid+10, no before", 10.0, False, False),
                 ("held mid+10", 10.0, False, False, True), ("mid+10, no before", 10.0, False, False),
                 ("held mid+20", 20.0, False, False, True), ("mid+20, no before", 20.0, False, False))
    else:
        print("cuStreamWaitValue32 not found: no held rows")
    for name, d, q, m, *h in rows:
        r = [once(d, q, m, *h) for _ in range(30)]
        e, b = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
        busy = "-" if d is None or not q or not m else f"{sum(x[2] for x in r)} of {len(r)}"
        print(f"{name:18}{e:9.1f}{b:9.1f}{b - e:14.1f}  {busy}")


if __name__ == "__main__":
    main()
