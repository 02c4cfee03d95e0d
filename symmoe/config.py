"""YAML -> frozen dataclasses, validated at load time.

Every problem raises :class:`symmoe.ConfigError` naming the file, the key path, the value
and what is allowed. ``Config.digest()`` is what ranks compare at start-up.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from .backends import MODULES as BACKEND_NAMES, declared as backend_spec
from .errors import ConfigError
from .layout import DTYPES, MAX_CHANNELS, STREAM_CHANNELS, BufferLayout

# What each backend runs and needs (its protocols, its receive pool and channels) is its own
# declaration (``BACKEND`` in backends/<module>.py), read through ``backend_spec``; every
# declaration can be read where the backend's library is missing.
OUTPUT_LAYOUTS = ("rank", "expert")
PUSH_MODES = ("auto", "stream", "unpack")
FAN_PHASES = ("off", "block", "grid", "steal")


def _doc(default: Any, text: str) -> Any:
    """A config field with its description, which ``reference_markdown`` prints (docs/config.md)."""
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class BufferConfig:
    """What one dispatch carries. These sizes cut the symmetric buffer into its regions
    (``symmoe size FILE`` prints them)."""

    max_tokens_per_rank: int = _doc(4096, "Most tokens one rank dispatches in a call.")
    hidden: int = _doc(7168, "Elements of a token's row; a multiple of 8 (16-byte rows for bulk copies).")
    topk: int = _doc(8, "Experts per token: the columns of `topk_idx`; at most `num_experts`.")
    num_experts: int = _doc(256, "Experts over all ranks; divisible by the world size (rank r holds experts "
                                 "r * L .. r * L + L - 1, L = num_experts / world size).")
    dtype: str = _doc("bfloat16", "Element type of the rows.")
    output_layout: str = _doc("rank", "`rank`: one row per (token, destination rank), ordered by (source rank, "
                                      "token); `expert`: one row per (token, local expert), grouped by expert, each "
                                      "group padded to `expert_alignment` rows.")
    expert_alignment: int = _doc(1, "Expert-major group padding (what grouped GEMMs consume): each expert's rows "
                                    "start at a multiple of it.")
    recv_capacity: int = _doc(0, "Most rows one rank receives: bounds its outputs and the receive pool; 0 = the "
                                 "worst case. A dispatch over it raises CapacityError on every rank.")


@dataclass(frozen=True)
class KernelConfig:
    """How the GPU kernels run; `symmoe/launch_shape.py` turns it and the GPU's SMs into each
    kernel's blocks. The host backend reads only `timeout_s`."""

    num_sms: int = _doc(24, "SMs the kernels of a call may use (capped by what the GPU, or the rank's MPS "
                            "share, holds); the low-latency mode has its own, `low_latency.num_sms`.")
    num_channels: int = _doc(8, "nvshmem: channels of its push, a sender and a receiver block each (capped by "
                                "the SMs it holds).")
    timeout_s: float = _doc(30.0, "Every wait, on the device or the host, raises StallError naming the rank "
                                  "and the stage after this many seconds.")
    copy_bytes: int = _doc(0, "Bulk-copy piece in bytes (torch, nccl), a multiple of 128; 0 = whole rows up to "
                              "16 KB (3584 B for the expert-major fan-out).")
    copy_depth: int = _doc(0, "Bulk-copy slots per warp (torch, nccl), 2..16: depth - 1 loads in flight; "
                              "0 = 4 for rank-major rows, 3 for the expert-major fan-out.")
    fan_phases: str = _doc("steal", "Expert-major dispatch at world size 1 (every backend). `block`: each block "
                                    "loads whole rows into shared memory, then stores each to its rows; `grid`: "
                                    "the same, every block meeting the others between loads and stores (all "
                                    "must be resident at once); `steal`: block, but after the first round each "
                                    "block takes the next group of rows from a grid counter (a block whose "
                                    "rounds run slow takes fewer); `off`: the bulk-copy mover (nvshmem: its "
                                    "dispatch kernel).")
    push_mode: str = _doc("auto", "Push with peers (torch, nccl). `unpack`: the push kernel, a barrier, then a "
                                  "kernel copies the pool out; `stream`: one kernel of sender and receiver "
                                  "channels, rows copied out as they land (DeepEP V1's shape); `auto`: stream "
                                  "when every rank has a GPU of its own.")
    stream_receivers: int = _doc(0, "Receiver blocks of the streamed push; its senders are the rest of "
                                    "`num_sms`. 0 = half.")
    ring_rows: int = _doc(0, "nvshmem: rows of each (source, channel) ring of the receive pool; a sender reuses "
                             "a slot once the receiver's head passed it. 0 = the pool split evenly, which never "
                             "wraps unless `buffer.recv_capacity` shrinks the pool.")


