"""The ``symmoe`` command: info, config check, size, build, check, bench, tune, ab."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .config import load, parse_key_value, parse_world_size
from .errors import BackendUnavailable, SymmoeError


def _versions() -> dict[str, str]:
    import torch
    out = {"torch": torch.__version__, "cuda_available": str(torch.cuda.is_available())}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    for mod, attr in (("nvshmem.core", "__version__"), ("nccl", "__version__")):
        try:
            m = importlib.import_module(mod)
            out[mod.split(".")[0] + "4py"] = str(getattr(m, attr, "installed"))
        except Exception:
            pass
    return out


def cmd_info(args: argparse.Namespace) -> int:
    from .backends import BACKENDS, probe
    for k, v in _versions().items():
        print(f"{k:>16}: {v}")
    print()
    print(f"{'backend':<9} {'protocols':<11} {'status':<10} detail")
    for name, info in BACKENDS.items():
        ok, reason = probe(name)
        detail = reason
        if ok:
            cls = info.load()
            extra = getattr(cls, "describe_transports", None)
            detail = f"modelled on {info.modelled_on}" + (f"; {extra()}" if extra else "")
        print(f"{name:<9} {'/'.join(info.protocols):<11} {'usable' if ok else 'unusable':<10} {detail}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """Each file: valid, with its effective config, or its error; 1 when any is invalid."""
    status = 0
    for path in args.files:
        try:
            cfg = load(path)
        except SymmoeError as e:
            print(f"symmoe: error: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"# {path}: valid; effective config (digest {cfg.digest()})")
        print(cfg.to_yaml(), end="")
    return status


def cmd_config_docs(args: argparse.Namespace) -> int:
    """The config reference in Markdown (docs/config.md), from the config's dataclasses."""
    from .config import reference_markdown
    print(reference_markdown(), end="")
    return 0


def cmd_size(args: argparse.Namespace) -> int:
    from .buffer import Buffer
    cfg = load(args.file)
    total = Buffer.size_hint(cfg, args.world_size)
    lay = cfg.layout(args.world_size)
    print(f"# {args.file} at world size {args.world_size}: bytes per rank")
    print(f"{'region':<8} {'offset':>14} {'bytes':>14} {'MiB':>10}")
    for name, off, n in lay.describe():
        print(f"{name:<8} {off:>14} {n:>14} {n / 2**20:>10.2f}")
    print(f"{'total':<8} {'':>14} {total:>14} {total / 2**20:>10.2f}")
    print(f"# recv: a pool of {lay.pool_rows} rows ({cfg.backend}/{cfg.effective_protocol}); a rank receives at most "
          f"{lay.recv_rows} rows (buffer.recv_capacity, 0: the worst case), in tensors outside this buffer")
    if cfg.backend == "nvshmem":
        stage = lay.stage_bytes
        print(f"# nvshmem with a peer reached only by puts (another node): another {stage} bytes "
              f"({stage / 2**20:.2f} MiB) of symmetric memory, where combine stages its input")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from . import build
    for name, path in build.build_all(force=args.force).items():
        print(f"built {name}: {path}")
    return 0


