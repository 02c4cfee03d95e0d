"""One A/B job: every rank builds the same seeded inputs, creates one Buffer per variant,
and runs rounds of every variant, ``A B C``, ``B C A``, ``C A B``, ``C B A`` ..., so that drift (clocks,
thermals, neighbours) lands on every variant alike, in a balanced order
(``bench.timing.balanced``: each variant runs right after each other one equally often, and A
opens round 0).

Round 0 is the check pass (not timed), then ``warmup`` rounds, then ``repeats`` timed
rounds. In every round each variant's outputs are compared bitwise with the first
variant's round-0 outputs (and, when the spec asks, the first variant's with
``symmoe.reference``). Ranks exchange what they found at the end of each round, so a
mismatch stops every rank at the same point and they all report the same first problem.

Timing of one call: L2 flushed (GPU: 256 MB scratch write), device synchronised, ranks
aligned with a process-group barrier, then CUDA events (GPU) or ``perf_counter`` (CPU)
around the Buffer call as a user makes it (host syncs it does inside included). With
``workload.timing: device`` a GPU call is queued behind a 1 ms sleep kernel first, as
``symmoe.bench`` times it: the host's launch work is hidden, a host wait inside the call is not.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import fp8, launch, reference
from ..bench.ops import OPS
from ..bench.timing import balanced, flush_l2, sleep_cycles_for
from ..buffer import Buffer
from ..layout import DTYPES
from ..progress import Progress
from ..testing.compare import bits as _bits, first_bit_difference
from ..workload import RankInputs, make_inputs, make_topk_idxs
from .spec import TENSORS, Spec


@dataclass(frozen=True)
class Job:
    """What every rank gets (pickled to spawned ranks)."""
    spec: Spec
    ranks_per_node: int  # resolved: >= 1
    progress: bool = True


class ABMismatchFound(Exception):
    """Internal: carries the agreed problem out of the round loop."""


def compare_outputs(outs: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor | None]) \
        -> tuple[str, dict[str, Any]] | None:
    """(tensor name, first difference) for the first tensor that differs, in TENSORS order."""
    for name in TENSORS:
        a, b = outs.get(name), want.get(name)
        if a is None and b is None:
            continue
        if a is None or b is None:
            return name, {"row": None, "col": None, "got": a is not None, "want": b is not None,
                          "detail": f"returned by {'this variant' if a is not None else 'the other'} only"}
        d = first_bit_difference(a, b)
        if d is not None:
            return name, d
    return None


def corrupt_outputs(outs: dict[str, Any], hook: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Test hook (spec key ``_corrupt``, honoured only with SYMMOE_AB_TEST_HOOKS=1): flip the
    lowest bit of one element of one output on one rank. Defaults: recv_x, last rank, row 1, col 3."""
    if rank != hook.get("rank", world_size - 1):
        return outs
    name = hook.get("tensor", "recv_x")
    t = outs.get(name)
    if t is None or t.numel() == 0:
        return outs
    t = t.clone()
    pos: tuple[int, ...] = (min(hook.get("row", 1), t.shape[0] - 1),)
    if t.dim() > 1:
        pos += (min(hook.get("col", 3), t.shape[1] - 1),) + (0,) * (t.dim() - 2)
    bits = _bits(t)
    bits[pos] = bits[pos] ^ 1
    outs = dict(outs)
    outs[name] = t
    return outs


