"""symmoe.bench.targets: the goal table of a 2x H200 run (tests/fixtures/targets_W2), recomputed by hand from
the same JSON fields; a slower run fails its target; a missing or wrong file is named. CPU only."""
from __future__ import annotations

import copy
import json
import os

import pytest

from symmoe.bench import targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "tests", "fixtures", "targets_W2")
BENCH, BASELINES, AB = (os.path.join(RUN, f) for f in ("bench.json", "baselines.json", "ab_results.json"))


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def bench_entry(bench: dict, backend: str, protocol: str) -> dict:
    return next(r for r in bench["results"] if (r["backend"], r["protocol"]) == (backend, protocol))


def row(res: dict, source: str, backend: str, protocol: str, layout: str, op: str) -> dict:
    key = (source, backend, protocol, layout, op)
    return next(r for r in res["rows"] if (r["source"], r["backend"], r["protocol"], r["layout"], r["op"]) == key)


@pytest.fixture(scope="module")
def docs() -> tuple[dict, dict, dict]:
    return load(BENCH), load(BASELINES), load(AB)


@pytest.fixture(scope="module")
def res(docs) -> dict:
    return targets.compute(*docs)


def test_ceiling_is_the_nccl_all_to_all_algbw_of_the_same_run(docs, res):
    _, base, _ = docs
    assert res["world_size"] == base["world_size"] == 2
    assert res["ceiling"]["algbw_GBps"] == base["results"]["all_to_all"]["algbw_GBps"]
    assert res["ceiling"]["busbw_GBps"] == base["results"]["all_to_all"]["busbw_GBps"]
    assert res["ceiling"]["p2p_min_GBps"] == base["results"]["p2p_copy"]["min_GBps"]


def test_torch_pull_rank_dispatch_ratio_and_speedup_by_hand(docs, res):
    bench, base, _ = docs
    e = bench_entry(bench, "torch", "pull")
    assert all(rk["rank"]["rows"] == rk["rank"]["real_rows"] for rk in e["ranks"])  # no padding in this run
    row_bytes = e["hidden"] * 2  # bfloat16
    nbytes = max(rk["rank"]["rows"] for rk in e["ranks"]) * row_bytes
    median = e["layouts"]["rank"]["dispatch"]["median_us"]
    slowest = max(rk["rank"]["dispatch"]["median_us"] for rk in e["ranks"])
    assert median == pytest.approx(slowest, rel=1e-12)  # bench's layout median is already the slowest rank's
    want = (nbytes / (base["results"]["all_to_all"]["algbw_GBps"] * 1e9)) / (median * 1e-6)
    r = row(res, "bench", "torch", "pull", "rank", "dispatch")
    assert r["bytes_per_rank"] == nbytes
    assert r["ratio_to_ceiling"] == pytest.approx(want, rel=1e-12)
    assert r["target_met"] == (want >= 0.80)
    assert r["speedup_vs_a2a"] == pytest.approx(base["results"]["a2a"]["dispatch"]["median_us"] / median, rel=1e-12)


def test_expert_layout_dispatch_moves_rank_rows_and_combine_moves_expert_rows(docs, res):
    bench, base, _ = docs
    algbw = base["results"]["all_to_all"]["algbw_GBps"] * 1e9
    e = bench_entry(bench, "nccl", "push")
    row_bytes = e["hidden"] * 2
    for op, layout_of_rows in (("dispatch", "rank"), ("combine", "expert")):
        nbytes = max(rk[layout_of_rows]["rows"] for rk in e["ranks"]) * row_bytes
        want = (nbytes / algbw) / (e["layouts"]["expert"][op]["median_us"] * 1e-6)
        r = row(res, "bench", "nccl", "push", "expert", op)
        assert r["ratio_to_ceiling"] == pytest.approx(want, rel=1e-12), op
        assert r["speedup_vs_a2a"] is None, "the a2a baseline is rank-major only"


