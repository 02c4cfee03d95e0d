"""A/B spec files: one seeded workload and two or more variants (backend configs).

Validated like configs: every problem raises :class:`SpecError` (a ``ConfigError``) that
names the spec file, the key, the value and what is allowed. A spec looks like::

    world_size: 2            # ranks to spawn; 'auto' = one per visible GPU (2 without GPU variants);
                             # left out: the replay file's world size, else 2
    ranks_per_node: 0        # 0 = every rank on one node (LOCAL_WORLD_SIZE under torchrun)
    reference: true          # also check the first variant bitwise against symmoe.reference
    workload:
      tokens_per_rank: 256
      hidden: 1024
      topk: 8
      num_experts: 64
      dtype: bfloat16        # bfloat16 | float16 | float32
      fp8: none              # none | float32 | ue8m0: x dispatched as (e4m3, scales) of that kind
                             # (dtype bfloat16, hidden a multiple of 128; combine in bfloat16)
      output_layout: rank    # rank | expert
      expert_alignment: 1    # expert-major group padding
      routing: {kind: zipf, zipf_s: 1.2}   # or just: uniform
      seed: 0
      warmup: 3
      repeats: 20
      timing: call           # GPU: call (the GPU idle before each call) | device (queued behind a sleep)
    variants:
      - name: push
        config: ../host.yaml             # relative to this file
      - name: pull
        config: ../host.yaml
        set: {protocol: pull}            # dotted keys changed in that config
      - name: inline
        config: {backend: host, protocol: pull, buffer: {...}}
    fallback:                # optional: used when GPU variants meet a machine without a GPU
      tokens_per_rank: 256
      warmup: 1
      repeats: 5
      world_size: 2

Every variant must be sized for the workload: ``buffer.hidden``, ``buffer.topk``,
``buffer.num_experts`` and ``buffer.dtype`` equal to the workload's, and
``buffer.max_tokens_per_rank`` at least ``workload.tokens_per_rank`` (expert-major: also
``buffer.expert_alignment`` at least the workload's, unless ``buffer.recv_capacity`` is set).
The output layout and expert alignment are the workload's (passed to every call),
whatever the configs say.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import Config, check_world_size, from_dict, load, load_yaml
from ..errors import ConfigError
from ..layout import DTYPES
from ..workload import ROUTINGS, Routing, load_replay

TEST_HOOKS_ENV = "SYMMOE_AB_TEST_HOOKS"  # "1": honour the variant key `_corrupt` (tests only)

TOP_KEYS = ("name", "description", "world_size", "ranks_per_node", "reference", "workload", "variants", "fallback")
WORKLOAD_KEYS = ("tokens_per_rank", "hidden", "topk", "num_experts", "dtype", "fp8", "output_layout",
                 "expert_alignment", "routing", "seed", "warmup", "repeats", "timing")
FP8_KINDS = ("none", "float32", "ue8m0")  # workload.fp8: x as it is, or (e4m3, scales of that kind)
# What a GPU call's time covers: "call" the whole call as a user makes it with the GPU idle (the
# host's launch work included), "device" the call queued behind a 1 ms sleep kernel, as
# symmoe.bench times it (the launch work hidden; a host wait inside the call still counts).
TIMINGS = ("call", "device")
VARIANT_KEYS = ("name", "config", "set", "x_in_buffer")
FALLBACK_KEYS = ("tokens_per_rank", "warmup", "repeats", "world_size")
ROUTING_PARAMS: dict[str, tuple[str, ...]] = {
    "uniform": (), "zipf": ("zipf_s",), "group_limited": ("num_groups", "topk_groups"), "masked": ("mask_prob", "masked_tokens"),
    "empty_ranks": ("empty_ranks",), "one_expert": ("expert",), "replay": ("path",),
}
CORRUPT_KEYS = ("tensor", "rank", "row", "col", "call")
CORRUPT_CALLS = ("exact", "worst")  # `call`: only the exact calls' outputs, or only the worst-case dispatch's
# The tensors compared across variants, in the order they are compared.
TENSORS = ("recv_x", "recv_x_scales", "recv_topk_idx", "recv_topk_weights", "num_recv_tokens_per_expert", "combined_x",
           "combined_topk_weights")
# Buffer keys that must equal the workload's in every variant.
SIZED_KEYS = ("hidden", "topk", "num_experts", "dtype")


class SpecError(ConfigError):
    """An A/B spec is invalid: names the spec file, the key, the value and what is allowed."""


@dataclass(frozen=True)
class Workload:
    tokens_per_rank: int = 4096
    hidden: int = 7168
    topk: int = 8
    num_experts: int = 256
    dtype: str = "bfloat16"
    fp8: str = "none"  # FP8_KINDS
    output_layout: str = "rank"
    expert_alignment: int = 1
    routing: dict[str, Any] = field(default_factory=lambda: {"kind": "uniform"})  # kind + its parameters
    seed: int = 0
    warmup: int = 3
    repeats: int = 30
    timing: str = "call"  # TIMINGS

    def make_routing(self) -> Routing:
        """The ``symmoe.workload.Routing``; a replay file is loaded (and checked) here."""
        r = dict(self.routing)
        kind = r.pop("kind")
        if kind == "replay":
            t = load_replay(r["path"], num_tokens=self.tokens_per_rank, topk=self.topk, num_experts=self.num_experts)
            return Routing("replay", replay=t)
        if "empty_ranks" in r:
            r["empty_ranks"] = tuple(r["empty_ranks"])
        return Routing(kind, **r)

    def describe(self) -> str:
        r = dict(self.routing)
        kind = r.pop("kind")
        if kind == "replay":
            r = {"path": os.path.basename(r["path"])}
        params = ", ".join(f"{k}={v}" for k, v in r.items())
        return (f"{self.tokens_per_rank} tokens/rank, hidden {self.hidden}, top-{self.topk} of {self.num_experts} "
                f"experts, {self.dtype if self.fp8 == 'none' else f'FP8 ({self.fp8} scales)'}, {self.output_layout}-major, routing {kind}{f'({params})' if params else ''}, "
                f"seed {self.seed}")


@dataclass(frozen=True)
class Variant:
    name: str
    config: Config
    origin: str  # where its config came from: a path, or "inline"
    corrupt: dict[str, Any] | None = None  # test hook: flip one element of one output
    x_in_buffer: bool = False  # x built in Buffer.input_view (the Mega MoE way: nothing to publish)


@dataclass(frozen=True)
class Spec:
    path: str
    name: str
    workload: Workload
    variants: tuple[Variant, ...]
    world_size: int | str | None = None  # an int, "auto", or None: the replay file's, else 2
    ranks_per_node: int = 0
    reference: bool = True
    description: str = ""
    fallback: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_variants(self) -> list[Variant]:
        return [v for v in self.variants if v.config.backend != "host"]


# -- helpers -------------------------------------------------------------------------------
def _err(src: str, key: str, value: Any, allowed: str) -> SpecError:
    return SpecError(key, value, allowed, src)


def _mapping(src: str, key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _err(src, key, value, "expected a mapping of keys")
    return value


def _known(src: str, key: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for k in data:
        if k not in allowed:
            kp = f"{key}.{k}" if key else str(k)
            raise _err(src, kp, data[k], f"unknown key; allowed here: {', '.join(allowed)}")


def _int(src: str, key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(src, key, value, "expected an integer")
    if not lo <= value <= hi:
        raise _err(src, key, value, f"must be in [{lo}, {hi}]")
    return value


def _choice(src: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _err(src, key, value, f"allowed: {', '.join(choices)}")
    return value


def _routing(src: str, spec_dir: str, value: Any) -> dict[str, Any]:
    key = "workload.routing"
    if isinstance(value, str):
        value = {"kind": value}
    data = dict(_mapping(src, key, value))
    kind = _choice(src, f"{key}.kind", data.get("kind", "uniform"), ROUTINGS)
    data["kind"] = kind
    params = ROUTING_PARAMS[kind]
    _known(src, key, data, ("kind",) + params)
    defaults = Routing()
    for p in params:
        if p not in data:
            if p == "path":
                raise _err(src, f"{key}.path", None, "routing 'replay' needs path: a torch.save'd [W, T, K] topk_idx file")
            data[p] = getattr(defaults, p)
            continue
        v = data[p]
        kp = f"{key}.{p}"
        if p in ("zipf_s", "mask_prob", "masked_tokens"):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _err(src, kp, v, "expected a number")
            lo, hi = (0.0, 10.0) if p == "zipf_s" else (0.0, 1.0)
            if not lo <= v <= hi:
                raise _err(src, kp, v, f"must be in [{lo:g}, {hi:g}]")
            data[p] = float(v)
        elif p in ("num_groups", "topk_groups", "expert"):
            data[p] = _int(src, kp, v, 0 if p == "expert" else 1, 1 << 16)
        elif p == "empty_ranks":
            if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
                raise _err(src, kp, v, "expected a list of rank numbers")
            data[p] = list(v)
        elif p == "path":
            if not isinstance(v, str):
                raise _err(src, kp, v, "expected a file path (relative to the spec file)")
            full = v if os.path.isabs(v) else os.path.normpath(os.path.join(spec_dir, v))
            if not os.path.isfile(full):
                raise _err(src, kp, v, f"file not found (looked for {full})")
            data[p] = full
    return data


def _workload(src: str, spec_dir: str, data: Any) -> Workload:
    data = _mapping(src, "workload", data if data is not None else {})
    _known(src, "workload", data, WORKLOAD_KEYS)
    kw: dict[str, Any] = {}
    ranges = {"tokens_per_rank": (0, 1 << 20), "hidden": (8, 1 << 16), "topk": (1, 32), "num_experts": (1, 1 << 16),
              "expert_alignment": (1, 1024), "seed": (0, 2**31 - 1), "warmup": (0, 100_000),
              "repeats": (1, 1_000_000)}
    for k, (lo, hi) in ranges.items():
        if k in data:
            kw[k] = _int(src, f"workload.{k}", data[k], lo, hi)
    if "dtype" in data:
        kw["dtype"] = _choice(src, "workload.dtype", data["dtype"], tuple(DTYPES))
    if "fp8" in data:
        kw["fp8"] = _choice(src, "workload.fp8", data["fp8"], FP8_KINDS)
    if "output_layout" in data:
        kw["output_layout"] = _choice(src, "workload.output_layout", data["output_layout"], ("rank", "expert"))
    if "timing" in data:
        kw["timing"] = _choice(src, "workload.timing", data["timing"], TIMINGS)
    kw["routing"] = _routing(src, spec_dir, data.get("routing", "uniform"))
    w = Workload(**kw)
    if w.hidden % 8:
        raise _err(src, "workload.hidden", w.hidden, "must be a multiple of 8")
    if w.fp8 != "none" and w.hidden % 128:
        raise _err(src, "workload.hidden", w.hidden, f"must be a multiple of 128 with workload.fp8 = {w.fp8} (one "
                   "scale per 128 channels)")
    if w.fp8 != "none" and w.dtype != "bfloat16":
        raise _err(src, "workload.dtype", w.dtype, f"must be bfloat16 with workload.fp8 = {w.fp8} (FP8 dispatch, "
                   "bfloat16 combine)")
    if w.topk > w.num_experts:
        raise _err(src, "workload.topk", w.topk, f"must be <= workload.num_experts ({w.num_experts})")
    r = w.routing
    if r["kind"] == "group_limited":
        G, TG = r["num_groups"], r["topk_groups"]
        if w.num_experts % G or TG > G or TG * (w.num_experts // G) < w.topk:
            raise _err(src, "workload.routing", r, f"{w.num_experts} experts in {G} groups, {TG} groups per token "
                       f"cannot give top-{w.topk}: need num_experts % num_groups == 0, topk_groups <= num_groups "
                       f"and topk_groups * experts per group >= topk")
    if r["kind"] == "one_expert" and r["expert"] >= w.num_experts:
        raise _err(src, "workload.routing.expert", r["expert"], f"must be < workload.num_experts ({w.num_experts})")
    if r["kind"] == "replay":
        try:
            w.make_routing()
        except ValueError as e:
            raise _err(src, "workload.routing.path", r["path"], str(e)) from None
    return w


def _variant(src: str, spec_dir: str, i: int, data: Any, hooks: bool) -> Variant:
    key = f"variants[{i}]"
    data = _mapping(src, key, data)
    allowed = VARIANT_KEYS + (("_corrupt",) if hooks else ())
    _known(src, key, data, allowed)
    if "config" not in data:
        raise _err(src, f"{key}.config", None, "missing: a backend config file (relative to the spec) or an inline mapping")
    raw = data["config"]
    if isinstance(raw, str):
        full = raw if os.path.isabs(raw) else os.path.normpath(os.path.join(spec_dir, raw))
        if not os.path.isfile(full):
            raise _err(src, f"{key}.config", raw, f"file not found (looked for {full})")
        try:
            cfg = load(full)
        except ConfigError as e:
            raise _err(src, f"{key}.config", raw, f"invalid backend config: {e}") from None
        origin = os.path.relpath(full)
    elif isinstance(raw, Mapping):
        try:
            cfg = from_dict(raw, source=f"{src} ({key}.config)")
        except ConfigError as e:
            raise _err(src, f"{key}.config", "<inline mapping>", f"invalid inline config: {e}") from None
        origin = "inline"
    else:
        raise _err(src, f"{key}.config", raw, "expected a file path or a mapping")
    if "set" in data:
        changes = _mapping(src, f"{key}.set", data["set"])
        try:
            cfg = cfg.replace(**{str(k): v for k, v in changes.items()})
        except (KeyError, TypeError):
            raise _err(src, f"{key}.set", dict(changes), "each key must be a dotted config key, e.g. protocol or "
                       "kernel.num_sms") from None
        except ConfigError as e:
            raise _err(src, f"{key}.set", dict(changes), f"makes an invalid config: {e}") from None
    name = data.get("name", f"{cfg.backend}-{cfg.effective_protocol}")
    if not isinstance(name, str) or not name.strip():
        raise _err(src, f"{key}.name", name, "expected a non-empty string")
    x_in_buffer = data.get("x_in_buffer", False)
    if not isinstance(x_in_buffer, bool):
        raise _err(src, f"{key}.x_in_buffer", x_in_buffer, "true or false (x built in Buffer.input_view)")
    corrupt = None
    if hooks and data.get("_corrupt"):
        c = data["_corrupt"]
        corrupt = {} if c is True else dict(_mapping(src, f"{key}._corrupt", c))
        _known(src, f"{key}._corrupt", corrupt, CORRUPT_KEYS)
        if "tensor" in corrupt:
            _choice(src, f"{key}._corrupt.tensor", corrupt["tensor"], TENSORS)
        if "call" in corrupt:
            _choice(src, f"{key}._corrupt.call", corrupt["call"], CORRUPT_CALLS)
    return Variant(name, cfg, origin, corrupt, x_in_buffer)


def check_sizes(src: str, workload: Workload, variants: tuple[Variant, ...] | list[Variant]) -> None:
    """Every variant's buffer must fit the workload (and so, each other)."""
    for k in SIZED_KEYS:
        vals = {v.name: getattr(v.config.buffer, k) for v in variants}
        if len(set(vals.values())) > 1:
            listing = ", ".join(f"'{n}' has {val!r}" for n, val in vals.items())
            raise _err(src, f"variants[*].config buffer.{k}", vals, f"variants are sized differently ({listing}); "
                       f"every variant's buffer.{k} must equal workload.{k} = {getattr(workload, k)!r}")
        for i, v in enumerate(variants):
            have = getattr(v.config.buffer, k)
            if have != getattr(workload, k):
                raise _err(src, f"variants[{i}] ('{v.name}', config {v.origin}) buffer.{k}", have,
                           f"must equal workload.{k} = {getattr(workload, k)!r}")
    for i, v in enumerate(variants):
        b = v.config.buffer
        if v.x_in_buffer and workload.fp8 != "none":
            raise _err(src, f"variants[{i}] ('{v.name}').x_in_buffer", True, f"must be false with workload.fp8 = "
                       f"{workload.fp8}: FP8 rows are packed into the input region by dispatch itself")
        if workload.output_layout == "expert" and b.recv_capacity == 0 and b.expert_alignment < workload.expert_alignment:
            raise _err(src, f"variants[{i}] ('{v.name}', config {v.origin}) buffer.expert_alignment", b.expert_alignment,
                       f"must be >= workload.expert_alignment = {workload.expert_alignment} (the outputs' worst case "
                       f"is sized for the buffer's alignment; or set buffer.recv_capacity)")
        if v.config.buffer.max_tokens_per_rank < workload.tokens_per_rank:
            raise _err(src, f"variants[{i}] ('{v.name}', config {v.origin}) buffer.max_tokens_per_rank",
                       v.config.buffer.max_tokens_per_rank,
                       f"must be >= workload.tokens_per_rank = {workload.tokens_per_rank}")


