"""Timing dispatch and combine the same way everywhere: CUDA events on GPUs, the host
clock on the CPU, warm-up first, median and spread over many repeats."""
from __future__ import annotations

import cProfile
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import torch


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)

    def add(self, s: float) -> None:
        self.seconds.append(s)

    def quantile(self, q: float) -> float:
        xs = sorted(self.seconds)
        if not xs:
            return float("nan")
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    def summary(self) -> dict[str, float]:
        return {"median_s": self.median, "p10_s": self.quantile(0.1), "p90_s": self.quantile(0.9),
                "n": len(self.seconds)}


class Timer:
    """``with timer: work()`` records one sample; events are read back lazily on the GPU."""

    def __init__(self, device: torch.device, samples: Samples):
        self.device, self.samples = device, samples
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __enter__(self) -> "Timer":
        if self.device.type == "cuda":
            # The stream looked up here, not after the work: torch.cuda.current_stream() took the
            # GPU machine's host ~6 µs, which a host-bound call's end event would wait for.
            self._stream = torch.cuda.current_stream(self.device)
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(self._stream)
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record(self._stream)
            self._pending.append((self._start, end))
        else:
            self.samples.add(time.perf_counter() - self._t0)

    def flush(self) -> None:
        for a, b in self._pending:
            b.synchronize()
            self.samples.add(a.elapsed_time(b) * 1e-3)
        self._pending.clear()


Item = TypeVar("Item")


def balanced(items: Sequence[Item], turn: int) -> list[Item]:
    """``items`` in the order of round ``turn`` of an interleaved benchmark: a carry-over
    balanced design (Williams), so over every n rounds (2n for an odd n) each item runs right
    after each other item equally often, and item 0 opens round 0. A fixed order (or a
    rotation of it) gives every item the same predecessor every time; on the GPU machine (H100,
    ranks under MPS) the two implementations right after DeepEP V1's calls took 10-30 % longer
    at 128-1024 tokens per rank, whichever they were."""
    n = len(items)
    if n < 2:
        return list(items)
    period = n if n % 2 == 0 else 2 * n
    r = turn % period
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    row = [(k + r) % n for k in first]
    if r >= n:  # odd n: the second n rounds run the first n backwards
        row.reverse()
    return [items[k] for k in row]


def sleep_cycles_for(us: float = 1000.0) -> int:
    """Cycles of the ``torch.cuda._sleep`` kernel queued before a timed call (H200 clock): the
    host queues the call behind it, so its launch work is hidden from the events."""
    return int(us * 1e-6 * 1.98e9)


_L2_SCRATCH: dict[torch.device, torch.Tensor] = {}


def flush_l2(device: torch.device) -> None:
    """Evict the GPU's L2 (50 MB on H200) by writing a 256 MB scratch tensor."""
    if device.type != "cuda":
        return
    if device not in _L2_SCRATCH:
        _L2_SCRATCH[device] = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    _L2_SCRATCH[device].fill_(1)


def repeat(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int, flush: bool = True) -> Samples:
    samples = Samples()
    timer = Timer(device, samples)
    for _ in range(warmup):
        fn()
    for _ in range(repeats):
        if flush:
            flush_l2(device)
        with timer:
            fn()
    timer.flush()
    return samples


def profile_table(prof: "cProfile.Profile", calls: int, rows: int = 40) -> str:
    """cProfile's account of ``calls`` calls, per call: each Python function and each torch or
    binding call it saw, with its own and its cumulative µs (cProfile's own cost included: about
    a µs a call event), the most own time first, ``rows`` of them."""
    import pstats

    stats = pstats.Stats(prof).strip_dirs().stats  # {(file, line, name): (prim, n, own s, cum s, callers)}
    lines = [f"{'calls/call':>10} {'own us':>8} {'cum us':>8}  function"]
    for (file, line, name), (_, n, own, cum, _) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:rows]:
        where = f"{file}:{line}({name})" if line else name
        lines.append(f"{n / calls:10.1f} {own / calls * 1e6:8.2f} {cum / calls * 1e6:8.2f}  {where}")
    return "\n".join(lines) + "\n"
