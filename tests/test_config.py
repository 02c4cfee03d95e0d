"""Configs load into frozen dataclasses; every bad key, type, value or combination fails at
load time with the file, the key path, the value and what is allowed."""
import dataclasses
import subprocess
import sys

import pytest

import symmoe
from symmoe.config import Config, from_dict, load, parse_key_value


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_shipped_configs_load(tmp_path):
    for name in ["host", "torch", "nvshmem", "nccl"]:
        cfg = load(f"configs/{name}.yaml")
        assert cfg.backend == name


def test_defaults_and_native_protocol():
    assert from_dict({"backend": "torch"}).effective_protocol == "pull"
    assert from_dict({"backend": "nvshmem"}).effective_protocol == "push"
    assert from_dict({"backend": "host", "protocol": "pull"}).effective_protocol == "pull"


def test_config_is_frozen():
    cfg = from_dict({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.backend = "nccl"


def test_digest_depends_on_effective_values_only():
    assert from_dict({"backend": "torch"}).digest() == from_dict({"backend": "torch", "protocol": "pull"}).digest()
    assert from_dict({}).digest() != from_dict({"buffer": {"hidden": 128}}).digest()


BAD = [
    ("backend: gloo\n", "backend", "allowed: host, torch, nvshmem, nccl"),
    ("backend: nvshmem\nprotocol: pull\n", "protocol", "backend 'nvshmem' runs: push"),
    ("backend: nccl\nprotocol: pull\n", "protocol", "backend 'nccl' runs: push"),
    ("protocol: scatter\n", "protocol", "allowed: push, pull"),
    ("bufer: {}\n", "bufer", "unknown key"),
    ("buffer:\n  hiden: 128\n", "buffer.hiden", "unknown key"),
    ("buffer:\n  hidden: '128'\n", "buffer.hidden", "expected an integer"),
    ("buffer:\n  hidden: 12.5\n", "buffer.hidden", "expected an integer"),
    ("buffer:\n  hidden: 100\n", "buffer.hidden", "multiple of 8"),
    ("buffer:\n  hidden: 0\n", "buffer.hidden", "must be in"),
    ("buffer:\n  topk: 0\n", "buffer.topk", "must be in"),
    ("buffer:\n  topk: 9\n  num_experts: 8\n", "buffer.topk", "<= buffer.num_experts"),
    ("buffer:\n  dtype: int8\n", "buffer.dtype", "allowed: bfloat16, float16, float32"),
    ("buffer:\n  output_layout: token\n", "buffer.output_layout", "allowed: rank, expert"),
    ("buffer:\n  max_tokens_per_rank: -4\n", "buffer.max_tokens_per_rank", "must be in"),
    ("buffer:\n  expert_alignment: 0\n", "buffer.expert_alignment", "must be in"),
    ("buffer: 7\n", "buffer", "expected a mapping"),
    ("kernel:\n  num_channels: 65\n", "kernel.num_channels", "must be in"),
    ("kernel:\n  copy_bytes: 1000\n", "kernel.copy_bytes", "multiple of 128"),
    ("kernel:\n  copy_depth: 1\n", "kernel.copy_depth", "0 (automatic) or 2..16"),
    ("kernel:\n  copy_depth: 17\n", "kernel.copy_depth", "must be in"),
    ("kernel:\n  push_mode: pipelined\n", "kernel.push_mode", "allowed: auto, stream, unpack"),
    ("kernel:\n  fan_phases: true\n", "kernel.fan_phases", "expected a string"),
    ("kernel:\n  fan_phases: both\n", "kernel.fan_phases", "allowed: off, block, grid"),
    ("kernel:\n  stream_receivers: -1\n", "kernel.stream_receivers", "must be in"),
    ("kernel:\n  stream_receivers: 129\n", "kernel.stream_receivers", "must be in"),
    ("kernel:\n  timeout_s: 0\n", "kernel.timeout_s", "must be in"),
    ("kernel:\n  timeout_s: soon\n", "kernel.timeout_s", "expected a number"),
    ("torch:\n  allow_overlapping_devices: 1\n", "torch.allow_overlapping_devices", "true or false"),
    ("nvshmem:\n  heap_size: 1\n", "nvshmem.heap_size", "unknown key"),
    ("- backend\n", "<top level>", "expected a mapping"),
    ("backend: [torch\n", "<file>", "not valid YAML"),
    # PyYAML keeps the last of two equal keys: a file saying host would silently run torch
    ("backend: host\nbackend: torch\n", "backend = 'torch'", "duplicate key (lines 1 and 2)"),
    ("buffer:\n  hidden: 64\n  topk: 2\n  hidden: 128\n", "buffer.hidden = 128", "duplicate key (lines 2 and 4)"),
    # no keys at all is a mistake (a wrong file, a truncated copy), not the host backend's defaults
    ("", "<file>", "empty config"),
    ("# backend: torch\n", "<file>", "empty config"),
]


@pytest.mark.parametrize("text,key,allowed", BAD, ids=[b[1] + ":" + b[0].strip()[:20] for b in BAD])
def test_bad_config_names_file_key_value_and_allowed(tmp_path, text, key, allowed):
    path = write(tmp_path, text)
    with pytest.raises(symmoe.ConfigError) as e:
        load(path)
    msg = str(e.value)
    assert path in msg and key in msg and allowed in msg, msg


def test_an_unquoted_off_is_the_choice_off_not_a_type_error(tmp_path):
    """YAML reads `off` as false; a key whose choices include "off" takes it as that choice,
    in a file and in --set alike (true stays an error: there is no "on")."""
    assert load(write(tmp_path, "kernel:\n  fan_phases: off\n")).kernel.fan_phases == "off"
    key, value = parse_key_value("kernel.fan_phases=off")
    assert Config().replace(**{key: value}).kernel.fan_phases == "off"


def test_replace_names_an_unknown_key_as_loading_does():
    """Config.replace takes dotted keys like --set and a spec's `set:`; a misspelt one is the
    config error loading gives, with the sections or keys allowed where it went wrong."""
    with pytest.raises(symmoe.ConfigError) as e:
        Config().replace(**{"bufer.hidden": 3})
    assert str(e.value) == "bufer.hidden = 3: unknown key; allowed here: buffer, host, kernel, low_latency, nccl, nvshmem, torch"
    with pytest.raises(symmoe.ConfigError, match=r"^backend\.kind = 3: unknown key; allowed here: buffer, host"):
        Config().replace(**{"backend.kind": 3})  # backend is a value, not a section
    with pytest.raises(symmoe.ConfigError, match=r"^buffer\.hiden = 3: unknown key; allowed here: dtype, "):
        Config().replace(**{"buffer.hiden": 3})


def test_missing_file(tmp_path):
    with pytest.raises(symmoe.ConfigError, match="file not found"):
        load(tmp_path / "nope.yaml")


def test_experts_must_divide_among_ranks():
    cfg = from_dict({"buffer": {"num_experts": 6, "topk": 2, "hidden": 64, "max_tokens_per_rank": 4}})
    with pytest.raises(symmoe.ConfigError, match="divisible by the world size"):
        symmoe.Buffer.size_hint(cfg, 4)


def test_config_check_cli_prints_effective_config_or_error_without_traceback(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "symmoe.cli", "config", "check", "configs/torch.yaml"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "protocol: push" in ok.stdout and "digest" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "symmoe.cli", "config", "check", write(tmp_path, "buffer:\n  topk: x\n")],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "buffer.topk = 'x'" in bad.stderr and "Traceback" not in bad.stderr


def test_nvshmem_rings_must_fit_in_the_receive_pool():
    from symmoe.errors import ConfigError
    from symmoe.protocol.nvshmem import ring_rows

    assert ring_rows(0, 1000, 2, 4) == 125  # the pool split evenly over 2 sources x 4 channels
    assert ring_rows(3, 1000, 2, 4) == 3
    with pytest.raises(ConfigError, match=r"kernel.ring_rows = 200: 2 sources x 4 channels of rings of 200 rows "
                                          r"need 1600 rows, the receive pool holds 1000 \(allowed: 1..125"):
        ring_rows(200, 1000, 2, 4)
    with pytest.raises(ConfigError, match=r"kernel.ring_rows = 0: .* rings of 0 rows"):
        ring_rows(0, 7, 2, 4)


@pytest.mark.parametrize("backend, protocol, pool", [
    ("torch", "pull", 0),             # receivers read the sources' input regions: no pool
    ("torch", "push", 8 * 4096),      # one row per (source, token)
    ("nccl", "push", 8 * 4096),
    ("host", "pull", 8 * 4096),       # the host pull copies into its own pool
    ("nvshmem", "push", 8 * (4096 + 8)),  # rings of them, a row more per channel (8 in the defaults)
])
def test_receive_pool_holds_what_the_protocol_writes_not_the_expert_major_worst_case(backend, protocol, pool):
    cfg = from_dict({"backend": backend, "protocol": protocol,
                     "buffer": {"max_tokens_per_rank": 4096, "hidden": 7168, "topk": 8, "num_experts": 256}})
    lay = cfg.layout(8)
    assert lay.recv_rows == 8 * 4096 * 8  # what one rank may receive expert-major: its outputs' bound
    assert lay.pool_rows == pool
    row = 7168 * 2 + 2 * 4 * 8 + 4
    assert pool * row <= lay.regions["recv"].nbytes < pool * row + 4 * 1024 + 1024  # alignment of 4 sub-arrays


def test_nvshmem_rings_split_evenly_hold_a_channel_s_longest_share():
    from symmoe.protocol.nvshmem import ring_rows
    # top-1: what one rank may receive (W * T) is less than the pool; the pool is not cut to it
    for T, C, K in [(4096, 64, 8), (1000, 7, 8), (5, 8, 8), (4095, 8, 1), (5, 8, 1)]:
        cfg = from_dict({"backend": "nvshmem", "kernel": {"num_channels": C},
                         "buffer": {"max_tokens_per_rank": T, "topk": K}})
        lay = cfg.layout(4)
        for channels in range(1, C + 1):  # the protocol may run fewer (the SMs it holds)
            assert ring_rows(0, lay.pool_rows, 4, channels) >= -(-T // channels)


def test_pool_never_exceeds_recv_capacity():
    cfg = from_dict({"backend": "torch", "protocol": "push", "buffer": {"recv_capacity": 100}})
    lay = cfg.layout(4)
    assert lay.recv_rows == 100 and lay.pool_rows == 100
