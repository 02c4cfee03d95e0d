"""Benchmark of the nvshmem push backend (and the torch backend where it exists) on one GPU.

world size 1: dispatch and combine against the copy roofline (a device copy of the same
bytes, measured in the same run; a row must at least be read once and written once).
world size W > 1 (processes on one GPU, under MPS): aggregate received bytes per second of
all ranks over the same roofline, and the ratio to the torch backend in the same run.

Usage: python3 scripts/bench_nvshmem.py --world 1 4 --out results/nvshmem_bench.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

SHAPE = {"buffer.max_tokens_per_rank": 4096, "buffer.hidden": 7168, "buffer.topk": 8, "buffer.num_experts": 256,
         "buffer.dtype": "bfloat16", "buffer.expert_alignment": 1, "kernel.timeout_s": 60.0}


def copy_roofline(nbytes: int, iters: int = 20) -> float:
    """Bytes per second (read + written) of a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(iters):
        dst.copy_(src)
    b.record()
    b.synchronize()
    return 2 * nbytes * iters / (a.elapsed_time(b) * 1e-3)


def bench_rank(rank: int, world: int, cfg_dict: dict[str, Any], layouts: list[str], iters: int) -> dict[str, Any]:
    from symmoe import Buffer
    from symmoe.config import from_dict
    from symmoe.workload import Routing, make_inputs

    os.environ["SYMMOE_NVSHMEM_TIMING"] = "1"
    cfg = from_dict(cfg_dict)
    b = cfg.buffer
    T = b.max_tokens_per_rank
    inputs = make_inputs(Routing("uniform"), num_tokens=[T] * world, hidden=b.hidden, topk=b.topk,
                         num_experts=b.num_experts, world_size=world, dtype=torch.bfloat16, seed=7)[rank]
    x, idx, w = inputs.x.cuda(), inputs.topk_idx.cuda(), inputs.topk_weights.cuda()
    out: dict[str, Any] = {}
    with Buffer(None, cfg) as buf:
        proto = buf._protocol
        for layout in layouts:
            times: dict[str, list[float]] = {"dispatch": [], "combine": [], "dispatch_kernel": [], "combine_kernel": []}
            recv = None
            for it in range(iters + 3):
                if world > 1:
                    dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                recv = buf.dispatch(x, idx, w, output_layout=layout)
                recv[5].synchronize()
                t1 = time.perf_counter()
                y = recv[0]
                if world > 1:
                    dist.barrier()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                _, _, ev = buf.combine(y, recv[4])
                ev.synchronize()
                t3 = time.perf_counter()
                if it >= 3:
                    times["dispatch"].append((t1 - t0) * 1e3)
                    times["combine"].append((t3 - t2) * 1e3)
                    km = getattr(proto, "kernel_ms", {})
                    if km:
                        times["dispatch_kernel"].append(km.get("dispatch", float("nan")))
                        times["combine_kernel"].append(km.get("combine", float("nan")))
            rows = recv[0].shape[0]
            row_bytes = b.hidden * 2
            valid_rows = int((recv[4].recv_src_rank >= 0).sum())
            out[layout] = {
                "recv_rows": rows, "recv_bytes": valid_rows * row_bytes,
                # combine moves one row back per received row, and reads/writes each token once more
                **{f"{k}_ms": statistics.median(v) for k, v in times.items() if v},
                **{f"{k}_ms_min": min(v) for k, v in times.items() if v},
            }
    return out


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--backends", nargs="+", default=["nvshmem", "torch"])
    ap.add_argument("--layouts", nargs="+", default=["rank", "expert"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--num-sms", type=int, default=96)
    ap.add_argument("--channels", type=int, default=48)
    ap.add_argument("--out", default="results/nvshmem_bench.json")
    a = ap.parse_args()

    from symmoe.backends import probe
    from symmoe.config import Config
    from symmoe.launch import spawn

    torch.cuda.init()
    roof = copy_roofline(1 << 30)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("SYMMOE_COMMIT") or git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "device": torch.cuda.get_device_name(0), "command": " ".join([sys.executable, *sys.argv]),
        "shape": SHAPE, "copy_roofline_bytes_per_s": roof, "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
        "runs": [],
    }
    print(f"copy roofline: {roof / 1e12:.2f} TB/s (read + write)", flush=True)
    for backend in a.backends:
        ok, why = probe(backend)
        if not ok:
            report["runs"].append({"backend": backend, "skipped": why})
            print(f"{backend}: skipped ({why})", flush=True)
            continue
        for world in a.world:
            over = dict(SHAPE, backend=backend, **{"kernel.num_sms": a.num_sms if world == 1 else max(2, a.num_sms // world),
                                                   "kernel.num_channels": a.channels if world == 1 else max(1, a.channels // world)})
            if backend == "torch":
                over["torch.allow_overlapping_devices"] = True
            cfg = Config().replace(**over).to_dict()
            env = {"NVSHMEM_DISABLE_NVLS": "1"}
            if world > 1 and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // world)
            try:
                per_rank = spawn(bench_rank, world, args=(cfg, a.layouts, a.iters), env=env, timeout_s=300.0)
            except Exception as e:  # noqa: BLE001 -- keep the other runs
                report["runs"].append({"backend": backend, "world": world, "error": str(e)[:2000]})
                print(f"{backend} W={world}: error {e}", flush=True)
                continue
            for layout in a.layouts:
                rr = [p[layout] for p in per_rank]
                total = sum(r["recv_bytes"] for r in rr)
                run = {"backend": backend, "world": world, "layout": layout, "per_rank": rr,
                       "num_sms": over["kernel.num_sms"], "num_channels": over["kernel.num_channels"]}
                for phase in ("dispatch", "combine", "dispatch_kernel", "combine_kernel"):
                    key = f"{phase}_ms"
                    if all(key in r for r in rr):
                        t = max(r[key] for r in rr) * 1e-3
                        rate = total / t
                        # a received row is read once and written once at least: 2 bytes of copy per byte
                        run[f"{phase}_bytes_per_s"] = rate
                        run[f"{phase}_of_roofline"] = 2 * rate / roof
                report["runs"].append(run)
                print(f"{backend:8s} W={world} {layout:6s} " + "  ".join(
                    f"{p}: {run.get(p + '_bytes_per_s', float('nan')) / 1e9:7.1f} GB/s "
                    f"({100 * run.get(p + '_of_roofline', float('nan')):5.1f}%)"
                    for p in ("dispatch", "combine", "dispatch_kernel", "combine_kernel")), flush=True)
    # ratio nvshmem / torch where both ran
    for r in report["runs"]:
        if r.get("backend") != "nvshmem" or "layout" not in r:
            continue
        t = next((x for x in report["runs"] if x.get("backend") == "torch" and x.get("world") == r["world"]
                  and x.get("layout") == r["layout"]), None)
        if t:
            for p in ("dispatch", "combine"):
                if f"{p}_bytes_per_s" in t:
                    r[f"{p}_ratio_to_torch"] = r[f"{p}_bytes_per_s"] / t[f"{p}_bytes_per_s"]
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
