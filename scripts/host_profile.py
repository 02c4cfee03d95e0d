#!/usr/bin/env python3
"""Where the host time of each protocol call goes, at world size 1 on the DeepSeek-V3 shape.

The bench's host table (``host_ops_us``) puts all Python, extension calls and waits into one
bucket; this prints cProfile's functions by own time per call instead. Each call runs with
the GPU idle (a synchronize after it, outside the profile), as in the bench's host pass.

  python3 scripts/host_profile.py --backends torch,nccl --protocols push,pull --calls 40 --top 12
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from symmoe.bench import _inputs, bench_config
from symmoe.buffer import Buffer
from symmoe.timing import sleep_cycles_for


def profile_op(fn, calls: int, top: int) -> str:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    wall = 0.0
    for _ in range(calls):
        t0 = time.perf_counter()
        prof.enable()
        fn()
        prof.disable()
        wall += time.perf_counter() - t0
        torch.cuda.synchronize()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    lines = [f"    wall {wall / calls * 1e6:8.1f} µs per call (profiled)"]
    for (file, line, name), (_cc, nc, tt, ct, _callers) in rows:
        where = name if file == "~" else f"{file.rsplit('/', 2)[-2]}/{file.rsplit('/', 1)[-1]}:{line} {name}"
        lines.append(f"    {tt / calls * 1e6:8.1f} own  {ct / calls * 1e6:8.1f} cum  {nc / calls:5.1f}x  {where[:90]}")
    return "\n".join(lines)


def launch_costs(proto, idx: torch.Tensor, calls: int = 200) -> str:
    """Unprofiled host µs per call (median) of the extension's bindings against torch's own
    launch, with the GPU kept busy by a sleep kernel (launches queue; nothing waits): is a
    binding that launches a kernel slow, or the Python around it?"""

    dev = idx.device
    W, E, T = proto.layout.world_size, proto.layout.num_experts, idx.shape[0]
    per_rank = torch.empty(W, dtype=torch.int32, device=dev)
    per_expert = torch.empty(E, dtype=torch.int32, device=dev)
    in_rank = torch.empty((T, W), dtype=torch.bool, device=dev)
    stream = torch.cuda.current_stream().cuda_stream
    scratch = proto._route_scratch.data_ptr()
    calls_ = {
        "pybind call, no CUDA (ctx.layout_scratch_bytes)": lambda: proto.ctx.layout_scratch_bytes(),
        "torch.cuda._sleep(1) launch": lambda: torch.cuda._sleep(1),
        f"torch.empty(({T}, 7168), bf16)": lambda: torch.empty((T, 7168), dtype=torch.bfloat16, device=dev),
        "ctx.layout, one routing launch (ints given)": lambda: proto.ctx.layout(
            idx.data_ptr(), True, 0, T, scratch, in_rank.data_ptr(), per_rank.data_ptr(), per_expert.data_ptr(),
            False, 0, stream),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "get_dispatch_layout (whole call)": lambda: proto.get_dispatch_layout(idx),
    }
    lines = []
    for name, fn in calls_.items():
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000 * calls)  # about 0.5 ms of GPU per call queued ahead: no launch waits for it
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        lines.append(f"    {statistics.median(times) * 1e6:8.1f} µs  {name}")
    return "\n".join(lines)


def _median_p90(v: list[float]) -> str:
    """Seconds as "median / p90 µs"."""
    v = sorted(v)
    return f"{statistics.median(v) * 1e6:7.1f} / {v[int(0.9 * (len(v) - 1))] * 1e6:7.1f} µs"


def _timed(fn, log: list[float]):
    """``fn``, each call's unprofiled seconds appended to ``log``."""
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            log.append(time.perf_counter() - t0)
    return timed


def after_wait_costs(proto, dispatch, calls: int = 200, sleep_cycles: int = 0) -> str:
    """Unprofiled host µs (median / p90) of an exact dispatch's work after its counts wait,
    inside real dispatches (the GPU idle before each): the whole span from the wait's end to the
    call's return (``proto.wait_marks``), and of it ``summarized_result`` alone (timed by wrapping
    the protocol module's name). The bench's ``after_wait`` swung 38-171 µs from run to run on one
    code (session 39) where that function takes 13 µs on a CPU-only machine: this says whether
    the GPU machine's host is slow at the code itself, or loses the time around it.
    ``sleep_cycles``: a ``torch.cuda._sleep`` of that many cycles queued before each dispatch,
    as the bench's timed calls have (their after-wait took 2-3x the idle GPU's in session 40)."""
    import sys

    mod = sys.modules[type(proto).__module__]
    real = mod.summarized_result
    inner, whole = [], []
    mod.summarized_result = _timed(real, inner)
    try:
        for _ in range(calls):
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            dispatch()
            end = time.perf_counter()
            whole.append(end - proto.wait_marks[1])
            torch.cuda.synchronize()
    finally:
        mod.summarized_result = real

    behind = f", behind a {sleep_cycles}-cycle sleep" if sleep_cycles else ""
    # A result the wait filled (counts.Guess) needs no summarized_result.
    of_it = (f"{_median_p90(inner)} ({len(inner)} of the calls; the others' result was filled by the wait)"
             if inner else f"not called: the wait filled all {calls} results")
    return (f"    after the wait, whole   {_median_p90(whole)} (median / p90, {calls} calls{behind})\n"
            f"    of it summarized_result {of_it}")


