"""``symmoe tune CONFIG --world-size N --tokens T[,T...]``: the launch settings that run fastest
here, written as a YAML config.

The search is coordinate descent over the knobs that change speed and never results
(``KNOBS``): each knob in turn is set to each of its values with the others held at the best
so far, and the value with the lowest score is kept. A candidate is timed as
``symmoe.bench.deepep`` times an implementation (the DeepEP V1 API driven the same way, whole
calls from an idle device, slowest rank's median) on every op (dispatch, worst-case dispatch,
cached dispatch, combine) at every token count; its score is the sum of the logs of those
times, so each op and batch size weighs the same whatever its length. A value the backend
refuses (e.g. ``push_mode: stream`` with ranks sharing a GPU) is reported and skipped.

Every rank times every candidate and the ranks agree on each choice from all their times, so
they create and free the same buffers in the same order.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from typing import Any

import torch

from .. import launch
from ..config import Config, from_dict, load, parse_world_size
from ..errors import ConfigError, SymmoeError
from ..launch_shape import gpu_sms
from . import deepep

# Each knob's values, in the order they are tried. Only knobs a backend uses are searched
# (``knobs_for``); num_sms values above the device's SMs are dropped.
KNOBS: dict[str, tuple[Any, ...]] = {
    "protocol": ("push", "pull"),
    "kernel.num_sms": (16, 20, 24, 32, 40, 48, 64, 96, 132),
    "kernel.push_mode": ("auto", "unpack", "stream"),
    "kernel.copy_depth": (0, 2, 3, 4, 6),
    "kernel.num_channels": (8, 16, 32, 64),
}


def knobs_for(config: Config, sms: int) -> dict[str, tuple[Any, ...]]:
    """The knobs searched for ``config``'s backend on a device of ``sms`` SMs."""
    from ..backends import declared

    spec = declared(config.backend)
    out: dict[str, tuple[Any, ...]] = {}
    protocols = tuple(p for p in KNOBS["protocol"] if p in spec.protocols)
    if len(protocols) > 1:
        out["protocol"] = protocols
    out["kernel.num_sms"] = tuple(n for n in KNOBS["kernel.num_sms"] if n <= sms) or (sms,)
    if spec.channel_rings:  # its push runs one sender and one receiver block per channel
        out["kernel.num_channels"] = KNOBS["kernel.num_channels"]
    else:  # the shared kernels: the streamed push and the bulk-copy depth
        out["kernel.push_mode"] = KNOBS["kernel.push_mode"]
        out["kernel.copy_depth"] = KNOBS["kernel.copy_depth"]
    return out


def score(times_us: dict[str, float]) -> float:
    """Sum of the logs of a candidate's times (every op and batch size weighs the same)."""
    return sum(math.log(t) for t in times_us.values())


