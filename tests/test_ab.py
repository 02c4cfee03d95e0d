"""symmoe ab: specs are validated like configs, the quickstart (torch push vs pull) falls
back to the host backend without a GPU and writes its outputs, a corrupted variant stops the run with a precise report, GPU specs
fall back to host push/pull without a GPU. CPU only; three short spawned runs."""
from __future__ import annotations

import importlib.util
import json
import os
import textwrap

import pytest
import torch

from symmoe.ab import cli
from symmoe.ab import report
from symmoe.ab.report import bootstrap_ratio
from symmoe.ab.runner import account_bytes, compare_outputs, corrupt_outputs
from symmoe.ab.spec import TEST_HOOKS_ENV, SpecError, load_spec
from symmoe.testing.compare import first_bit_difference
from symmoe.workload import Routing, make_inputs, make_topk_idxs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AB = os.path.join(ROOT, "configs", "ab")
HOST = os.path.join(ROOT, "configs", "host.yaml")
SMALL = "{tokens_per_rank: 32, hidden: 1024, topk: 8, num_experts: 64, warmup: 1, repeats: 2}"


def write_spec(tmp_path, *parts: str) -> str:
    """Each part is dedented on its own, then they are joined."""
    p = tmp_path / "spec.yaml"
    p.write_text("\n".join(textwrap.dedent(part).strip("\n") for part in parts) + "\n")
    return str(p)


def two_host_variants(extra_b: str = "") -> str:
    return f"""
    variants:
      - {{name: push, config: {HOST}}}
      - {{name: pull, config: {HOST}, set: {{protocol: pull}}{extra_b}}}
    """