@dataclass(frozen=True)
class LowLatencyConfig:
    """The low-latency mode (`Buffer.low_latency_dispatch` / `low_latency_combine`, docs/low_latency.md):
    its kernels' own launch shapes (`kernel.timeout_s` still bounds every wait)."""

    num_sms: int = _doc(0, "Blocks (one per SM) of each low-latency kernel: 0 = every SM this rank may use, "
                           "i.e. the GPU's (or the rank's MPS share), split evenly among the ranks sharing one GPU. "
                           "Capped by that budget: the receive kernels spin while they wait, so the grids of the "
                           "ranks on one GPU together must leave room for their senders.")


@dataclass(frozen=True)
class HostConfig:
    """Options of the `host` backend."""

    poll_interval_us: int = _doc(50, "How long a host-side wait sleeps between polls of shared memory.")


@dataclass(frozen=True)
class TorchConfig:
    """Options of the `torch` backend."""

    allow_overlapping_devices: bool = _doc(False, "Several ranks on one GPU (tests under MPS): sets "
                                                  "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES.")


@dataclass(frozen=True)
class NvshmemConfig:
    """Options of the `nvshmem` backend (none yet)."""


@dataclass(frozen=True)
class NcclConfig:
    """Options of the `nccl` backend (none yet)."""


@dataclass(frozen=True)
class Config:
    """The whole config: the backend, the protocol, and one section each for the buffer, the
    kernels and every backend's own options. Every key is optional."""

    backend: str = _doc("host", "Where the symmetric memory comes from (see docs/backends.md).")
    protocol: str = _doc("", "`push` or `pull`, among those the backend runs; empty = the backend's native "
                             "one (the first it runs, in the table below).")
    buffer: BufferConfig = field(default_factory=BufferConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    low_latency: LowLatencyConfig = field(default_factory=LowLatencyConfig)
    host: HostConfig = field(default_factory=HostConfig)
    torch: TorchConfig = field(default_factory=TorchConfig)
    nvshmem: NvshmemConfig = field(default_factory=NvshmemConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    source: str | None = field(default=None, compare=False)

    # -- derived -------------------------------------------------------------------------
    @property
    def effective_protocol(self) -> str:
        return self.protocol or backend_spec(self.backend).protocols[0]

    def layout(self, world_size: int) -> BufferLayout:
        b = self.buffer
        channels = backend_spec(self.backend).layout_channels(self.kernel.num_channels)
        return BufferLayout(
            world_size=world_size, max_tokens=b.max_tokens_per_rank, hidden=b.hidden, topk=b.topk,
            num_experts=b.num_experts, elem_size=DTYPES[b.dtype].itemsize, alignment=b.expert_alignment,
            num_channels=channels, recv_capacity=b.recv_capacity, pool_limit=self.pool_limit(world_size),
        )

    def pool_limit(self, world_size: int) -> int:
        """Rows the receive pool needs at most (``BufferLayout.pool_limit``), as the backend
        declares (``BackendSpec.pool_limit``)."""
        return backend_spec(self.backend).pool_limit(self.effective_protocol, world_size,
                                                     self.buffer.max_tokens_per_rank, self.kernel.num_channels)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        d["protocol"] = self.effective_protocol
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> "Config":
        """A copy with dotted keys changed, validated like a file: ``replace(**{"buffer.hidden": 128})``."""
        d = self.to_dict()
        for key, value in changes.items():
            node = d
            *path, last = key.split(".")
            for p in path:
                if not isinstance(node.get(p), dict):  # no such section: the sections there are allowed
                    raise _unknown_key(key, value, [k for k, v in node.items() if isinstance(v, dict)], self.source)
                node = node[p]
            node[last] = value
        return from_dict(d, source=self.source)


# -- loading -----------------------------------------------------------------------------
_RANGES: dict[str, tuple[float, float]] = {
    "buffer.max_tokens_per_rank": (1, 1 << 20),
    "buffer.hidden": (8, 1 << 16),
    "buffer.topk": (1, 32),
    "buffer.num_experts": (1, 1 << 16),
    "buffer.expert_alignment": (1, 1024),
    "buffer.recv_capacity": (0, 1 << 28),
    "kernel.num_sms": (1, 1024),
    "kernel.num_channels": (1, MAX_CHANNELS),
    "kernel.stream_receivers": (0, STREAM_CHANNELS),
    "kernel.timeout_s": (1e-3, 86400),
    "kernel.copy_bytes": (0, 65536),
    "kernel.copy_depth": (0, 16),
    "kernel.ring_rows": (0, 1 << 28),
    "low_latency.num_sms": (0, 1024),
    "host.poll_interval_us": (0, 1_000_000),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "backend": tuple(BACKEND_NAMES),
    "buffer.dtype": tuple(DTYPES),
    "buffer.output_layout": OUTPUT_LAYOUTS,
    "kernel.push_mode": PUSH_MODES,
    "kernel.fan_phases": FAN_PHASES,
}


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))