def _bench_rank(rank: int, world_size: int, config: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    import torch

    from .buffer import Buffer
    from .config import from_dict
    from .layout import DTYPES
    from .progress import Progress
    from .bench.timing import repeat
    from .workload import Routing, make_inputs

    cfg = from_dict(config)
    b = cfg.buffer
    device = torch.device("cpu")  # the host backend; GPU backends go through symmoe.bench
    tokens = opts["tokens"] or b.max_tokens_per_rank
    inputs = make_inputs(Routing(opts["routing"]), num_tokens=tokens, hidden=b.hidden, topk=b.topk,
                         num_experts=b.num_experts, world_size=world_size, dtype=DTYPES[b.dtype], seed=opts["seed"],
                         device=device)[rank]
    layout = opts["layout"] or b.output_layout
    bar = Progress(2 * (opts["warmup"] + opts["repeats"]), f"bench {cfg.backend}/{cfg.effective_protocol}",
                   enabled=rank == 0)
    with Buffer(None, cfg) as buf:
        state: dict[str, Any] = {}

        def dispatch() -> None:
            state["out"] = buf.dispatch(inputs.x, inputs.topk_idx, inputs.topk_weights, output_layout=layout)
            bar.update()

        def combine() -> None:
            rx, _, _, _, handle, _ = state["out"]
            buf.combine(rx, handle)
            bar.update()

        d = repeat(dispatch, device, opts["warmup"], opts["repeats"])
        c = repeat(combine, device, opts["warmup"], opts["repeats"])
        rows = state["out"][0].shape[0]
    row_bytes = b.hidden * DTYPES[b.dtype].itemsize
    return {"rank": rank, "recv_rows": rows, "bytes": rows * row_bytes,
            "dispatch": d.summary(), "combine": c.summary()}


def require_gpu(cfg: Any) -> None:
    """A GPU backend's config meets a machine without a CUDA GPU: BackendUnavailable naming it."""
    import torch
    if cfg.backend != "host" and not torch.cuda.is_available():
        where = f"{cfg.source}: " if cfg.source else ""
        raise BackendUnavailable(f"{where}backend '{cfg.backend}' needs a CUDA GPU and none is visible here; "
                                 "use a host config (configs/host.yaml)")


def _command() -> str:
    return " ".join(["symmoe", *sys.argv[1:]])


def cmd_bench(args: argparse.Namespace) -> int:
    from . import launch
    from .config import check_world_size
    cfg = load(args.config)
    if args.against == "deepep":
        return _bench_against_deepep(cfg, args)
    check_world_size(cfg, args.world_size)
    if cfg.backend != "host":
        return _bench_gpu(cfg, args)
    opts = {"tokens": args.tokens, "routing": args.routing, "seed": args.seed, "warmup": args.warmup,
            "repeats": args.repeats, "layout": args.layout}
    if launch.under_torchrun():
        import torch.distributed as dist
        with launch.torchrun_group() as (rank, world):
            results = [None] * world
            dist.all_gather_object(results, _bench_rank(rank, world, cfg.to_dict(), opts))
        if rank != 0:
            return 0
    else:
        results = launch.spawn(_bench_rank, args.world_size, args=(cfg.to_dict(), opts))
    print(f"# {args.config}: backend {cfg.backend}, protocol {cfg.effective_protocol}, "
          f"world size {len(results)}, layout {opts['layout'] or cfg.buffer.output_layout}, routing {args.routing}")
    print(f"{'rank':>4} {'rows':>8} {'MB':>9} {'dispatch us':>12} {'GB/s':>8} {'combine us':>11} {'GB/s':>8}")
    for r in results:
        dm, cm = r["dispatch"]["median_s"], r["combine"]["median_s"]
        print(f"{r['rank']:>4} {r['recv_rows']:>8} {r['bytes'] / 1e6:>9.2f} {dm * 1e6:>12.1f} "
              f"{r['bytes'] / dm / 1e9:>8.2f} {cm * 1e6:>11.1f} {r['bytes'] / cm / 1e9:>8.2f}")
    if args.json:
        from .bench.gpu import provenance
        with open(args.json, "w") as f:
            json.dump({**provenance(_command()), "config": cfg.to_dict(), "options": opts, "ranks": results}, f,
                      indent=1)
    return 0


def _check_rank(rank: int, world_size: int, configs: list[dict[str, Any]], seed: int, repeats: int,
                x_in_buffer: bool = False, cached: bool = False) -> list[tuple[int, int]]:
    """Per config: (cases checked, cached dispatches checked)."""
    from .launch import local_gpu
    from .testing import check_cached_dispatch, check_dispatch_combine
    counts = []
    for config in configs:
        device = "cpu"
        if config["backend"] != "host":
            local_gpu(rank)
            device = "cuda"
        n = check_dispatch_combine(rank, world_size, config, seed, device=device, repeats=repeats,
                                   x_in_buffer=x_in_buffer)
        nc = check_cached_dispatch(rank, world_size, config, seed + 1, device=device,
                                   x_in_buffer=x_in_buffer) if cached else 0
        counts.append((n, nc))
    return counts


def cmd_check(args: argparse.Namespace) -> int:
    """Every config's dispatch + combine, bitwise against symmoe.reference (so the configs
    also agree with each other), on fresh random routings of every kind, both layouts."""
    import random

    from . import launch
    from .config import check_world_size
    from .testing import CHECK_ROUTINGS
    sets = dict(args.set)
    cfgs = [load(path).replace(**sets) if sets else load(path) for path in args.configs]
    for cfg in cfgs:
        require_gpu(cfg)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    if launch.under_torchrun():
        import torch.distributed as dist
        with launch.torchrun_group(timeout_s=600.0) as (rank, world):
            for cfg in cfgs:
                check_world_size(cfg, world)
            box = [seed]
            dist.broadcast_object_list(box, src=0)  # every rank must draw the same inputs
            seed = box[0]
            mine = _check_rank(rank, world, [c.to_dict() for c in cfgs], seed, args.repeats, args.x_in_buffer,
                               args.cached)
            every = [None] * world
            dist.all_gather_object(every, mine)
        if rank != 0:
            return 0
    else:
        world = args.world_size
        for cfg in cfgs:
            check_world_size(cfg, world)
        every = launch.spawn(_check_rank, world, args=([c.to_dict() for c in cfgs], seed, args.repeats,
                                                      args.x_in_buffer, args.cached), timeout_s=600.0)
    for i, path in enumerate(args.configs):
        cases, cached = every[0][i]
        where = ", x built in Buffer.input_view" if args.x_in_buffer else ""
        also = f"; cached dispatch (handle=...): {cached} cases" if args.cached else ""
        print(f"{path}: {cfgs[i].backend}/{cfgs[i].effective_protocol} bitwise equal to symmoe.reference on every "
              f"one of {world} ranks: {cases} cases ({len(CHECK_ROUTINGS)} routings x 2 layouts x {args.repeats}{where})"
              f"{also}")
    print(f"seed {seed} (replay: --seed {seed})")
    return 0


def _bench_against_deepep(cfg: Any, args: argparse.Namespace) -> int:
    """``symmoe bench CONFIG --against deepep``: ``symmoe.bench.deepep`` with this config."""
    from .bench import deepep
    require_gpu(cfg)
    argv = ["--world-sizes", str(args.world_size) if args.world_size > 1 else "2,4",
            "--tokens", str(args.tokens) if args.tokens else "128,512,1024,4096,8192",
            "--config", f"{Path(args.config).stem}={args.config}", "--repeats", str(args.repeats),
            "--seed", str(args.seed)]
    argv += ["--json", args.json] if args.json else []
    argv += ["--md", args.md] if args.md else []
    return deepep.main(argv)


def cmd_tune(args: argparse.Namespace) -> int:
    from .bench import tune
    cfg = load(args.config)
    if cfg.backend == "host":
        raise SymmoeError(f"{args.config}: the host backend has no launch settings to tune; name a GPU backend's config")
    require_gpu(cfg)
    argv = [args.config, "--world-size", str(args.world_size), "--tokens", args.tokens, "--repeats", str(args.repeats)]
    argv += ["--out", args.out] if args.out else []
    argv += ["--json", args.json] if args.json else []
    return tune.main(argv)


def _bench_gpu(cfg: Any, args: argparse.Namespace) -> int:
    """GPU backends: ``symmoe.bench.gpu`` (CUDA events, copy roofline and plain torch in the same run)."""
    from .bench import gpu as bench
    require_gpu(cfg)
    if args.routing != "uniform":
        print("symmoe: note: GPU benchmarks use uniform routing (the DeepSeek-V3 benchmark shape)", file=sys.stderr)
    layouts = (args.layout,) if args.layout else ("rank", "expert")
    result = bench.run_gpu_bench(cfg, args.world_size, args.tokens, args.warmup, args.repeats, layouts=layouts,
                                 seed=args.seed, baselines=args.world_size == 1)
    print(f"# {args.config}: backend {cfg.backend}, protocol {cfg.effective_protocol}, world size {args.world_size}")
    print(bench.table([result]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**bench.provenance(_command()), "results": [result]}, f, indent=1)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="symmoe", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="which backends are usable here, and why not").set_defaults(fn=cmd_info)

    cfg = sub.add_parser("config", help="config files").add_subparsers(dest="config_cmd", required=True)
    chk = cfg.add_parser("check", help="validate configs and print each effective config")
    chk.add_argument("files", nargs="+", metavar="file")
    chk.set_defaults(fn=cmd_config_check)
    cfg.add_parser("docs", help="print the config reference (docs/config.md) in Markdown").set_defaults(fn=cmd_config_docs)

    size = sub.add_parser("size", help="bytes per region of the symmetric buffer for a config")
    size.add_argument("file")
    size.add_argument("--world-size", type=parse_world_size, default=1)
    size.set_defaults(fn=cmd_size)

    build = sub.add_parser("build", help="compile the CUDA extensions now (otherwise built on first use)")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.set_defaults(fn=cmd_build)

    check = sub.add_parser("check", help="dispatch + combine of each config, bitwise against symmoe.reference")
    check.add_argument("configs", nargs="+")
    check.add_argument("--world-size", type=parse_world_size, default=1,
                       help="local ranks to spawn (ignored under torchrun)")
    check.add_argument("--set", action="append", type=parse_key_value, default=[], metavar="KEY=VALUE",
                       help="config value for every config, e.g. --set buffer.max_tokens_per_rank=256 (repeatable)")
    check.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed for replay")
    check.add_argument("--repeats", type=int, default=1, help="calls per (routing, layout)")
    check.add_argument("--x-in-buffer", action="store_true",
                       help="build x in Buffer.input_view and dispatch it from there (checks it stays intact)")
    check.add_argument("--cached", action="store_true",
                       help="also dispatch new x along each routing with its handle, after other dispatches")
    check.set_defaults(fn=cmd_check)

    bench = sub.add_parser("bench", help="time dispatch and combine for a config")
    bench.add_argument("config")
    bench.add_argument("--world-size", type=parse_world_size, default=1,
                       help="local ranks to spawn (host backend: ignored under torchrun)")
    bench.add_argument("--tokens", type=int, default=0, help="tokens per rank (default: buffer.max_tokens_per_rank)")
    bench.add_argument("--routing", default="uniform")
    bench.add_argument("--layout", choices=["rank", "expert"], default=None)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--warmup", type=int, default=5)
    bench.add_argument("--repeats", type=int, default=30)
    bench.add_argument("--json", default=None, help="write every rank's numbers here")
    bench.add_argument("--against", choices=["deepep"], default=None,
                       help="side by side with DeepEP V1 in one job (symmoe.bench.deepep; W=2,4 unless --world-size, "
                            "128..8192 tokens per rank unless --tokens)")
    bench.add_argument("--md", default=None, help="with --against: the Markdown table here")
    bench.set_defaults(fn=cmd_bench)

    tune = sub.add_parser("tune", help="time launch settings on this machine and write the best as a config")
    tune.add_argument("config")
    tune.add_argument("--world-size", type=parse_world_size, default=2)
    tune.add_argument("--tokens", default="512,4096", help="tokens per rank, comma list")
    tune.add_argument("--repeats", type=int, default=10)
    tune.add_argument("--out", default=None, help="YAML of the best config (default: printed)")
    tune.add_argument("--json", default=None, help="every candidate's times")
    tune.set_defaults(fn=cmd_tune)

    try:
        from .ab import cli as ab_cli
    except ImportError:
        ab_cli = None
    if ab_cli is not None:
        ab = sub.add_parser("ab", help="A/B comparison of configs on one seeded workload")
        ab_cli.add_arguments(ab)
        ab.set_defaults(fn=ab_cli.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except SymmoeError as e:
        print(f"symmoe: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        from .launch import RankFailed
        if isinstance(e, RankFailed):
            print(f"symmoe: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
