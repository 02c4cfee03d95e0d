"""From a spec file to results on disk: resolve where it runs (GPU, or the host fallback),
start the ranks (spawned here, or the torchrun job we are in), collect, report.

Fallback rule (the README's quickstart relies on it): when a spec names a GPU backend
(torch, nvshmem, nccl) and no CUDA GPU is visible here (or ``--no-gpu``), the variants are
replaced by ``host-push`` and ``host-pull`` on the same workload, as
``spec.fallback_to_host`` defines, and the run says so on stderr, at the top of the table
and in the JSON (``fallback``). ``--no-fallback`` makes it an error instead. With a GPU
present, a GPU backend that cannot run (library missing) is an error naming the variant
and the reason: it never falls back silently.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import launch
from ..backends import probe
from . import report
from .runner import Job, describe_problem, rank_main
from .spec import Spec, SpecError, check_world, fallback_to_host, load_spec


class ABMismatch(AssertionError):
    """Variants (or the first variant and the reference) are not bitwise identical."""

    def __init__(self, message: str, problem: dict[str, Any]):
        super().__init__(message)
        self.problem = problem


@dataclass
class Options:
    out: str | None = None
    world_size: int | None = None
    ranks_per_node: int | None = None
    seed: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    tokens_per_rank: int | None = None
    timing: str | None = None
    config_set: dict[str, Any] = field(default_factory=dict)
    only: list[str] | None = None
    no_gpu: bool = False
    no_fallback: bool = False
    plot: bool = True
    progress: bool = True
    argv: list[str] | None = None


@dataclass
class Plan:
    spec: Spec
    world_size: int
    ranks_per_node: int
    notes: list[str]
    fallback: dict[str, Any] | None
    torchrun: bool
    spawn_env: dict[str, str]


def gpu_visible(no_gpu: bool = False) -> tuple[bool, str]:
    if no_gpu:
        return False, "--no-gpu was given"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return False, "no CUDA GPU is visible here: torch.cuda.is_available() is False"
    return True, f"{torch.cuda.device_count()} CUDA GPU(s) visible"


def plan(spec_path: str, opts: Options) -> Plan:
    """Load and check the spec and decide where and how it runs. Raises SpecError."""
    overrides = {"seed": opts.seed, "warmup": opts.warmup, "repeats": opts.repeats,
                 "tokens_per_rank": opts.tokens_per_rank, "timing": opts.timing}
    spec = load_spec(spec_path, overrides=overrides, config_set=opts.config_set, only=opts.only)
    notes: list[str] = []
    fb = None
    gpu, why = gpu_visible(opts.no_gpu)
    if spec.gpu_variants:
        gpu_names = ", ".join(f"'{v.name}' ({v.config.backend})" for v in spec.gpu_variants)
        if not gpu:
            if opts.no_fallback:
                raise SpecError("variants", [v.name for v in spec.gpu_variants],
                                f"GPU backends named ({gpu_names}) but {why}; --no-fallback forbids running the "
                                f"host fallback", spec.path)
            keep = tuple(k for k, v in {**overrides, "world_size": opts.world_size}.items() if v is not None)
            spec, fb = fallback_to_host(spec, why, keep)
            changes = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in fb["workload_changes"].items())
            notes.append(f"FALLBACK: {why}; the spec names GPU backend(s) for {gpu_names}. Running host push vs "
                         f"host pull (backend 'host': CPU processes over POSIX shared memory) on the same workload "
                         f"instead{f' ({changes}, per the spec fallback section)' if changes else ''}. These are CPU "
                         f"timings and say nothing about the GPU backends.")
        else:
            for v in spec.gpu_variants:
                ok, reason = probe(v.config.backend)
                if not ok:
                    raise SpecError(f"variants '{v.name}' backend", v.config.backend,
                                    f"cannot run here: {reason} (run `symmoe info`)", spec.path)
    if not spec.gpu_variants and fb is None:
        notes.append("host backend: CPU processes over POSIX shared memory, host timers; no GPU used ("
                     + ("a GPU is visible, but this spec names only host variants)" if gpu else f"{why})"))

    torchrun = launch.under_torchrun()
    if torchrun:
        W = int(os.environ["WORLD_SIZE"])
        if opts.world_size is not None and opts.world_size != W:
            raise SpecError("--world-size", opts.world_size, f"this torchrun job has {W} ranks", spec.path)
    elif opts.world_size is not None:
        W = opts.world_size
    elif spec.world_size == "auto":
        W = torch.cuda.device_count() if spec.gpu_variants else 2
    elif spec.world_size is None:
        replay = spec.workload.make_routing().replay
        W = int(replay.shape[0]) if replay is not None else 2
    else:
        W = int(spec.world_size)
    if W < 1:
        raise SpecError("--world-size", W, "must be >= 1", spec.path)
    check_world(spec, W)

    rpn = opts.ranks_per_node if opts.ranks_per_node is not None else spec.ranks_per_node
    if not rpn:
        rpn = int(os.environ.get("LOCAL_WORLD_SIZE", W)) if torchrun else W
    if rpn < 1:
        raise SpecError("--ranks-per-node", rpn, "must be >= 1", spec.path)

    env: dict[str, str] = {}
    if not torchrun and spec.gpu_variants and W > max(torch.cuda.device_count(), 1):
        share = launch.mps_share(W)
        env["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
        notes.append(f"{W} ranks share {torch.cuda.device_count()} GPU(s), each with an MPS active thread "
                     f"percentage of {share} whatever its backend (start the CUDA MPS daemon for concurrent "
                     f"kernels; nccl refuses two ranks on one GPU)")
    return Plan(spec, W, min(rpn, W), notes, fb, torchrun, env)


def _spec_record(spec: Spec) -> dict[str, Any]:
    return {
        "path": spec.path, "name": spec.name, "description": spec.description,
        "workload": dataclasses.asdict(spec.workload), "workload_text": spec.workload.describe(),
        "reference": spec.reference, "fallback_section": spec.fallback,
        "variants": [{"name": v.name, "origin": v.origin, "backend": v.config.backend,
                      "protocol": v.config.effective_protocol, "x_in_buffer": v.x_in_buffer,
                      "config": v.config.to_dict(),
                      "digest": v.config.digest()} for v in spec.variants],
    }


def default_out_dir() -> str:
    return os.path.join("out", "ab-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def execute(p: Plan, opts: Options) -> dict[str, Any] | None:
    """Run the job. Returns the result record (None on torchrun ranks other than 0).
    Raises ABMismatch when outputs differ, launch.RankFailed when a rank fails."""
    job = Job(p.spec, p.ranks_per_node, opts.progress)
    if p.torchrun:
        import torch.distributed as dist
        with launch.torchrun_group() as (rank, W):
            mine = rank_main(rank, W, job)
            ranks: list[Any] = [None] * W
            dist.all_gather_object(ranks, mine)
        if rank != 0:
            first = next((r for r in ranks if r["status"] != "ok"), None)
            if first is not None:
                raise ABMismatch(describe_problem(first["problem"], first["ranks_with_problems"]), first["problem"])
            return None
    else:
        ranks = launch.spawn(rank_main, p.world_size, args=(job,), env=p.spawn_env, timeout_s=300.0)
    result: dict[str, Any] = {
        "schema": "symmoe.ab/1",
        "status": "ok",
        "spec": _spec_record(p.spec),
        "world_size": p.world_size,
        "ranks_per_node": p.ranks_per_node,
        "launcher": "torchrun" if p.torchrun else "spawn",
        "fallback": p.fallback,
        "notes": p.notes,
        "environment": report.environment(opts.argv),
        "definitions": report.__doc__,
    }
    bad = next((r for r in ranks if r["status"] != "ok"), None)
    if bad is not None:
        result.update(status="mismatch", problem=bad["problem"], ranks_with_problems=bad["ranks_with_problems"],
                      rank_env=[r["env"] for r in ranks])
        raise ABMismatch(describe_problem(bad["problem"], bad["ranks_with_problems"]), bad["problem"]) from \
            _Record(result)
    result["rounds_checked"] = ranks[0]["rounds_checked"]
    result["ranks"] = ranks
    result["stats"] = report.analyse([v.name for v in p.spec.variants], ranks, p.spec.workload.seed)
    return result


class _Record(Exception):
    """Carries the partial result of a failed run (as ``__cause__`` of ABMismatch)."""

    def __init__(self, result: dict[str, Any]):
        super().__init__("partial result")
        self.result = result


def write_outputs(result: dict[str, Any], out_dir: str, plot: bool = True) -> dict[str, str]:
    """Write table.md, results.json and plot.png; returns {kind: path} and notes skips."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json")}
    if result.get("status") == "ok":
        result["plot"] = None
        if plot:
            png = os.path.join(out_dir, "plot.png")
            skipped = report.plot(result, png)
            if skipped:
                result.setdefault("notes", []).append(skipped)
            else:
                paths["plot"] = result["plot"] = png
        paths["table"] = os.path.join(out_dir, "table.md")
        with open(paths["table"], "w") as f:
            f.write(report.markdown(result))
    report.write_json(result, paths["json"])
    return paths


def partial_result(e: BaseException) -> dict[str, Any] | None:
    c = e.__cause__
    return c.result if isinstance(c, _Record) else None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
