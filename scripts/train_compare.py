#!/usr/bin/env python3
"""Run examples/train_moe.py under torchrun once per backend setting and world size, and
check that every setting of one world size gives the same loss curve and final weights, bit
for bit. Prints one line per run and a verdict per world size; exit 1 on any difference or
failed run.

  scripts/train_compare.py --world-sizes 2,4 \\
      --run torch-push=backend=torch,protocol=push --run nvshmem=backend=nvshmem --json out.json

Each --run is NAME=KEY=VALUE,KEY=VALUE... (config keys set on --config, as the example's --set).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(config: str, sets: list[str], world_size: int, steps: int, extra: list[str], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world_size),
               str(ROOT / "examples" / "train_moe.py"), "--config", config, "--steps", str(steps),
               "--out", str(out), *extra]
        for s in sets:
            cmd += ["--set", s]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        if proc.returncode != 0 or not out.exists():
            text = proc.stderr + proc.stdout
            # the ranks' own exceptions, not torchrun's summary of them
            lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln) for ln in text.splitlines()]
            why = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Failed|Unavailable)\b", ln)
                   and not ln.startswith("torch.distributed.elastic")]
            return {"error": f"exit {proc.returncode}: " + (" | ".join(dict.fromkeys(why))[:1500] or text[-1500:])}
        return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "train_host.yaml"))
    p.add_argument("--world-sizes", default="2")
    p.add_argument("--run", action="append", required=True, metavar="NAME=KEY=VALUE,...")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=180)
    p.add_argument("--json", help="write every run's losses and digest here")
    p.add_argument("extra", nargs="*", help="more arguments for the example (after --)")
    args = p.parse_args()
    runs = []
    for spec in args.run:
        name, _, sets = spec.partition("=")
        runs.append((name, [s for s in sets.split(",") if s]))
    results, ok = {}, True
    for w in (int(v) for v in args.world_sizes.split(",")):
        first = None
        for name, sets in runs:
            r = run_one(args.config, sets, w, args.steps, args.extra, args.timeout_s)
            results[f"{name}@W={w}"] = r
            if "error" in r:
                print(f"W={w} {name}: FAILED {r['error']}", flush=True)
                ok = False
                continue
            same = first is None or (r["losses"] == first[1]["losses"] and r["weights_sha256"] == first[1]["weights_sha256"])
            first = first or (name, r)
            ok &= same
            print(f"W={w} {name}: last loss {float.fromhex(r['losses'][-1]):.6f}, weights {r['weights_sha256'][:16]} "
                  f"{'bitwise equal to ' + first[0] if same else 'DIFFERS from ' + first[0]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("train compare:", "every run of a world size bitwise equal" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