def check_world(spec: Spec, world_size: int) -> None:
    """Checks that need the job's size."""
    for i, v in enumerate(spec.variants):
        try:
            check_world_size(v.config, world_size)
        except ConfigError:
            raise _err(spec.path, f"variants[{i}] ('{v.name}', config {v.origin}) buffer.num_experts",
                       v.config.buffer.num_experts, f"must be divisible by the world size ({world_size})") from None
    r = spec.workload.routing
    if r["kind"] == "replay":
        W = int(spec.workload.make_routing().replay.shape[0])
        if W != world_size:
            raise _err(spec.path, "workload.routing.path", r["path"],
                       f"holds a routing for world size {W}; this job has {world_size} ranks (use --world-size {W})")


# -- loading -------------------------------------------------------------------------------
def load_spec(path: str | os.PathLike, *, overrides: Mapping[str, Any] | None = None,
              config_set: Mapping[str, Any] | None = None, only: list[str] | None = None) -> Spec:
    """Read and validate a spec. ``overrides``: workload keys (seed, warmup, repeats,
    tokens_per_rank, timing) from the command line; ``config_set``: dotted config keys changed in
    every variant; ``only``: run just these variants (by name, in the spec's order)."""
    src = os.fspath(path)
    data = load_yaml(src, "spec", SpecError)
    data = _mapping(src, "<top level>", data if data is not None else {})
    hooks = os.environ.get(TEST_HOOKS_ENV) == "1"
    _known(src, "", data, TOP_KEYS)
    spec_dir = os.path.dirname(os.path.abspath(src))

    wdata = dict(_mapping(src, "workload", data.get("workload") or {}))
    for k, v in (overrides or {}).items():
        if v is not None:
            wdata[k] = v
    workload = _workload(src, spec_dir, wdata)

    raw_variants = data.get("variants")
    if not isinstance(raw_variants, list):
        raise _err(src, "variants", raw_variants, "expected a list of two or more variants (each: name, config)")
    if len(raw_variants) < 2:
        raise _err(src, "variants", raw_variants, f"an A/B run needs two or more variants; got {len(raw_variants)}")
    variants = [_variant(src, spec_dir, i, v, hooks) for i, v in enumerate(raw_variants)]
    if config_set:
        changed = []
        for v in variants:
            try:
                changed.append(dataclasses.replace(v, config=v.config.replace(**dict(config_set))))
            except (KeyError, TypeError):
                raise _err(src, "--set", dict(config_set), "each key must be a dotted config key") from None
            except ConfigError as e:
                raise _err(src, "--set", dict(config_set), f"makes variant '{v.name}' invalid: {e}") from None
        variants = changed
    names = [v.name for v in variants]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _err(src, "variants[].name", dup, "variant names must be unique")
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise _err(src, "--variants", unknown, f"no such variant; the spec has: {', '.join(names)}")
        variants = [v for v in variants if v.name in only]
        if len(variants) < 2:
            raise _err(src, "--variants", list(only), "an A/B run needs two or more variants")
    check_sizes(src, workload, variants)

    ws = data.get("world_size")
    if ws is not None and ws != "auto":
        ws = _int(src, "world_size", ws, 1, 4096)
    rpn = _int(src, "ranks_per_node", data.get("ranks_per_node", 0), 0, 4096)
    ref = data.get("reference", True)
    if not isinstance(ref, bool):
        raise _err(src, "reference", ref, "expected true or false")
    fb = dict(_mapping(src, "fallback", data.get("fallback") or {}))
    _known(src, "fallback", fb, FALLBACK_KEYS)
    for k in FALLBACK_KEYS:
        if k in fb:
            lo = 1 if k in ("repeats", "world_size") else 0
            fb[k] = _int(src, f"fallback.{k}", fb[k], lo, 1 << 20)
    name = data.get("name", os.path.splitext(os.path.basename(src))[0])
    desc = data.get("description", "")
    for k, v in (("name", name), ("description", desc)):
        if not isinstance(v, str):
            raise _err(src, k, v, "expected a string")
    return Spec(src, name, workload, tuple(variants), ws, rpn, ref, desc, fb)