class _TimedCalls:
    """Stands in for an extension object (``proto.ctx`` or ``proto.ext``): every method called
    through it is timed into ``log[name]``, unprofiled."""

    def __init__(self, inner, log: dict[str, list[float]]):
        self._inner, self._log = inner, log

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        return _timed(attr, self._log.setdefault(name, [])) if callable(attr) else attr


def before_wait_costs(proto, dispatch, calls: int = 200) -> str:
    """Unprofiled host µs (median / p90) of an exact dispatch's work before its counts wait,
    inside real dispatches (the GPU idle before each): the whole span from the call to the
    wait's start (``proto.wait_marks``), each extension call in it (the protocol's extension
    objects wrapped by ``_TimedCalls``: the CUDA protocols' ``ctx``, nvshmem's ``ext`` and the
    CUDA module it launches its one-PE kernel from) and the protocol's output allocation. The
    GPU idles for this span where no earlier work is queued (a step's first dispatch); the
    bench's 1 ms sleep before each timed call hides it. Call it after a first dispatch, which
    loads what is wrapped."""
    names = [n for n in ("ctx", "ext", "_alone_mod") if getattr(proto, n, None) is not None]
    real = {n: getattr(proto, n) for n in names}
    real_outputs = proto._outputs
    logs: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    allocs: list[float] = []
    for n in names:
        setattr(proto, n, _TimedCalls(real[n], logs[n]))
    proto._outputs = _timed(real_outputs, allocs)
    whole = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            dispatch()
            whole.append(proto.wait_marks[0] - t0)
            torch.cuda.synchronize()
    finally:
        for n in names:
            setattr(proto, n, real[n])
        del proto._outputs  # the class's method again

    rows = [("_outputs (the output tensors)", allocs)]
    rows += [(f"{n}.{k}, {len(v) / calls:.0f} a call", v) for n in names for k, v in logs[n].items()
             if "wait" not in k]  # the wait itself lies after the span
    rows.sort(key=lambda r: -statistics.median(r[1]))
    return "\n".join([f"    before the wait, whole                    {_median_p90(whole)} (median / p90, {calls} calls)"]
                     + [f"    of it {label:<36} {_median_p90(v)}" for label, v in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="torch")
    p.add_argument("--protocols", default="push")
    p.add_argument("--layouts", default="rank,expert")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    for backend in a.backends.split(","):
        for proto_name in a.protocols.split(","):
            if backend == "nvshmem" and proto_name == "pull":
                continue  # nvshmem pushes only
            cfg = bench_config(proto_name, backend=backend)
            b = cfg.buffer
            x, idx, w = _inputs(b.max_tokens_per_rank, b.hidden, b.topk, b.num_experts, 1, 0, 0, torch.device("cuda", 0))
            with Buffer(None, cfg) as buf:
                proto = buf._protocol
                if hasattr(proto, "ctx"):  # the CUDA protocols' extension (nvshmem has its own)
                    print(f"{backend} {proto_name} launch costs (median host µs, GPU busy):")
                    print(launch_costs(proto, idx), flush=True)
                for layout in a.layouts.split(","):
                    def dispatch(layout: str = layout):
                        return proto.dispatch(x, idx, w, layout, b.expert_alignment)

                    state = {"d": dispatch()}
                    print(f"{backend} {proto_name} {layout} dispatch, the host's work after its counts wait:")
                    for cycles in (0, sleep_cycles_for()):  # the GPU idle before each; as the bench's timed calls
                        print(after_wait_costs(proto, dispatch, sleep_cycles=cycles), flush=True)
                    print(f"{backend} {proto_name} {layout} dispatch, the host's work before its counts wait:")
                    print(before_wait_costs(proto, dispatch), flush=True)
                    ops = {
                        "dispatch": lambda: state.__setitem__("d", dispatch()),
                        "cached dispatch": lambda: proto.dispatch_cached(x, state["d"][1]),
                        "combine": lambda: proto.combine(state["d"][0].x, state["d"][1], None),
                    }
                    for op, fn in ops.items():
                        print(f"{backend} {proto_name} {layout} {op}:")
                        print(profile_op(fn, a.calls, a.top), flush=True)


if __name__ == "__main__":
    main()