# -- bytes, as the field counts them ---------------------------------------------------------
def account_bytes(topk_idxs: list[torch.Tensor], rank: int, num_experts: int, output_layout: str, row_bytes: int,
                  ranks_per_node: int) -> dict[str, Any]:
    """Bytes of the rows ``rank`` receives in dispatch (and sends back in combine): rows x
    hidden x element size, like DeepEP's ``recv_x.numel() * elem_size`` -- rank-major: one
    row per (source, token) with an expert here; expert-major: one per (source, token,
    expert here), padding not counted. Rows from ranks on this rank's node (its own rows
    included, as DeepEP counts them) are intra-node (NVLink) bytes, the rest network bytes."""
    W = len(topk_idxs)
    L = num_experts // W
    rows_from = []
    for idx in topk_idxs:
        here = (idx >= 0) & (idx // L == rank)
        rows_from.append(int(here.any(1).sum()) if output_layout == "rank" else int(here.sum()))
    node = rank // ranks_per_node
    intra = sum(n for s, n in enumerate(rows_from) if s // ranks_per_node == node)
    total = sum(rows_from)
    return {"rows": total, "rows_from": rows_from, "row_bytes": row_bytes, "total_bytes": total * row_bytes,
            "intra_node_bytes": intra * row_bytes, "network_bytes": (total - intra) * row_bytes,
            "self_bytes": rows_from[rank] * row_bytes}


# -- timing -----------------------------------------------------------------------------------
class _Clock:
    def __init__(self, device: torch.device, world_size: int, queued: bool = False):
        self.device, self.world_size = device, world_size
        self.cuda = device.type == "cuda"
        self.sleep = sleep_cycles_for() if queued and self.cuda else 0

    def _align(self) -> None:
        if self.cuda:
            flush_l2(self.device)
            torch.cuda.synchronize(self.device)
        if self.world_size > 1:
            dist.barrier()

    def time(self, fn, *args, **kwargs):
        """``(fn(*args, **kwargs), token)``; ``seconds(token)`` reads the time later."""
        self._align()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(self.device)  # before the call: its end waits for no lookup
            if self.sleep:
                torch.cuda._sleep(self.sleep)
            start.record(stream)
            out = fn(*args, **kwargs)
            end.record(stream)
            return out, (start, end)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        return out, time.perf_counter() - t0

    @staticmethod
    def seconds(token) -> float:
        if isinstance(token, tuple):
            start, end = token
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        return token


def _device_for_rank(rank: int, spec: Spec) -> torch.device | None:
    if not spec.gpu_variants:
        return None
    return launch.local_gpu(rank)


def _gather(obj: Any, world_size: int) -> list[Any]:
    if world_size == 1 or not dist.is_initialized():
        return [obj]
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, obj)
    return every


def _env_of_rank(rank: int, device: torch.device | None) -> dict[str, Any]:
    out: dict[str, Any] = {"rank": rank, "hostname": socket.gethostname(), "pid": os.getpid(),
                           "device": str(device) if device is not None else "cpu"}
    if device is not None:
        out["device_name"] = torch.cuda.get_device_name(device)
    return out


# -- one rank ---------------------------------------------------------------------------------
def rank_main(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Run the whole job on this rank; returns its samples, or the agreed mismatch."""
    spec, wl = job.spec, job.spec.workload
    gpu = _device_for_rank(rank, spec)
    dtype = DTYPES[wl.dtype]
    routing = wl.make_routing()
    T = wl.tokens_per_rank
    inputs = make_inputs(routing, num_tokens=T, hidden=wl.hidden, topk=wl.topk, num_experts=wl.num_experts,
                         world_size=world_size, dtype=dtype, seed=wl.seed,
                         ranks=None if spec.reference else [rank])
    if wl.fp8 != "none":  # x as (e4m3, scales), quantized from the same bfloat16 rows
        inputs = [None if i is None else RankInputs(fp8.quantize(i.x, wl.fp8), i.topk_idx, i.topk_weights)
                  for i in inputs]
    idxs = ([i.topk_idx for i in inputs] if spec.reference else
            make_topk_idxs(routing, num_tokens=T, topk=wl.topk, num_experts=wl.num_experts, world_size=world_size,
                           seed=wl.seed))
    row_bytes = (wl.hidden * dtype.itemsize if wl.fp8 == "none"
                 else wl.hidden + fp8.formats(wl.hidden)[wl.fp8].scale_bytes)  # e4m3 bytes and their scales
    nbytes = account_bytes(idxs, rank, wl.num_experts, wl.output_layout, row_bytes, job.ranks_per_node)
    # DeepEP V1's worst-case sizes (rank-major: every token of every rank), timed beside the
    # exact dispatch: on the GPU backends it has no host wait.
    worst = world_size * T if wl.output_layout == "rank" else 0
    expected = _reference(inputs, rank, wl, gpu, worst) if spec.reference else None
    mine = inputs[rank]
    del inputs

    variants = spec.variants
    names = [v.name for v in variants]
    rounds = 1 + wl.warmup + wl.repeats
    bar = Progress(rounds * len(variants), f"ab {spec.name}", enabled=job.progress and rank == 0)
    samples = {n: {op: [] for op in OPS if worst or op != "worst_dispatch"} for n in names}
    bufs: list[Buffer] = []
    try:
        for v in variants:
            bufs.append(Buffer(None, v.config))
        by_device: dict[torch.device, tuple] = {}
        in_buffer: dict[int, torch.Tensor] = {}  # x_in_buffer variants: x in their Buffer.input_view
        # the first variant's round-0 outputs: of the exact calls, and of the worst-case dispatch
        golden: dict[str, dict[str, torch.Tensor | None]] = {"exact": {}, "worst": {}}
        y_by_device: dict[torch.device, tuple] = {}
        timer = {"cuda" if b.device.type == "cuda" else "cpu" for b in bufs}
        for rnd in range(rounds):
            problem = None
            timed = rnd >= 1 + wl.warmup
            for vi in balanced(range(len(variants)), rnd):  # none always right after the same other
                v, buf = variants[vi], bufs[vi]

                def check(outs: dict[str, Any], kind: str = "exact") -> None:
                    """Compare right after each call (outputs may alias the buffer's pools)."""
                    nonlocal problem
                    if problem is not None:
                        return
                    if v.corrupt is not None and v.corrupt.get("call", kind) == kind:
                        outs = corrupt_outputs(outs, v.corrupt, rank, world_size)
                    if rnd == 0 and vi == 0:
                        golden[kind].update({k: (t.clone() if t is not None else None) for k, t in outs.items()})
                        if expected is not None:
                            diff = compare_outputs(outs, {k: expected[kind][k] for k in outs})
                            if diff is not None:
                                problem = _problem(rnd, wl.warmup, v.name, "symmoe.reference", rank, *diff)
                    else:
                        diff = compare_outputs(outs, {k: golden[kind][k] for k in outs})
                        if diff is not None:
                            problem = _problem(rnd, wl.warmup, v.name, names[0], rank, *diff)

                dev = buf.device
                if dev not in by_device:
                    by_device[dev] = (_to(mine.x, dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev))
                x, idx, w = by_device[dev]
                if v.x_in_buffer:  # where the layer before would have written it (same rows)
                    x = in_buffer.get(vi)
                    if x is None:
                        x = in_buffer[vi] = buf.input_view(T).copy_(by_device[dev][0])
                clock = _Clock(dev, world_size, wl.timing == "device")
                (rx, ri, rw, per_expert, handle, ev), td = clock.time(
                    buf.dispatch, x, idx, w, output_layout=wl.output_layout, expert_alignment=wl.expert_alignment)
                ev.synchronize()
                check(_recv_outputs(rx, ri, rw, per_expert))
                if not y_by_device:  # expert outputs for combine: the first variant's recv rows
                    y_by_device[dev] = (_expert_rows(rx, dtype), rw.clone() if wl.output_layout == "rank" else None)
                if dev not in y_by_device:
                    y0, yw0 = next(iter(y_by_device.values()))
                    y_by_device[dev] = (y0.to(dev), yw0.to(dev) if yw0 is not None else None)
                y, yw = y_by_device[dev]
                del rx, ri, rw
                (cx, cw, ev), tc = clock.time(buf.combine, y, handle, yw)
                ev.synchronize()
                check({"combined_x": cx, "combined_topk_weights": cw})
                del cx, cw
                # The backward pass's dispatch: along the handle's routing, no routing of its own
                # (the same x here, so the same rows as the dispatch above).
                (rx, ri, rw, per_expert, _, ev), tcd = clock.time(buf.dispatch, x, handle=handle)
                ev.synchronize()
                check(_recv_outputs(rx, ri, rw, per_expert))
                del handle, rx, ri, rw
                times = {"dispatch": td, "cached_dispatch": tcd, "combine": tc}
                if worst:
                    (rx, ri, rw, per_expert, _, ev), times["worst_dispatch"] = clock.time(
                        buf.dispatch, x, idx, w, output_layout=wl.output_layout, expert_alignment=wl.expert_alignment,
                        num_worst_tokens=worst)
                    ev.synchronize()
                    check(_recv_outputs(rx, ri, rw, per_expert), "worst")
                    del rx, ri, rw
                if timed:
                    for op, t in times.items():
                        samples[v.name][op].append(clock.seconds(t))
                bar.update()
            if rnd == 0:
                expected = None  # checked; free it
            found = [p for p in _gather(problem, world_size) if p is not None]
            if found:
                return {"status": "mismatch", "rank": rank, "problem": found[0], "ranks_with_problems":
                        [p["rank"] for p in found], "env": _env_of_rank(rank, gpu)}
        return {"status": "ok", "rank": rank, "samples": samples, "bytes": nbytes, "rounds_checked": rounds,
                "timer": "cuda-events" if "cuda" in timer else "host-perf-counter",
                "timers": {v.name: ("cuda-events" if b.device.type == "cuda" else "host-perf-counter")
                           for v, b in zip(variants, bufs)},
                "env": _env_of_rank(rank, gpu)}
    finally:
        for b in bufs:
            b.close()


def _to(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], dev: torch.device):
    return tuple(t.to(dev) for t in x) if isinstance(x, tuple) else x.to(dev)


def _expert_rows(rx: torch.Tensor | tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Expert outputs for combine made from the received rows (FP8: its e4m3 values in ``dtype``)."""
    return rx[0].to(dtype) if isinstance(rx, tuple) else rx.clone()


def _recv_outputs(rx: torch.Tensor | tuple[torch.Tensor, torch.Tensor], ri: torch.Tensor, rw: torch.Tensor,
                  per_expert: list[int] | torch.Tensor) -> dict[str, Any]:
    """A dispatch's outputs by name; the per-expert counts (a list, or a tensor at worst-case
    sizes) as int64 on the host; FP8 rows as recv_x (e4m3) and recv_x_scales."""
    counts = (per_expert.to("cpu", torch.int64) if isinstance(per_expert, torch.Tensor)
              else torch.tensor(per_expert, dtype=torch.int64))
    rx, scales = rx if isinstance(rx, tuple) else (rx, None)
    return {"recv_x": rx, "recv_x_scales": scales, "recv_topk_idx": ri, "recv_topk_weights": rw, "num_recv_tokens_per_expert": counts}


def _problem(rnd: int, warmup: int, variant: str, against: str, rank: int, tensor: str,
             diff: dict[str, Any]) -> dict[str, Any]:
    phase = "check pass" if rnd == 0 else ("warm-up" if rnd <= warmup else "timed repeat")
    return {"round": rnd, "phase": phase, "variant": variant, "against": against, "rank": rank, "tensor": tensor,
            **{k: (v if isinstance(v, (int, str, bool, type(None))) else str(v)) for k, v in diff.items()}}


def describe_problem(p: dict[str, Any], ranks: list[int] | None = None) -> str:
    against = "the reference (symmoe.reference)" if p["against"] == "symmoe.reference" else f"variant '{p['against']}'"
    where = ""
    if p.get("row") is not None:
        where = f" at row {p['row']}" + (f", column {p['col']}" if p.get("col") is not None else "")
    others = ""
    if ranks and len(ranks) > 1:
        others = f" (ranks with a difference: {', '.join(map(str, ranks))})"
    return (f"bitwise mismatch: variant '{p['variant']}' differs from {against} on rank {p['rank']} in "
            f"{p['tensor']}{where} (round {p['round']}, {p['phase']}): {p['detail']}{others}")


def _reference(inputs, rank: int, wl, gpu: torch.device | None, worst: int) -> dict[str, dict[str, Any]]:
    """What this rank must receive and get back, by symmoe.reference, with the A/B run's
    expert outputs (every receiver's own recv rows, and for rank-major its recv weights):
    "exact" for dispatch, cached dispatch and combine, "worst" for a dispatch of ``worst`` rows."""
    dev = gpu or torch.device("cpu")
    xs = [_to(i.x, dev) for i in inputs]
    idxs = [i.topk_idx.to(dev) for i in inputs]
    ws = [i.topk_weights.to(dev) for i in inputs]
    ref = reference.dispatch(xs, idxs, ws, wl.num_experts, wl.output_layout, wl.expert_alignment)
    ys = [_expert_rows(r.x, DTYPES[wl.dtype]) for r in ref.recv]
    rws = [r.topk_weights for r in ref.recv] if wl.output_layout == "rank" else None
    comb = reference.combine(ys, ref, idxs, ws, wl.num_experts, wl.output_layout, rws)
    me = ref.recv[rank]
    padded = reference.pad_recv(me, worst)

    def recv(r) -> dict[str, torch.Tensor]:
        return _recv_outputs(r.x, r.topk_idx, r.topk_weights, r.num_recv_tokens_per_expert)

    return {"exact": {**recv(me), "combined_x": comb[rank][0], "combined_topk_weights": comb[rank][1]},
            "worst": recv(padded)}