# -- full runs (spawned ranks) ------------------------------------------------------------------
def test_quickstart_without_a_gpu_falls_back_to_host_and_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main([os.path.join(AB, "quickstart.yaml"), "--no-gpu", "--out", str(out), "--warmup", "1",
                   "--repeats", "3", "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "| host-push | host/push |" in cap.out and "| host-pull | host/pull |" in cap.out
    assert "FALLBACK: --no-gpu was given" in cap.out and "FALLBACK: --no-gpu was given" in cap.err  # says so
    assert "'torch-push' (torch), 'torch-pull' (torch)" in cap.err
    assert "**bitwise:**" in cap.out and "(of dispatch, of worst dispatch and of cached dispatch)" in cap.out
    assert "| cached dispatch µs |" in cap.out  # the backward pass's dispatch, timed and checked too
    assert "| worst dispatch µs |" in cap.out  # DeepEP V1's num_worst_tokens, rank-major: timed and checked
    assert "nan" not in cap.out  # no op column without samples
    assert (out / "table.md").read_text() == cap.out
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "ok" and res["world_size"] == 2 and res["fallback"]["with"] == ["host-push", "host-pull"]
    assert res["rounds_checked"] == 1 + 1 + 3
    assert [v["name"] for v in res["spec"]["variants"]] == ["host-push", "host-pull"]
    for r in res["ranks"]:
        for name in ("host-push", "host-pull"):
            assert {op: len(xs) for op, xs in r["samples"][name].items()} == {
                "dispatch": 3, "worst_dispatch": 3, "cached_dispatch": 3, "combine": 3}
        assert r["bytes"]["network_bytes"] == 0 and r["bytes"]["total_bytes"] == r["bytes"]["rows"] * 1024 * 2
    env = res["environment"]
    for key in ("date", "hostname", "command", "torch", "git_commit", "cuda_available"):
        assert key in env
    ratio = res["stats"]["host-pull"]["dispatch"]["ratio_to_first"]
    assert ratio["ci_low"] <= ratio["value"] <= ratio["ci_high"]
    labels = report.plot_labels(res)  # the plot's words: shared memory, no network bars, the fallback in the title
    assert labels["intra_label"] == "shared memory (CPU processes)" and labels["network_label"] is None
    assert "FALLBACK to the host backend (host-push, host-pull: CPU processes over shared memory; --no-gpu " \
           "was given)" in labels["title"]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "plot.png").stat().st_size > 0 and res["plot"]
    else:
        assert "plot skipped: matplotlib is not installed" in cap.err and not (out / "plot.png").exists()


def test_corrupted_variant_is_caught_with_variant_rank_tensor_row_and_column(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    spec = write_spec(tmp_path, f"""
    world_size: 2
    workload: {SMALL}
    """, two_host_variants(", _corrupt: {tensor: recv_x, rank: 1, row: 2, col: 5}"))
    out = tmp_path / "out"
    rc = cli.main([spec, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_MISMATCH
    assert "host backend: CPU processes over POSIX shared memory" in err  # host-only specs say where they run
    assert ("bitwise mismatch: variant 'pull' differs from variant 'push' on rank 1 in recv_x at row 2, column 5 "
            "(round 0, check pass)") in err, err
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "mismatch"
    p = res["problem"]
    assert (p["variant"], p["against"], p["rank"], p["tensor"], p["row"], p["col"]) == ("pull", "push", 1, "recv_x", 2, 5)
    assert res["ranks_with_problems"] == [1]


def test_worst_case_dispatch_is_checked_on_its_own_rows(tmp_path, monkeypatch, capsys):
    # Only the num_worst_tokens dispatch's last row (N - 1 = W * T - 1) is flipped: the exact calls agree.
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    spec = write_spec(tmp_path, f"""
    world_size: 2
    workload: {SMALL}
    """, two_host_variants(", _corrupt: {tensor: recv_x, rank: 0, row: 1000000, col: 1, call: worst}"))
    rc = cli.main([spec, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_MISMATCH
    assert ("bitwise mismatch: variant 'pull' differs from variant 'push' on rank 0 in recv_x at row 63, column 1 "
            "(round 0, check pass)") in err, err


FP8_WORKLOAD = "{tokens_per_rank: 32, hidden: 1024, topk: 8, num_experts: 64, fp8: ue8m0, output_layout: expert, " \
               "expert_alignment: 8, warmup: 1, repeats: 2}"


def test_fp8_workload_runs_every_variant_bitwise_and_counts_e4m3_and_scale_bytes(tmp_path, capsys):
    spec = write_spec(tmp_path, f"""
    world_size: 2
    workload: {FP8_WORKLOAD}
    """, two_host_variants())
    out = tmp_path / "out"
    rc = cli.main([spec, "--out", str(out), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "FP8 (ue8m0 scales), expert-major" in cap.out
    res = json.loads((out / "results.json").read_text())
    for r in res["ranks"]:
        assert r["bytes"]["row_bytes"] == 1024 + 4 * 2 and r["bytes"]["total_bytes"] == r["bytes"]["rows"] * 1032


def test_a_corrupted_fp8_scale_is_caught_naming_the_scales(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    spec = write_spec(tmp_path, f"""
    world_size: 2
    workload: {FP8_WORKLOAD}
    """, two_host_variants(", _corrupt: {tensor: recv_x_scales, rank: 0, row: 1, col: 1}"))
    rc = cli.main([spec, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_MISMATCH
    assert "variant 'pull' differs from variant 'push' on rank 0 in recv_x_scales at row 1, column 1" in err, err


@pytest.mark.parametrize("workload, variant, key, allowed", [
    ("fp8: float32, dtype: float32", "", "workload.dtype = 'float32'", "must be bfloat16 with workload.fp8 = float32"),
    ("fp8: ue8m0, hidden: 1000", "", "workload.hidden = 1000", "must be a multiple of 128 with workload.fp8 = ue8m0"),
    ("fp8: e5m2", "", "workload.fp8 = 'e5m2'", "none, float32, ue8m0"),
    ("fp8: float32, hidden: 1024", ", x_in_buffer: true", "variants[1] ('pull').x_in_buffer = True",
     "FP8 rows are packed into the input region by dispatch itself"),
])
def test_fp8_workload_errors_name_the_key(tmp_path, workload, variant, key, allowed):
    msg = _spec_error(tmp_path, f"""
    world_size: 2
    workload: {{tokens_per_rank: 32, topk: 8, num_experts: 64, {workload}}}
    """, two_host_variants(variant))
    assert key in msg and allowed in msg, msg


def test_corrupt_hook_call_names_the_calls_it_takes(tmp_path, monkeypatch):
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    msg = _spec_error(tmp_path, f"""
    world_size: 2
    workload: {SMALL}
    """, two_host_variants(", _corrupt: {call: sometimes}"))
    assert "variants[1]._corrupt.call = 'sometimes': allowed: exact, worst" in msg


def test_gpu_spec_falls_back_to_host_push_vs_pull_and_says_so(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main([os.path.join(AB, "v1_v2_mega.yaml"), "--no-gpu", "--out", str(out), "--quiet",
                   "--tokens-per-rank", "16", "--repeats", "2"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "FALLBACK: --no-gpu was given" in cap.err and "FALLBACK" in cap.out
    assert "'v1-nvshmem' (nvshmem), 'v2-nccl' (nccl), 'mega-torch' (torch)" in cap.err
    res = json.loads((out / "results.json").read_text())
    assert [v["name"] for v in res["spec"]["variants"]] == ["host-push", "host-pull"]
    assert [v["backend"] for v in res["spec"]["variants"]] == ["host", "host"]
    wl = res["spec"]["workload"]
    # command line wins over the spec's fallback section; the section's other keys apply
    assert (wl["tokens_per_rank"], wl["repeats"], wl["warmup"], wl["hidden"]) == (16, 2, 1, 7168)
    assert res["fallback"]["with"] == ["host-push", "host-pull"] and res["world_size"] == 2


def test_no_fallback_makes_missing_gpu_an_error(capsys):
    rc = cli.main([os.path.join(AB, "push_vs_pull.yaml"), "--no-gpu", "--no-fallback"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_SPEC and "--no-fallback" in err and "'torch-push' (torch)" in err


# -- spec validation ----------------------------------------------------------------------------
def test_shipped_specs_load():
    q = load_spec(os.path.join(AB, "quickstart.yaml"))
    assert [(v.config.backend, v.config.effective_protocol) for v in q.variants] == [("torch", "push"),
                                                                                     ("torch", "pull")]
    assert q.world_size == "auto" and q.workload.hidden == 1024
    m = load_spec(os.path.join(AB, "v1_v2_mega.yaml"))
    assert [v.config.backend for v in m.variants] == ["nvshmem", "nccl", "torch"]
    wl = m.workload
    assert (wl.tokens_per_rank, wl.hidden, wl.topk, wl.num_experts, wl.dtype) == (4096, 7168, 8, 256, "bfloat16")
    assert wl.routing["kind"] == "group_limited"
    pp = load_spec(os.path.join(AB, "push_vs_pull.yaml"))
    assert [(v.config.backend, v.config.effective_protocol) for v in pp.variants] == [("torch", "push"),
                                                                                      ("torch", "pull")]
    pm = load_spec(os.path.join(AB, "push_modes.yaml"))
    assert [(v.config.backend, v.config.kernel.push_mode) for v in pm.variants] == [
        ("torch", "unpack"), ("torch", "stream"), ("nccl", "unpack"), ("nccl", "stream")]
    f8 = load_spec(os.path.join(AB, "fp8.yaml"))
    assert (f8.workload.fp8, f8.workload.expert_alignment) == ("float32", 128)
    assert {v.config.buffer.expert_alignment for v in f8.variants} == {128}
    xb = load_spec(os.path.join(AB, "x_in_buffer.yaml"))
    assert [(v.config.effective_protocol, v.x_in_buffer) for v in xb.variants] == [("pull", False), ("pull", True)]


def _spec_error(tmp_path, *parts: str) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, *parts))
    return str(e.value)


def test_missing_config_file_names_spec_key_and_path(tmp_path):
    msg = _spec_error(tmp_path, f"""
    workload: {SMALL}
    variants:
      - {{name: a, config: ../no_such.yaml}}
      - {{name: b, config: {HOST}}}
    """)
    assert "spec.yaml: variants[0].config = '../no_such.yaml': file not found" in msg


def test_missing_spec_file():
    with pytest.raises(SpecError, match="nope.yaml.*spec file not found"):
        load_spec("/nonexistent/nope.yaml")


def test_unknown_keys_are_named_with_what_is_allowed(tmp_path):
    msg = _spec_error(tmp_path, "workload: {tokens_per_rank: 8, hiden: 64}\n", two_host_variants())
    assert "workload.hiden = 64: unknown key; allowed here: tokens_per_rank, hidden" in msg
    msg = _spec_error(tmp_path, f"workload: {SMALL}\nrepeat: 3\n", two_host_variants())
    assert "repeat = 3: unknown key" in msg
    msg = _spec_error(tmp_path, f"workload: {SMALL}\n", two_host_variants(", colour: red"))
    assert "variants[1].colour = 'red': unknown key; allowed here: name, config, set" in msg
    msg = _spec_error(tmp_path, "workload: {routing: {kind: zipf, s: 2}}\n", two_host_variants())
    assert "workload.routing.s = 2: unknown key; allowed here: kind, zipf_s" in msg
    msg = _spec_error(tmp_path, "workload: {routing: pareto}\n", two_host_variants())
    assert "workload.routing.kind = 'pareto': allowed: uniform, zipf, group_limited" in msg
    msg = _spec_error(tmp_path, "workload: {routing: {kind: masked, masked_tokens: 1.5}}\n", two_host_variants())
    assert "workload.routing.masked_tokens = 1.5: must be in [0, 1]" in msg


def test_test_hook_is_an_unknown_key_outside_tests(tmp_path, monkeypatch):
    monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    msg = _spec_error(tmp_path, f"workload: {SMALL}\n", two_host_variants(", _corrupt: true"))
    assert "variants[1]._corrupt = True: unknown key" in msg


def test_variants_sized_differently_are_named_with_the_key(tmp_path):
    msg = _spec_error(tmp_path, f"""
    workload: {SMALL}
    variants:
      - {{name: small, config: {HOST}, set: {{buffer.hidden: 512}}}}
      - {{name: big, config: {HOST}}}
    """)
    assert "buffer.hidden" in msg and "variants are sized differently ('small' has 512, 'big' has 1024)" in msg
    msg = _spec_error(tmp_path, f"""
    workload: {SMALL}
    variants:
      - {{name: a, config: {HOST}, set: {{buffer.dtype: float16}}}}
      - {{name: b, config: {HOST}, set: {{buffer.dtype: float16}}}}
    """)
    assert "variants[0] ('a', config" in msg and "buffer.dtype = 'float16': must equal workload.dtype = 'bfloat16'" in msg
    msg = _spec_error(tmp_path, "workload: {tokens_per_rank: 300, hidden: 1024, topk: 8, num_experts: 64}",
                      two_host_variants())
    assert "buffer.max_tokens_per_rank = 256: must be >= workload.tokens_per_rank = 300" in msg
    msg = _spec_error(tmp_path, "workload: {tokens_per_rank: 8, hidden: 1024, topk: 8, num_experts: 64, "
                      "output_layout: expert, expert_alignment: 16}", two_host_variants())
    assert "buffer.expert_alignment = 8: must be >= workload.expert_alignment = 16" in msg


def test_fewer_than_two_variants(tmp_path):
    msg = _spec_error(tmp_path, f"workload: {SMALL}\nvariants:\n  - {{name: a, config: {HOST}}}\n")
    assert "variants" in msg and "needs two or more variants; got 1" in msg
    assert "expected a list of two or more" in _spec_error(tmp_path, f"workload: {SMALL}\n")


def test_choosing_variants_by_name():
    spec = os.path.join(AB, "v1_v2_mega.yaml")
    assert [v.name for v in load_spec(spec, only=["mega-torch", "v1-nvshmem"]).variants] == ["v1-nvshmem", "mega-torch"]
    with pytest.raises(SpecError, match="--variants = \\['v3'\\]: no such variant; the spec has: v1-nvshmem"):
        load_spec(spec, only=["v3"])
    with pytest.raises(SpecError, match="needs two or more variants"):
        load_spec(spec, only=["v2-nccl"])


def test_duplicate_names_and_bad_inline_config(tmp_path):
    msg = _spec_error(tmp_path, f"""
    workload: {SMALL}
    variants:
      - {{name: a, config: {HOST}}}
      - {{name: a, config: {HOST}}}
    """)
    assert "variant names must be unique" in msg
    msg = _spec_error(tmp_path, f"""
    workload: {SMALL}
    variants:
      - {{name: a, config: {HOST}}}
      - {{name: b, config: {{backend: host, protocl: pull}}}}
    """)
    assert "variants[1].config" in msg and "protocl = 'pull': unknown key" in msg


def test_a_key_given_twice_is_refused_naming_it_and_the_file(tmp_path):
    """PyYAML keeps the last of two equal keys; a spec (or a config it names) must not."""
    msg = _spec_error(tmp_path, f"workload: {SMALL}\nworkload: {SMALL}\n", two_host_variants())
    assert "spec.yaml: workload = '<mapping>': duplicate key (lines 1 and 2): a key may appear once" in msg
    msg = _spec_error(tmp_path, f"workload: {SMALL}\nvariants:\n  - {{name: a, name: b, config: {HOST}}}\n"
                                f"  - {{name: c, config: {HOST}}}\n")
    assert "spec.yaml: variants[0].name = 'b': duplicate key (lines 3 and 3)" in msg
    cfg = tmp_path / "twice.yaml"
    cfg.write_text("backend: host\nprotocol: push\nprotocol: pull\n")
    msg = _spec_error(tmp_path, f"workload: {SMALL}\nvariants:\n  - {{name: a, config: {cfg}}}\n"
                                f"  - {{name: b, config: {HOST}}}\n")
    assert f"invalid backend config: {cfg}: protocol = 'pull': duplicate key (lines 2 and 3)" in msg


def test_the_plot_labels_say_what_carried_the_bytes():
    """NVLink within a node and network bars only where bytes crossed nodes; the host backend's
    bytes are shared memory between CPU processes."""
    def result(backends, network_bytes):
        return {"spec": {"name": "s", "workload_text": "w", "variants": [{"name": b, "backend": b} for b in backends]},
                "world_size": 4, "fallback": None, "ranks": [{"bytes": {"network_bytes": n}} for n in network_bytes]}

    gpu = report.plot_labels(result(["torch", "nccl"], [0, 512, 512, 0]))
    assert gpu == {"title": "symmoe ab s: w, world size 4", "intra_label": "intra-node (NVLink)",
                   "network_label": "network"}
    assert report.plot_labels(result(["torch", "nccl"], [0, 0, 0, 0]))["network_label"] is None
    host = report.plot_labels(result(["host", "host"], [0, 0, 0, 0]))
    assert host["intra_label"] == "shared memory (CPU processes)" and host["network_label"] is None
    assert "FALLBACK" not in host["title"]  # a host spec is not a fallback


def test_replay_file_is_checked_against_the_workload(tmp_path):
    idx = torch.stack(make_topk_idxs(Routing("uniform"), num_tokens=32, topk=8, num_experts=64, world_size=2, seed=1))
    torch.save(idx, tmp_path / "r.pt")
    spec = write_spec(tmp_path, "workload: {tokens_per_rank: 32, hidden: 1024, topk: 8, num_experts: 64, "
                      "routing: {kind: replay, path: r.pt}}\n", two_host_variants())
    assert load_spec(spec).workload.make_routing().replay.shape == (2, 32, 8)
    msg = _spec_error(tmp_path, "workload: {tokens_per_rank: 16, hidden: 1024, topk: 8, num_experts: 64, "
                      "routing: {kind: replay, path: r.pt}}\n", two_host_variants())
    assert "workload.routing.path" in msg and "tokens per rank 32; the workload needs 16" in msg
    msg = _spec_error(tmp_path, "workload: {routing: {kind: replay, path: gone.pt}}\n", two_host_variants())
    assert "workload.routing.path = 'gone.pt': file not found" in msg


# -- pieces -----------------------------------------------------------------------------------
def test_bitwise_compare_sees_signed_zero_and_reports_row_col():
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    b = a.clone()
    b[2, 6] = -0.0
    d = first_bit_difference(b, a)
    assert (d["row"], d["col"]) == (2, 6) and "0x8000 vs 0x0" in d["detail"]
    assert first_bit_difference(a, a.clone()) is None
    d = first_bit_difference(torch.ones(5, 3), torch.ones(4, 3))
    assert d["row"] == 4 and "shape (5, 3) vs (4, 3)" in d["detail"]


def test_corrupt_hook_flips_one_element_on_one_rank_only():
    outs = {"recv_x": torch.ones(4, 8), "recv_topk_idx": torch.zeros(4, 2, dtype=torch.int64),
            "recv_topk_weights": torch.ones(4, 2), "num_recv_tokens_per_expert": torch.tensor([1, 2]),
            "combined_x": torch.ones(3, 8), "combined_topk_weights": None}
    hook = {"tensor": "combined_x", "row": 1, "col": 7}
    assert corrupt_outputs(outs, hook, rank=0, world_size=2) is outs  # default rank: the last
    bad = corrupt_outputs(outs, hook, rank=1, world_size=2)
    name, d = compare_outputs(bad, outs)
    assert (name, d["row"], d["col"]) == ("combined_x", 1, 7)
    assert compare_outputs(outs, outs) is None


def test_bytes_split_intra_node_and_network():
    idx = [torch.tensor([[0, 3], [2, -1]]), torch.tensor([[1, 2], [3, 0]])]  # 4 experts, 2 ranks: L = 2
    rank_major = account_bytes(idx, rank=1, num_experts=4, output_layout="rank", row_bytes=10, ranks_per_node=2)
    assert rank_major["rows_from"] == [2, 2] and rank_major["network_bytes"] == 0
    assert rank_major["intra_node_bytes"] == 40 and rank_major["self_bytes"] == 20
    split = account_bytes(idx, rank=1, num_experts=4, output_layout="expert", row_bytes=10, ranks_per_node=1)
    assert split["rows_from"] == [2, 2] and split["network_bytes"] == 20 and split["intra_node_bytes"] == 20


def test_bootstrap_ratio_is_seeded_and_brackets_the_value():
    a = [1.0 + 0.01 * (i % 7) for i in range(40)]
    b = [2.0 + 0.02 * (i % 5) for i in range(40)]
    r1, r2 = bootstrap_ratio(a, b, seed=3), bootstrap_ratio(a, b, seed=3)
    assert r1 == r2 and r1["ci_low"] <= r1["value"] <= r1["ci_high"] and 0.45 < r1["value"] < 0.55


def test_make_inputs_for_some_ranks_and_topk_idxs_match_the_full_build():
    kw = dict(num_tokens=[5, 7, 6], topk=4, num_experts=16, world_size=3, seed=11)
    full = make_inputs(Routing("zipf"), hidden=16, dtype=torch.float32, **kw)
    part = make_inputs(Routing("zipf"), hidden=16, dtype=torch.float32, ranks=[1], **kw)
    assert part[0] is None and part[2] is None and torch.equal(part[1].x, full[1].x)
    idxs = make_topk_idxs(Routing("zipf"), **kw)
    assert all(torch.equal(i, f.topk_idx) for i, f in zip(idxs, full))


def test_the_masked_routing_can_mask_whole_tokens_as_padding_does():
    """masked_tokens: that share of tokens has every slot -1 (no row anywhere); the others keep
    their ids, as mask_prob 0 leaves them."""
    (idx,) = make_topk_idxs(Routing("masked", mask_prob=0.0, masked_tokens=0.5), num_tokens=[400], topk=4,
                            num_experts=16, world_size=1, seed=3)
    whole = (idx < 0).all(1)
    assert 120 < int(whole.sum()) < 280
    assert bool((idx[~whole] >= 0).all())


def test_a_variant_can_dispatch_x_from_the_input_view_and_stays_bitwise_equal(tmp_path, capsys):
    spec = write_spec(tmp_path, f"""
    world_size: 2
    workload: {SMALL}
    variants:
      - {{name: pull, config: {HOST}, set: {{protocol: pull}}}}
      - {{name: pull-in-buffer, config: {HOST}, set: {{protocol: pull}}, x_in_buffer: true}}
    """)
    out = tmp_path / "out"
    rc = cli.main([spec, "--out", str(out), "--quiet", "--no-plot"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "| pull-in-buffer | host/pull (x in buffer) |" in cap.out and "| pull | host/pull |" in cap.out
    res = json.loads((out / "results.json").read_text())
    assert [v["x_in_buffer"] for v in res["spec"]["variants"]] == [False, True]
    assert res["status"] == "ok" and res["rounds_checked"] == 1 + 1 + 2


def test_x_in_buffer_must_be_a_boolean(tmp_path):
    msg = _spec_error(tmp_path, f"workload: {SMALL}\n", two_host_variants(", x_in_buffer: maybe"))
    assert "variants[1].x_in_buffer = 'maybe': true or false (x built in Buffer.input_view)" in msg


def test_timing_says_what_a_gpu_call_s_time_covers_and_a_bad_value_is_named(tmp_path):
    body = two_host_variants()
    assert load_spec(write_spec(tmp_path, f"workload: {SMALL}", body)).workload.timing == "call"  # the GPU idle before
    queued = write_spec(tmp_path, "workload: {tokens_per_rank: 32, hidden: 1024, topk: 8, num_experts: 64, "
                                  "timing: device}", body)
    assert load_spec(queued).workload.timing == "device"
    assert load_spec(write_spec(tmp_path, f"workload: {SMALL}", body), overrides={"timing": "device"}).workload.timing \
        == "device"
    bad = write_spec(tmp_path, "workload: {tokens_per_rank: 32, hidden: 1024, topk: 8, num_experts: 64, timing: wall}",
                     body)
    with pytest.raises(SpecError, match=r"workload\.timing = 'wall': allowed: call, device"):
        load_spec(bad)


def test_the_table_says_whether_the_host_s_launch_work_is_in_a_gpu_call_s_time(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main([os.path.join(AB, "quickstart.yaml"), "--no-gpu", "--out", str(out), "--warmup", "0",
                   "--repeats", "1", "--quiet", "--no-plot", "--timing", "device"])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["spec"]["workload"]["timing"] == "device"
    header = next(p for p in report.markdown(res).split("\n\n") if p.startswith("world size"))
    assert "timer: host perf_counter" in header and "sleep" not in header  # no GPU: nothing to queue behind
    for r in res["ranks"]:
        r["timer"] = "cuda-events"
    assert "each call queued behind a 1 ms sleep (the host's launch work hidden)" in report.markdown(res)
    res["spec"]["workload"]["timing"] = "call"
    assert "the GPU idle before each call (the host's launch work included)" in report.markdown(res)