# -- falling back to the host backend --------------------------------------------------------
def fallback_to_host(spec: Spec, reason: str, keep: tuple[str, ...] = ()) -> tuple[Spec, dict[str, Any]]:
    """The spec that runs when its GPU variants cannot (no GPU here), and a record of what changed.

    Rule: the variants become exactly two host variants, ``host-push`` and ``host-pull``,
    whose configs are the first GPU variant's config with ``backend: host`` and
    ``protocol: push`` / ``pull`` (buffer and kernel sections kept). The workload is kept
    (shape, dtype, layout, routing, seed) except for the keys the spec's ``fallback:``
    section sets (tokens_per_rank, warmup, repeats, world_size) -- but not those in
    ``keep`` (given on the command line, which wins). buffer.max_tokens_per_rank is set
    to the workload's tokens_per_rank, so the host segments in /dev/shm stay small."""
    first = spec.gpu_variants[0]
    fb = {k: v for k, v in spec.fallback.items() if k not in keep}
    if spec.workload.routing["kind"] == "replay":
        fb.pop("tokens_per_rank", None)  # the replay file fixes the token count
    workload = spec.workload
    changes = {k: fb[k] for k in ("tokens_per_rank", "warmup", "repeats") if k in fb}
    if changes:
        workload = dataclasses.replace(workload, **changes)
    base = first.config.replace(backend="host", protocol="push",
                                **{"buffer.max_tokens_per_rank": max(workload.tokens_per_rank, 1)})
    variants = (Variant("host-push", base, f"fallback from '{first.name}' ({first.origin})"),
                Variant("host-pull", base.replace(protocol="pull"), f"fallback from '{first.name}' ({first.origin})"))
    check_sizes(spec.path, workload, variants)
    ws = fb.get("world_size", spec.world_size if spec.world_size != "auto" else 2)  # None: replay's, else 2
    new = dataclasses.replace(spec, workload=workload, variants=variants, world_size=ws)
    record = {
        "reason": reason,
        "replaced": [{"name": v.name, "backend": v.config.backend, "protocol": v.config.effective_protocol,
                      "origin": v.origin} for v in spec.variants],
        "with": [v.name for v in variants],
        "workload_changes": {k: [getattr(spec.workload, k), v] for k, v in changes.items()},
        "world_size": ws,
    }
    return new, record