def test_ab_rows_use_step_medians_and_ab_byte_counts(docs, res):
    _, base, ab = docs
    assert ab["spec"]["workload"]["output_layout"] == "rank"
    nbytes = max(rk["bytes"]["rows"] * rk["bytes"]["row_bytes"] for rk in ab["ranks"])
    median_us = ab["stats"]["v2-nccl"]["combine"]["step"]["median"] * 1e6
    want = (nbytes / (base["results"]["all_to_all"]["algbw_GBps"] * 1e9)) / (median_us * 1e-6)
    r = row(res, "ab v2-nccl", "nccl", "push", "rank", "combine")
    assert r["ratio_to_ceiling"] == pytest.approx(want, rel=1e-12)
    assert r["speedup_vs_a2a"] == pytest.approx(base["results"]["a2a"]["combine"]["median_us"] / median_us, rel=1e-12)


def test_best_speedup_per_op_is_the_fastest_bench_backend(docs, res):
    bench, base, _ = docs
    for op in ("dispatch", "combine"):
        fastest = min(r["layouts"]["rank"][op]["median_us"] for r in bench["results"])
        best = res["summary"]["best_speedup"][op]
        assert best["speedup_vs_a2a"] == pytest.approx(base["results"]["a2a"][op]["median_us"] / fastest, rel=1e-12)
        assert best["met"] == (best["speedup_vs_a2a"] >= 1.5)


def test_a_slower_run_does_not_meet_the_targets(docs, res):
    bench, base, ab = docs
    met = row(res, "bench", "torch", "push", "rank", "combine")
    assert met["target_met"], "precondition: torch push rank combine meets the ratio target in this run"
    slow = copy.deepcopy(bench)
    for r in slow["results"]:
        for layout in r["layouts"].values():
            for op in ("dispatch", "combine"):
                layout[op]["median_us"] *= 10
        for rk in r["ranks"]:
            for layout in ("rank", "expert"):
                for op in ("dispatch", "combine"):
                    rk[layout][op]["median_us"] *= 10
    res2 = targets.compute(slow, base, ab)
    r = row(res2, "bench", "torch", "push", "rank", "combine")
    assert r["ratio_to_ceiling"] == pytest.approx(met["ratio_to_ceiling"] / 10)
    assert r["target_met"] is False
    assert "| bench | torch | push | rank | combine |" in targets.markdown(res2)
    assert res2["summary"]["ratio_met"] == 0
    assert not any(b["met"] for b in res2["summary"]["best_speedup"].values())
    assert "NOT met" in targets.markdown(res2)


def test_differing_commits_are_said_in_the_header(docs):
    bench, base, ab = docs
    other = dict(bench, commit="0000000")
    md = targets.markdown(targets.compute(other, base, ab))
    assert "inputs from different commits" in md and "bench 0000000" in md
    assert "COMMITS DIFFER" in md


