"""Statistics and outputs of an A/B run: Markdown table, JSON with every sample and the
environment, PNG plot.

Definitions (also written into the JSON under ``definitions``):

* per rank: median, p10, p90 of that rank's timed samples; GB/s = the rank's received
  bytes / its median time (intra-node and network bytes separately).
* per variant: the *step time* of repeat i is the slowest rank's time in repeat i (a
  dispatch is done when every rank is done); median, p10, p90 over repeats. GB/s is the
  mean over ranks of the per-rank GB/s.
* ratio: a variant's median step time / the first variant's; 95% CI by a paired
  bootstrap over repeat indices (repeats run interleaved, so repeat i of every variant
  saw the same conditions), seeded with the workload seed.
"""
from __future__ import annotations

import datetime
import getpass
import importlib
import importlib.metadata as md
import json
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
from typing import Any

from ..bench.ops import LABEL, ops_of
from ..bench.timing import Samples
BOOTSTRAP_RESAMPLES = 2000


# -- statistics -------------------------------------------------------------------------------
def summary(xs: list[float]) -> dict[str, float]:
    s = Samples(list(xs))
    return {"median": s.median, "p10": s.quantile(0.1), "p90": s.quantile(0.9), "n": len(xs)}


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def bootstrap_ratio(a: list[float], b: list[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES,
                    level: float = 0.95) -> dict[str, float]:
    """median(a) / median(b) and its ``level`` CI, resampling paired repeat indices."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if n == 0 or min(b) <= 0:
        nan = float("nan")
        return {"value": nan, "ci_low": nan, "ci_high": nan, "level": level, "resamples": 0}
    value = _median(a) / _median(b)
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        ratios.append(_median([a[i] for i in pick]) / _median([b[i] for i in pick]))
    lo = Samples(ratios).quantile((1 - level) / 2)
    hi = Samples(ratios).quantile(1 - (1 - level) / 2)
    return {"value": value, "ci_low": lo, "ci_high": hi, "level": level, "resamples": resamples}


def _of_dispatches(ops: dict[str, Any]) -> str:
    """Which dispatches the bitwise line covers, when there is more than one."""
    kinds = [LABEL[op] for op in ("dispatch", "worst_dispatch", "cached_dispatch") if op in ops]
    if len(kinds) < 2:
        return ""
    return "(of " + ", of ".join(kinds[:-1]) + " and of " + kinds[-1] + ") "


def analyse(names: list[str], ranks: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """Per variant and op: per-rank stats, step-time stats, bandwidth, ratio to the first."""
    out: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {}
        for op in ops_of(ranks[0]["samples"][name]):
            per_rank = []
            for r in ranks:
                xs = r["samples"][name][op]
                st = summary(xs)
                b = r["bytes"]
                med = st["median"]
                per_rank.append({"rank": r["rank"], **st,
                                 "gbps": b["total_bytes"] / med / 1e9 if med > 0 else None,
                                 "intra_node_gbps": b["intra_node_bytes"] / med / 1e9 if med > 0 else None,
                                 "network_gbps": b["network_bytes"] / med / 1e9 if med > 0 else None})
            n = min(len(r["samples"][name][op]) for r in ranks)
            steps = [max(r["samples"][name][op][i] for r in ranks) for i in range(n)]

            def mean(key: str) -> float | None:
                vals = [p[key] for p in per_rank if p[key] is not None]
                return sum(vals) / len(vals) if vals else None

            entry[op] = {"per_rank": per_rank, "step": summary(steps), "step_samples": steps,
                         "gbps": mean("gbps"), "intra_node_gbps": mean("intra_node_gbps"),
                         "network_gbps": mean("network_gbps")}
        out[name] = entry
    first = names[0]
    for name in names:
        for op in out[name]:
            out[name][op]["ratio_to_first"] = bootstrap_ratio(out[name][op]["step_samples"],
                                                              out[first][op]["step_samples"], seed)
    return out


# -- environment ------------------------------------------------------------------------------
def _version(dist_name: str) -> str | None:
    try:
        return md.version(dist_name)
    except md.PackageNotFoundError:
        return None


def _git(args: list[str]) -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def environment(argv: list[str] | None = None) -> dict[str, Any]:
    import torch
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "user": _safe(getpass.getuser),
        "command": shlex.join(argv if argv is not None else sys.argv),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "git_commit": os.environ.get("SYMMOE_COMMIT") or _git(["rev-parse", "HEAD"]),  # SYMMOE_COMMIT: copies without .git
        "git_dirty": None,
    }
    status = _git(["status", "--porcelain", "--untracked-files=no"])
    env["git_dirty"] = bool(status) if status is not None else None
    try:
        import symmoe
        env["symmoe"] = symmoe.__version__
    except Exception:  # noqa: BLE001
        pass
    libs = {}
    for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nccl4py", "nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12",
              "nvshmem4py-cu13", "nvshmem4py-cu12", "cuda-core", "cuda-bindings", "numpy", "matplotlib"):
        v = _version(d)
        if v:
            libs[d] = v
    env["packages"] = libs
    env["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            env["nccl_torch"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        env["driver"] = _driver_version()
    for mod, key in (("nvshmem.core", "nvshmem4py"), ("nccl", "nccl4py")):
        try:
            m = importlib.import_module(mod)
            env[key] = str(getattr(m, "__version__", "installed"))
        except Exception:  # noqa: BLE001 -- optional libraries
            pass
    return env


def _safe(fn) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


def _driver_version() -> str | None:
    try:
        import pynvml  # type: ignore
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


# -- Markdown ---------------------------------------------------------------------------------
def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ratio(r: dict[str, float], first: bool) -> str:
    if first:
        return "1 (base)"
    return f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def markdown(result: dict[str, Any]) -> str:
    spec, stats, ranks = result["spec"], result["stats"], result["ranks"]
    names = [v["name"] for v in spec["variants"]]
    wl = spec["workload"]
    timer = "CUDA events" if any(r.get("timer") == "cuda-events" for r in ranks) else "host perf_counter"
    lines = [f"## symmoe ab: {spec['name']}", ""]
    for note in result.get("notes", []):
        lines.append(f"> {note}")
    if result.get("notes"):
        lines.append("")
    lines += [
        f"world size {result['world_size']} ({result['ranks_per_node']} ranks per node), {spec['workload_text']}; "
        f"{wl['warmup']} warm-up + {wl['repeats']} timed rounds, interleaved; timer: {timer}"
        + ("; L2 flushed before each call" if timer == "CUDA events" else "")
        + (("; each call queued behind a 1 ms sleep (the host's launch work hidden)" if wl.get("timing") == "device"
            else "; the GPU idle before each call (the host's launch work included)") if timer == "CUDA events" else ""),
        "",
        "**bitwise:** every variant's recv_x, recv_topk_idx, recv_topk_weights, per-expert counts "
        + _of_dispatches(stats[names[0]])
        + f"and combined output identical on every rank in all {result['rounds_checked']} rounds"
        + (" (first variant also equal to symmoe.reference)" if spec["reference"] else ""),
        "",
        "Latency: median [p10, p90] of the per-repeat slowest rank, µs. GB/s: received-row bytes / median, "
        "mean over ranks (intra-node / network). vs first: ratio of medians [95% bootstrap CI]; < 1 is faster.",
        "",
    ]
    ops = list(stats[names[0]])
    lines += ["| variant | backend/protocol | " + " | ".join(
                  f"{LABEL[op]} µs | {LABEL[op]} GB/s (intra / net) | {LABEL[op]} vs first" for op in ops) + " |",
              "|---|---|" + "---|" * (3 * len(ops))]
    for i, name in enumerate(names):
        v = spec["variants"][i]
        cells = [name, f"{v['backend']}/{v['protocol']}" + (" (x in buffer)" if v.get("x_in_buffer") else "")]
        for op in ops:
            s = stats[name][op]
            st = s["step"]
            cells += [f"{_us(st['median'])} [{_us(st['p10'])}, {_us(st['p90'])}]",
                      f"{_gb(s['gbps'])} ({_gb(s['intra_node_gbps'])} / {_gb(s['network_gbps'])})",
                      _ratio(s["ratio_to_first"], i == 0)]
        lines.append("| " + " | ".join(cells) + " |")
    if "cached_dispatch" in ops:
        lines += ["", "cached dispatch: dispatch(x, handle=...) along the routing of the dispatch before it "
                      "(the backward pass's dispatch: no routing, no host wait on the GPU backends)."]
    if "worst_dispatch" in ops:
        lines += ["", "worst dispatch: dispatch(..., num_worst_tokens=W * T), DeepEP's worst-case outputs "
                      "(the received rows, then x 0, expert ids -1, weights 0; no host wait on the GPU backends)."]
    lines += ["", "Per rank: median [p10, p90] µs, GB/s.", "",
              "| variant | rank | recv rows | " + " | ".join(f"{LABEL[op]} µs | {LABEL[op]} GB/s" for op in ops) + " |",
              "|---|---|---|" + "---|" * (2 * len(ops))]
    for name in names:
        for j, r in enumerate(ranks):
            cells = [name, str(r["rank"]), str(r["bytes"]["rows"])]
            for op in ops:
                d = stats[name][op]["per_rank"][j]
                cells += [f"{_us(d['median'])} [{_us(d['p10'])}, {_us(d['p90'])}]", _gb(d["gbps"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- plot -------------------------------------------------------------------------------------
def plot_labels(result: dict[str, Any]) -> dict[str, Any]:
    """What the plot says, apart from the numbers: ``title``, ``intra_label`` (what carried the
    bytes within a node: NVLink between GPUs, or shared memory between the host backend's CPU
    processes) and ``network_label`` (None when no byte went over the network: no network bars)."""
    spec, ranks = result["spec"], result.get("ranks", [])
    backends = {v["backend"] for v in spec["variants"]}
    shm = "shared memory (CPU processes)"
    if backends == {"host"}:
        intra = shm
    elif "host" in backends:
        intra = f"intra-node (NVLink; host backend: {shm})"
    else:
        intra = "intra-node (NVLink)"
    network = any(r["bytes"]["network_bytes"] for r in ranks)
    title = f"symmoe ab {spec['name']}: {spec['workload_text']}, world size {result['world_size']}"
    fb = result.get("fallback")
    if fb:
        title += (f"\nFALLBACK to the host backend ({', '.join(fb['with'])}: CPU processes over shared memory; "
                  f"{fb['reason']}): CPU timings, nothing about the GPU backends")
    return {"title": title, "intra_label": intra, "network_label": "network" if network else None}


def plot(result: dict[str, Any], path: str) -> str | None:
    """Write the PNG; returns None, or why it was skipped."""
    try:
        import matplotlib
    except ImportError:
        return ("plot skipped: matplotlib is not installed (optional extra: pip install 'symmoe[plot]'); "
                "the table and the JSON were written")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, stats, ranks = result["spec"], result["stats"], result["ranks"]
    names = [v["name"] for v in spec["variants"]]
    ops = list(stats[names[0]])
    labels = plot_labels(result)
    fig, axes = plt.subplots(2, len(ops), figsize=(6 * len(ops), 8), squeeze=False)
    for col, op in enumerate(ops):
        ax = axes[0][col]
        data = [[s * 1e6 for s in stats[n][op]["step_samples"]] for n in names]
        ax.boxplot(data, whis=(10, 90), showfliers=True)
        for i, d in enumerate(data):  # every repeat, jittered
            xs = [i + 1 + 0.25 * ((k * 0.618) % 1 - 0.5) for k in range(len(d))]
            ax.scatter(xs, d, s=6, alpha=0.4)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=15)
        ax.set_ylabel("µs (slowest rank per repeat)")
        ax.set_title(f"{LABEL[op]} latency")
        ax = axes[1][col]
        # GB/s of every (rank, repeat) sample
        gb = []
        for n in names:
            vals = []
            for j, r in enumerate(ranks):
                b = r["bytes"]["total_bytes"]
                vals += [b / s / 1e9 for s in r["samples"][n][op] if s > 0]
            gb.append(vals)
        xs = list(range(1, len(names) + 1))
        intra = [stats[n][op]["intra_node_gbps"] or 0.0 for n in names]
        net = [stats[n][op]["network_gbps"] or 0.0 for n in names]
        ax.bar(xs, intra, alpha=0.5, label=labels["intra_label"])
        if labels["network_label"]:
            ax.bar(xs, net, bottom=intra, alpha=0.5, label=labels["network_label"])
        ax.legend(fontsize=7, loc="lower right")
        ax.boxplot(gb, whis=(10, 90), showfliers=False)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=15)
        ax.set_ylabel("GB/s per rank (received-row bytes)")
        ax.set_title(f"{LABEL[op]} bandwidth")
    fig.suptitle(labels["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_json(result: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
