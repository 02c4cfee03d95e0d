"""Benchmark of the nccl backend (push over NCCL LSA windows) at world size 1 on one GPU.

Dispatch and combine against the copy roofline: a device copy of 1 GiB measured in the same
run (bytes read + written); a received row must be read once and written once at least,
so ``of_roofline = 2 * received_bytes / time / roofline``. Times: wall clock of the call
including its host synchronisation (what a training step sees; median of --iters) and CUDA
events around the call (GPU time). Also reports set-up/teardown times of the NCCL window and
whether NCCL can set up GIN here.

Usage: python3 scripts/bench_nccl.py --out results/nccl_bench.json
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


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def bench(cfg_dict: dict[str, Any], layouts: list[str], iters: int, routing: str) -> dict[str, Any]:
    from symmoe import Buffer
    from symmoe.config import from_dict
    from symmoe.workload import Routing, make_inputs

    cfg = from_dict(cfg_dict)
    b = cfg.buffer
    T = b.max_tokens_per_rank
    inp = make_inputs(Routing(routing), num_tokens=[T], hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                      world_size=1, dtype=torch.bfloat16, seed=7)[0]
    x, idx, w = inp.x.cuda(), inp.topk_idx.cuda(), inp.topk_weights.cuda()
    out: dict[str, Any] = {}
    with Buffer(None, cfg) as buf:
        for layout in layouts:
            wall: dict[str, list[float]] = {"dispatch": [], "combine": []}
            gpu: dict[str, list[float]] = {"dispatch": [], "combine": []}
            recv = None
            for it in range(iters + 3):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                ev[0].record()
                recv = buf.dispatch(x, idx, w, output_layout=layout)
                ev[1].record()
                recv[5].synchronize()
                t1 = time.perf_counter()
                y = recv[0]
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                ev[2].record()
                _, _, e = buf.combine(y, recv[4])
                ev[3].record()
                e.synchronize()
                t3 = time.perf_counter()
                if it >= 3:
                    wall["dispatch"].append((t1 - t0) * 1e3)
                    wall["combine"].append((t3 - t2) * 1e3)
                    gpu["dispatch"].append(ev[0].elapsed_time(ev[1]))
                    gpu["combine"].append(ev[2].elapsed_time(ev[3]))
            valid_rows = int((recv[4].recv_src_rank >= 0).sum())
            out[layout] = {
                "recv_rows": int(recv[0].shape[0]), "recv_bytes": valid_rows * b.hidden * 2,
                **{f"{k}_ms": statistics.median(v) for k, v in wall.items()},
                **{f"{k}_ms_min": min(v) for k, v in wall.items()},
                **{f"{k}_gpu_ms": statistics.median(v) for k, v in gpu.items()},
            }
    return out


def setup_times(rounds: int = 5) -> dict[str, Any]:
    from symmoe.backends.nccl import NcclMemory
    make, close = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        m = NcclMemory(None, 1 << 30)
        t1 = time.perf_counter()
        m.close()
        close.append(time.perf_counter() - t1)
        make.append(t1 - t0)
    m = NcclMemory(None, 1 << 20)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        m.barrier("bench")
    barrier_us = (time.perf_counter() - t0) / 200 * 1e6
    m.close()
    return {"setup_1GiB_s": statistics.median(make), "close_s": statistics.median(close),
            "host_barrier_us": barrier_us}


def gin_probe() -> str:
    """Can NCCL set up GIN on this machine (forced, one rank)? Says what NCCL answered."""
    import nccl.core as nc

    from symmoe.backends import nccl as nb
    ext = nb._ext()
    comm = nc.Communicator.init(1, 0, nc.get_unique_id())
    try:
        dc = ext.DevComm(comm.ptr, 1, 2, True)
        ans = f"GIN set up: {dc.gin_contexts} context(s)"
        dc.destroy()
    except Exception as e:  # noqa: BLE001
        ans = f"no GIN: {e}"
    finally:
        comm.destroy()
    return ans


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", nargs="+", default=["rank", "expert"])
    ap.add_argument("--routing", default="uniform")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--num-sms", type=int, default=96)
    ap.add_argument("--channels", type=int, default=48)
    ap.add_argument("--out", default="results/nccl_bench.json")
    ap.add_argument("--no-gin-probe", action="store_true")
    a = ap.parse_args()

    from symmoe.backends import probe
    from symmoe.backends.nccl import NcclMemory, describe
    from symmoe.config import Config

    torch.cuda.init()
    roof = copy_roofline(1 << 30)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "device": torch.cuda.get_device_name(0), "command": " ".join([sys.executable, *sys.argv]),
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",)},
        "shape": SHAPE, "routing": a.routing, "copy_roofline_bytes_per_s": roof, "runs": [],
    }
    print(f"copy roofline: {roof / 1e12:.2f} TB/s (read + write)", flush=True)
    ok, why = probe("nccl")
    if not ok:
        report["skipped"] = why
        print(f"nccl: skipped ({why})")
    else:
        report["nccl"] = describe()
        report["transports"] = NcclMemory.describe_transports()
        report["setup"] = setup_times()
        print("nccl set-up:", report["setup"], flush=True)
        if not a.no_gin_probe:
            report["gin_probe"] = gin_probe()
            print("GIN probe:", report["gin_probe"], flush=True)
        over = dict(SHAPE, backend="nccl", **{"kernel.num_sms": a.num_sms, "kernel.num_channels": a.channels})
        cfg = Config().replace(**over).to_dict()
        res = bench(cfg, a.layouts, a.iters, a.routing)
        for layout in a.layouts:
            r = res[layout]
            run = {"backend": "nccl", "world": 1, "layout": layout, **r, "num_sms": a.num_sms,
                   "num_channels": a.channels}
            for phase in ("dispatch", "combine"):
                for kind, key in (("", f"{phase}_ms"), ("_gpu", f"{phase}_gpu_ms")):
                    rate = r["recv_bytes"] / (r[key] * 1e-3)
                    run[f"{phase}{kind}_bytes_per_s"] = rate
                    run[f"{phase}{kind}_of_roofline"] = 2 * rate / roof
            report["runs"].append(run)
            print(f"nccl W=1 {layout:6s} rows {r['recv_rows']:6d} " + "  ".join(
                f"{p}: {r[p + '_ms'] * 1e3:7.1f} us {100 * run[p + '_of_roofline']:5.1f}% "
                f"(gpu {r[p + '_gpu_ms'] * 1e3:7.1f} us {100 * run[p + '_gpu_of_roofline']:5.1f}%)"
                for p in ("dispatch", "combine")), flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