def _unknown_key(kp: str, value: Any, known: typing.Iterable[str], source: str | None) -> ConfigError:
    """The error for a key the config does not have, with the keys allowed at that level."""
    return ConfigError(kp, value, f"unknown key; allowed here: {', '.join(sorted(known)) or 'none'}", source)


def _build(cls: type, data: Any, path: str, source: str | None) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(path or "<top level>", data, "expected a mapping of keys", source)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    kwargs = {}
    for key, value in data.items():
        kp = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise _unknown_key(kp, value, known, source)
        t = hints[key]
        if dataclasses.is_dataclass(t):
            kwargs[key] = _build(t, value if value is not None else {}, kp, source)
            continue
        kwargs[key] = _check_scalar(kp, value, t, source)
    obj = cls(**kwargs)
    return obj


def _check_scalar(kp: str, value: Any, t: Any, source: str | None) -> Any:
    if t is str and value is False and "off" in _CHOICES.get(kp, ()):
        value = "off"  # YAML reads an unquoted off (and no, false) as false
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if t is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(kp, value, f"expected {_type_name(int)}", source)
    if t is not int and not isinstance(value, t):
        raise ConfigError(kp, value, f"expected {_type_name(t)}", source)
    if kp in _RANGES:
        lo, hi = _RANGES[kp]
        if not lo <= value <= hi:
            raise ConfigError(kp, value, f"must be in [{lo:g}, {hi:g}]", source)
    if kp in _CHOICES and value not in _CHOICES[kp]:
        raise ConfigError(kp, value, f"allowed: {', '.join(_CHOICES[kp])}", source)
    return value


def _check_combinations(cfg: Config) -> None:
    src, b = cfg.source, cfg.buffer
    runs = backend_spec(cfg.backend).protocols
    if cfg.protocol and cfg.protocol not in runs:
        raise ConfigError("protocol", cfg.protocol, f"backend '{cfg.backend}' runs: {', '.join(runs)}", src)
    if b.hidden % 8:
        raise ConfigError("buffer.hidden", b.hidden, "must be a multiple of 8 (16-byte rows for bulk copies)", src)
    if b.topk > b.num_experts:
        raise ConfigError("buffer.topk", b.topk, f"must be <= buffer.num_experts ({b.num_experts})", src)
    if cfg.kernel.copy_bytes % 128:
        raise ConfigError("kernel.copy_bytes", cfg.kernel.copy_bytes,
                          "must be 0 (whole rows up to 16 KB) or a multiple of 128 bytes", src)
    if cfg.kernel.copy_depth == 1:
        raise ConfigError("kernel.copy_depth", cfg.kernel.copy_depth,
                          "must be 0 (automatic) or 2..16 (one slot leaves no load in flight)", src)


def parse_key_value(text: str) -> tuple[str, Any]:
    """``"kernel.num_sms=64"`` -> ``("kernel.num_sms", 64)`` (the value read as YAML): the
    ``--set`` option of every command (an argparse ``type=``)."""
    import argparse

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. kernel.num_sms=64")
    k, v = text.split("=", 1)
    return k.strip(), yaml.load(v, Loader=StrictLoader)


