"""``symmoe ab SPEC.yaml``: compare backend configs on one seeded workload.

Wired into the ``symmoe`` command as ``ab``: ``add_arguments(parser)`` adds the options,
``run(args)`` runs and returns the exit status (0 ok, 1 a rank failed, 2 invalid spec or
options, 3 outputs not bitwise identical). Also runnable as ``python -m symmoe.ab``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


from ..config import parse_key_value, parse_world_size
from ..errors import SymmoeError
from ..launch import RankFailed
from . import driver, report
from .driver import ABMismatch, Options

EXIT_OK, EXIT_RANK_FAILED, EXIT_SPEC, EXIT_MISMATCH = 0, 1, 2, 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run one seeded workload through two or more configs in one job (interleaved A B A B), "
                     "check their outputs are bitwise identical, time dispatch and combine, and write a "
                     "Markdown table, JSON and a PNG plot. Without a GPU, specs naming GPU backends fall back "
                     "to host push vs host pull (said so in the output).")
    p.add_argument("spec", help="A/B spec YAML (see configs/ab/)")
    p.add_argument("--out", default=None, help="output folder (default: out/ab-<timestamp>)")
    p.add_argument("--world-size", type=parse_world_size, default=None,
                   help="ranks to spawn here (default: the spec's world_size); under torchrun: the job's")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks per node for intra-node vs network bytes (default: the spec's; 0 = all on one node)")
    p.add_argument("--seed", type=int, default=None, help="override workload.seed")
    p.add_argument("--warmup", type=int, default=None, help="override workload.warmup")
    p.add_argument("--repeats", type=int, default=None, help="override workload.repeats")
    p.add_argument("--tokens-per-rank", type=int, default=None, help="override workload.tokens_per_rank")
    p.add_argument("--timing", default=None, metavar="call|device",
                   help="override workload.timing: a GPU call's time with the GPU idle before it (call), or "
                        "queued behind a 1 ms sleep so the host's launch work is hidden (device)")
    p.add_argument("--set", dest="config_set", action="append", type=parse_key_value, default=[], metavar="KEY=VALUE",
                   help="change a dotted config key in every variant (repeatable), e.g. --set kernel.timeout_s=60")
    p.add_argument("--variants", default=None, metavar="A,B,...",
                   help="run only these variants of the spec (two or more, by name)")
    p.add_argument("--no-gpu", action="store_true", help="behave as if no GPU were visible (the fallback applies)")
    p.add_argument("--no-fallback", action="store_true",
                   help="fail instead of falling back to the host backend when GPU variants meet no GPU")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _options(args: argparse.Namespace, argv: Sequence[str] | None) -> Options:
    return Options(out=args.out, world_size=args.world_size, ranks_per_node=args.ranks_per_node, seed=args.seed,
                   warmup=args.warmup, repeats=args.repeats, tokens_per_rank=args.tokens_per_rank,
                   timing=args.timing,
                   config_set=dict(args.config_set),
                   only=[n.strip() for n in args.variants.split(",") if n.strip()] if args.variants else None,
                   no_gpu=args.no_gpu, no_fallback=args.no_fallback,
                   plot=not args.no_plot, progress=not args.quiet,
                   argv=list(argv) if argv is not None else None)


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    opts = _options(args, argv if argv is not None else sys.argv)
    try:
        p = driver.plan(args.spec, opts)
    except SymmoeError as e:
        print(f"symmoe ab: error: {e}", file=sys.stderr)
        return EXIT_SPEC
    lead = p.torchrun is False or _rank() == 0
    if lead:
        for note in p.notes:
            driver.log(f"symmoe ab: {note}")
        names = ", ".join(f"{v.name} ({v.config.backend}/{v.config.effective_protocol})" for v in p.spec.variants)
        driver.log(f"symmoe ab: {p.spec.name}: {names}; world size {p.world_size}; {p.spec.workload.describe()}")
    out_dir = opts.out or driver.default_out_dir()
    try:
        result = driver.execute(p, opts)
    except ABMismatch as e:
        if lead:
            print(f"symmoe ab: error: {e}", file=sys.stderr)
            partial = driver.partial_result(e)
            if partial is not None:
                paths = driver.write_outputs(partial, out_dir, plot=False)
                print(f"symmoe ab: the run stopped; details in {paths['json']}", file=sys.stderr)
        return EXIT_MISMATCH
    except RankFailed as e:  # spawned ranks: every rank's error, in one message
        print(f"symmoe ab: error: {e}", file=sys.stderr)
        return EXIT_RANK_FAILED
    except SymmoeError as e:  # under torchrun each rank reports its own
        where = f"rank {_rank()}: " if p.torchrun else ""
        print(f"symmoe ab: error: {where}{e}", file=sys.stderr)
        return EXIT_RANK_FAILED
    if result is None:  # a torchrun rank other than 0
        return EXIT_OK
    paths = driver.write_outputs(result, out_dir, plot=opts.plot)
    sys.stdout.write(report.markdown(result))
    sys.stdout.flush()
    for note in result.get("notes", []):
        if note.startswith("plot skipped"):
            driver.log(f"symmoe ab: {note}")
    driver.log("symmoe ab: wrote " + ", ".join(paths[k] for k in ("table", "json", "plot") if k in paths))
    return EXIT_OK


def _rank() -> int:
    import os
    return int(os.environ.get("RANK", "0"))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="symmoe ab")
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args, ["symmoe", "ab", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