def test_cli_writes_markdown_and_json_with_the_same_numbers(tmp_path, capsys):
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    assert targets.main(["--bench", BENCH, "--baselines", BASELINES, "--ab", AB, "--md", str(md),
                         "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert out == md.read_text()
    doc = json.loads(js.read_text())
    r = row(doc, "bench", "torch", "pull", "rank", "dispatch")
    assert f"| {r['ratio_to_ceiling']:.3f} |" in out
    for header in ("world size 2", "NVIDIA H200", "18d702e", "Definitions", "busbw", "P2P copy min"):
        assert header in out


@pytest.mark.parametrize("flag, content, message", [
    ("--bench", None, "bench file {path}: no such file"),
    ("--baselines", "{not json", "baselines file {path}: not valid JSON"),
    ("--bench", '{"results": [{"world_size": 2, "backend": "torch"}]}',
     "bench file {path}: missing field results.0.protocol"),
    ("--ab", '{"world_size": 2}', "ab file {path}: missing field spec.workload"),
])
def test_a_bad_or_missing_file_is_named(tmp_path, capsys, flag, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    args = {"--bench": BENCH, "--baselines": BASELINES, "--ab": AB, flag: str(path)}
    assert targets.main([a for kv in args.items() for a in kv]) == 2
    assert message.format(path=path) in capsys.readouterr().err


def test_a_bench_run_with_x_in_the_buffer_is_its_own_row(docs):
    bench, base, ab = copy.deepcopy(docs)
    zc = copy.deepcopy(bench_entry(bench, "torch", "pull"))
    zc["x_in_buffer"] = True
    zc["layouts"]["rank"]["dispatch"]["median_us"] *= 0.5
    bench["results"].append(zc)
    res = targets.compute(bench, base, ab)
    plain = row(res, "bench", "torch", "pull", "rank", "dispatch")
    fast = row(res, "bench", "torch", "pull (x in buffer)", "rank", "dispatch")
    assert fast["median_us"] == pytest.approx(plain["median_us"] / 2)
    assert fast["ratio_to_ceiling"] == pytest.approx(2 * plain["ratio_to_ceiling"])


def test_data_kernel_ratio_leaves_the_routing_kernels_out(docs, res):
    bench, base, _ = docs
    kernels = bench_entry(bench, "torch", "pull")["ranks"][0]["rank"]["kernels_us"]["dispatch"]
    data = sum(v for k, v in kernels.items() if "route" not in k)
    assert data < sum(kernels.values())  # the routing kernels are there and left out
    r = row(res, "bench", "torch", "pull", "rank", "dispatch")
    assert r["data_kernels_us"] == pytest.approx(data)
    assert r["ratio_data_kernels"] == pytest.approx(r["ceiling_us"] / data)
    assert row(res, "a2a baseline", "all_to_all_single", "nccl", "rank", "dispatch")["ratio_data_kernels"] is None


def test_a_cached_dispatch_is_judged_like_dispatch_in_rows_of_its_own(docs):
    """A bench file that times dispatch(x, handle=...) gets rows of the same rank-major bytes
    and the same a2a dispatch baseline as dispatch, labelled as cached in the Markdown."""
    bench, base, ab = copy.deepcopy(docs)
    e = bench_entry(bench, "torch", "push")
    for where in [e["layouts"]["rank"]] + [rk["rank"] for rk in e["ranks"]]:
        where["cached_dispatch"] = copy.deepcopy(where["dispatch"])
        where["cached_dispatch"]["median_us"] = where["dispatch"]["median_us"] * 0.8
    res = targets.compute(bench, base, ab)
    plain = row(res, "bench", "torch", "push", "rank", "dispatch")
    cached = row(res, "bench", "torch", "push", "rank", "cached_dispatch")
    assert cached["bytes_per_rank"] == plain["bytes_per_rank"]
    assert cached["ratio_to_ceiling"] == pytest.approx(plain["ratio_to_ceiling"] / 0.8)
    assert cached["speedup_vs_a2a"] == pytest.approx(plain["speedup_vs_a2a"] / 0.8)
    assert "best_speedup" in res["summary"] and "cached_dispatch" in res["summary"]["best_speedup"]
    md = targets.markdown(res)
    assert "| bench | torch | push | rank | cached dispatch |" in md
    assert "Best cached dispatch vs a2a baseline: torch/push" in md


def test_an_ab_cached_dispatch_is_its_own_row_against_the_a2a_dispatch(docs):
    bench, base, ab = copy.deepcopy(docs)
    name = ab["spec"]["variants"][0]["name"]
    st = ab["stats"][name]
    st["cached_dispatch"] = copy.deepcopy(st["dispatch"])
    st["cached_dispatch"]["step"]["median"] = st["dispatch"]["step"]["median"] / 2
    res = targets.compute(bench, base, ab)
    backend = ab["spec"]["variants"][0]["backend"]
    protocol = targets.protocol_label(ab["spec"]["variants"][0]["protocol"], None)
    plain = row(res, f"ab {name}", backend, protocol, "rank", "dispatch")
    cached = row(res, f"ab {name}", backend, protocol, "rank", "cached_dispatch")
    assert cached["median_us"] == pytest.approx(plain["median_us"] / 2)
    assert cached["speedup_vs_a2a"] == pytest.approx(2 * plain["speedup_vs_a2a"])