def _slowest(per_rank: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Each (tokens, op)'s slowest rank; None when some rank could not run the candidate."""
    if any(r is None for r in per_rank):
        return None
    return {k: max(r[k] for r in per_rank) for k in per_rank[0]}


def _time_candidate(cfg: Config, inputs: dict[int, tuple[torch.Tensor, ...]], spec: dict[str, Any]) -> dict[str, float]:
    import torch.distributed as dist

    from ..compat import deep_ep_v1

    buf = deep_ep_v1.Buffer(dist.group.WORLD, symmoe_config=cfg)
    try:
        im = deepep.Impl("candidate", buf)
        out: dict[str, float] = {}
        for T, (x, idx, w) in inputs.items():
            im.prepare(x, idx, w, cfg.buffer.num_experts)
            for _ in range(spec["warmup"]):
                for op in deepep.OPS:
                    im.call(op)
            for op in deepep.OPS:
                out[f"{T}/{op}"] = statistics.median(
                    deepep._timed(lambda: im.call(op), dist.barrier) for _ in range(spec["repeats"]))
        return out
    finally:
        buf.destroy()


def _rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    device = launch.local_gpu(rank)
    best = from_dict(spec["config"])
    sms = gpu_sms(device).total
    inputs = {T: deepep._inputs(T, world_size, rank, spec["seed"], device)[:3] for T in spec["tokens"]}
    tried: list[dict[str, Any]] = []
    seen: dict[str, tuple[float, dict[str, float] | None]] = {}

    def evaluate(cfg: Config) -> tuple[float, dict[str, float] | None, str]:
        key = cfg.digest()
        if key in seen:
            return (*seen[key], "")
        why = ""
        try:
            mine: dict[str, float] | None = _time_candidate(cfg, inputs, spec)
        except (SymmoeError, ConfigError, ValueError) as e:  # refused before any launch: the same on every rank
            mine, why = None, f"{type(e).__name__}: {e}"
        every: list[Any] = [None] * world_size
        dist.all_gather_object(every, mine)
        times = _slowest(every)
        s = score(times) if times else math.inf
        seen[key] = (s, times)
        return s, times, why

    best_score, best_times, why = evaluate(best)
    if best_times is None:
        raise SymmoeError(f"the starting config does not run: {why}")
    tried.append({"knob": "start", "value": None, "score": best_score, "us": best_times})
    for knob, values in knobs_for(best, sms).items():
        for value in values:
            try:
                cand = best.replace(**{knob: value})
            except ConfigError as e:
                tried.append({"knob": knob, "value": value, "score": None, "refused": str(e)})
                continue
            s, times, why = evaluate(cand)
            tried.append({"knob": knob, "value": value, "score": None if times is None else s, "us": times,
                          **({"refused": why} if why else {})})
            if s < best_score:
                best, best_score, best_times = cand, s, times
    return {"best": best.to_dict(), "score": best_score, "us": best_times, "tried": tried}


def tune(config: Config, world_size: int, tokens: list[int], repeats: int = 10, warmup: int = 2, seed: int = 0,
         mps_share: str = "default") -> dict[str, Any]:
    """The best config found for ``world_size`` ranks at ``tokens`` tokens per rank, with every
    candidate's times (``rank 0``'s record; every rank decided the same)."""
    cfg = config.replace(**{"buffer.max_tokens_per_rank": max(max(tokens), config.buffer.max_tokens_per_rank)})
    spec = {"config": cfg.to_dict(), "tokens": tokens, "repeats": repeats, "warmup": warmup, "seed": seed}
    ranks = launch.spawn(_rank, world_size, (spec,), env=deepep.rank_env(world_size, mps_share, config.backend),
                         timeout_s=600)
    return ranks[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="symmoe tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--world-size", type=parse_world_size, default=2)
    ap.add_argument("--tokens", default="512,4096")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--mps-share", choices=deepep.MPS_SHARES, default="auto")
    ap.add_argument("--out", default="", help="YAML of the best config (default: printed)")
    ap.add_argument("--json", default="", help="every candidate's times")
    args = ap.parse_args(argv)
    cfg = load(args.config)
    if cfg.backend == "host":
        print("symmoe tune: the host backend has no launch settings to tune; name a GPU backend's config",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("symmoe tune: needs a CUDA GPU (it times the kernels on this machine)", file=sys.stderr)
        return 2
    tokens = [int(t) for t in args.tokens.split(",")]
    res = tune(cfg, args.world_size, tokens, args.repeats, mps_share=args.mps_share)
    best = from_dict(res["best"]).replace(**{"buffer.max_tokens_per_rank": cfg.buffer.max_tokens_per_rank})
    for t in res["tried"]:
        s = "refused: " + t["refused"] if t.get("refused") else f"score {t['score']:.3f}"
        print(f"{t['knob']:>20} = {t['value']!s:<8} {s}")
    head = (f"# symmoe tune {args.config} --world-size {args.world_size} --tokens {args.tokens} on "
            f"{torch.cuda.get_device_name(0)}, {datetime.date.today()}\n")
    text = head + best.to_yaml()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"best config written to {args.out}")
    else:
        print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
