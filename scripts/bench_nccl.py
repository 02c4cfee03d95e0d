"""Benchmark of the nccl backend (push over NCCL LSA windows) at world size 1 on one GPU.

Dispatch and combine are timed by ``symmoe.bench.gpu.run_gpu_bench`` -- the same methodology,
byte accounting and copy roofline as the other backends (see symmoe/bench/gpu.py), at the
DeepSeek-V3 shape (4096 tokens x 7168 bf16, top-8 of 256 experts), both output layouts.
Added here: set-up/teardown time of the NCCL communicator + window, the host barrier's
round trip, and whether NCCL can set up GIN on this machine.

Usage: python3 scripts/bench_nccl.py --out nccl_bench.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


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
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--num-sms", type=int, default=0, help="0: every SM of the device")
    ap.add_argument("--out", default="nccl_bench.json")
    ap.add_argument("--no-gin-probe", action="store_true")
    a = ap.parse_args()

    from symmoe.backends import probe
    from symmoe.backends.nccl import NcclMemory, describe
    from symmoe.bench.gpu import bench_config, provenance, run_gpu_bench, table
    from symmoe.launch_shape import gpu_sms

    torch.cuda.init()
    sms = a.num_sms or gpu_sms(torch.device("cuda", 0)).total
    report: dict[str, Any] = {
        **provenance(" ".join(["python3", *sys.argv])),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "results": [],
    }
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
        cfg = bench_config("push", sms, backend="nccl")
        report["results"].append(run_gpu_bench(cfg, 1, repeats=a.repeats, baselines=True))
        print(table(report["results"]), flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