def parse_world_size(text: str) -> int:
    """The ``--world-size`` option of every command (an argparse ``type=``): an integer >= 1."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the world size (ranks) must be an integer >= 1")
    return n


def from_dict(data: Mapping[str, Any], source: str | None = None) -> Config:
    cfg = _build(Config, data, "", source)
    if cfg.protocol and cfg.protocol not in ("push", "pull"):
        raise ConfigError("protocol", cfg.protocol, "allowed: push, pull (or leave it out for the backend's native one)", source)
    cfg = dataclasses.replace(cfg, source=source)
    _check_combinations(cfg)
    return cfg


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping names the same key twice: ``key`` is its dotted path."""

    def __init__(self, key: str, value: Any, first: yaml.Mark, again: yaml.Mark):
        self.key, self.value, self.lines = key, value, (first.line + 1, again.line + 1)
        super().__init__(None, None, f"found duplicate key {key!r} (lines {self.lines[0]} and {self.lines[1]})", again)


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain PyYAML keeps the
    last one silently: ``backend: host`` then ``backend: torch`` would run torch)."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_duplicates(node, "", set())
        return super().construct_document(node)

    def _check_duplicates(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node already checked
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Mark] = {}
            for k, v in node.value:
                if k.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(k) if isinstance(k, yaml.ScalarNode) else None
                kp = f"{path}.{key}" if path else str(key)
                if key is not None and key in first:
                    value = self.construct_object(v) if isinstance(v, yaml.ScalarNode) else f"<{v.id}>"
                    raise DuplicateKey(kp, value, first[key], k.start_mark)
                if key is not None:
                    first[key] = k.start_mark
                self._check_duplicates(v, kp, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self._check_duplicates(v, f"{path}[{i}]", seen)


def load_yaml(path: str, what: str = "config", error: type[ConfigError] = ConfigError) -> Any:
    """The data of a YAML file (config or A/B spec), read with :class:`StrictLoader`. A missing
    file, a directory, a file that is not UTF-8 text, invalid YAML or a duplicate key raise
    ``error`` naming the path; an empty file returns None."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=StrictLoader)
    except FileNotFoundError:
        raise error("<file>", path, f"{what} file not found", path) from None
    except IsADirectoryError:
        raise error("<file>", path, f"is a directory; expected a {what} YAML file", path) from None
    except UnicodeDecodeError as e:
        raise error("<file>", path, f"not a text file (byte {e.start} is not UTF-8); expected a {what} YAML file",
                    path) from None
    except DuplicateKey as e:
        raise error(e.key, e.value, f"duplicate key (lines {e.lines[0]} and {e.lines[1]}): a key may appear once "
                    "per mapping", path) from None
    except yaml.YAMLError as e:
        raise error("<file>", path, f"not valid YAML: {e}", path) from None


def load(path: str | os.PathLike) -> Config:
    path = os.fspath(path)
    data = load_yaml(path)
    if data is None:
        raise ConfigError("<file>", path, "empty config: the file holds no keys; write at least `backend:` "
                          "(e.g. configs/host.yaml)", path)
    return from_dict(data, source=path)


def check_world_size(cfg: Config, world_size: int) -> None:
    """Checks that depend on the job's size; run when a Buffer is created."""
    if world_size < 1:
        raise ConfigError("world size", world_size, "must be an integer >= 1", cfg.source)
    if cfg.buffer.num_experts % world_size:
        raise ConfigError("buffer.num_experts", cfg.buffer.num_experts,
                          f"must be divisible by the world size ({world_size})", cfg.source)


def diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two ``Config.to_dict()`` mappings."""
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            keys += diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(f"{prefix}{k}")
    return keys


REFERENCE_COMMAND = "symmoe config docs > docs/config.md"


def reference_markdown() -> str:
    """docs/config.md: every key of the config with its type, default, what is allowed and its
    description, from the dataclasses above and the backends' declarations
    (``REFERENCE_COMMAND`` writes it)."""
    from .backends import BACKENDS

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "`" + ("true" if v else "false") + "`"
        return "`" + (str(v) if not isinstance(v, str) else v or '""') + "`"

    def allowed(kp: str, t: Any) -> str:
        if kp in _CHOICES:
            return ", ".join(f"`{c}`" for c in _CHOICES[kp])
        if kp in _RANGES:
            lo, hi = _RANGES[kp]
            return f"{lo:g} .. {hi:g}" if t is float else f"{int(lo)} .. {int(hi)}"
        return "true, false" if t is bool else ""

    def table(cls: type, path: str) -> list[str]:
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            if f.name == "source" or dataclasses.is_dataclass(t):
                continue
            kp = f"{path}{f.name}"
            kind = {int: "integer", float: "number", bool: "boolean", str: "string"}[t]
            rows.append(f"| `{kp}` | {kind} | {value(f.default)} | "
                        f"{allowed(kp, t)} | {f.metadata.get('doc', '')} |")
        if not rows:
            return ["No keys."]
        return ["| key | type | default | allowed | description |", "|---|---|---|---|---|", *rows]

    def about(cls: type) -> str:
        return " ".join(line.strip() for line in (cls.__doc__ or "").split("\n")).strip().replace("``", "`")

    lines = ["# Config reference", "",
             f"<!-- Generated from the dataclasses in symmoe/config.py by `{REFERENCE_COMMAND}`; do not edit. -->", "",
             "A config is one YAML file. Every key is optional and checked when the file loads: an unknown key, a "
             "wrong type, a value out of range or an impossible combination fails with the file, the key, the value "
             "and what is allowed. `symmoe config check FILE` prints the effective config (defaults filled in, "
             "the protocol resolved); `--set KEY=VALUE` on `symmoe check`, `symmoe ab` and the benchmarks changes one "
             "key for a run.", "", "## Top level", "", about(Config), "", *table(Config, ""), "",
             "The backends and the protocols each declares (`BACKEND` in `backends/<module>.py`), native first:", "",
             "| backend | protocols | modelled on |", "|---|---|---|"]
    lines += [f"| `{name}` | {', '.join(spec.protocols)} | {spec.modelled_on} |" for name, spec in BACKENDS.items()]
    for f in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[f.name]
        if dataclasses.is_dataclass(cls):
            lines += ["", f"## `{f.name}`", "", about(cls), "", *table(cls, f"{f.name}.")]
    return "\n".join(lines) + "\n"
