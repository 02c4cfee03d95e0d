"""symmoe.bench.compare: bench JSONs of a change and its baseline, side by side. CPU only (the
timings are made up here, summarised as symmoe.bench summarises real ones)."""
from __future__ import annotations

import json

import pytest

from symmoe.bench import compare as bench_compare, gpu as bench, ops

ROW_BYTES = 7168 * 2


def _layout(dispatch_us: float, combine_us: float, kernel_us: float) -> dict:
    stats = lambda us: {"median_us": us, "p10_us": us, "p90_us": us, "n": 3}  # noqa: E731
    return {"rows": 4096, "real_rows": 4096, "kernels_us": {"dispatch": {"pull_kernel": kernel_us}},
            "host_ops_us": {}, "dispatch": stats(dispatch_us), "combine": stats(combine_us),
            "api_dispatch": stats(dispatch_us), "dispatch_host": stats(50.0), "combine_host": stats(10.0),
            "dispatch_bytes": 2 * 4096 * ROW_BYTES, "combine_bytes": 2 * 4096 * ROW_BYTES}


def _doc(commit: str, dispatch_us: float, kernel_us: float, backends=("torch", "nccl")) -> dict:
    results = []
    for backend in backends:
        cfg = bench.bench_config("push", 132, backend=backend)
        ranks = [{"tokens": 4096, "seed": 0, "rank": _layout(dispatch_us, 36.0, kernel_us)}]
        results.append(bench.summarize(cfg, 1, ranks, roof=4.0e12, copy_us=lambda nbytes: nbytes / 4.0e6))
    return {"commit": commit, "results": results}


def _line(text: str, backend: str, op: str, section: int = 0) -> list[str]:
    block = text.split("\n\n")[section].splitlines()
    return next(ln for ln in block if ln.startswith(backend) and f" {op} " in f"{ln} ").split()


def test_each_op_of_the_baseline_is_set_beside_the_other_runs_with_its_ratio():
    text = bench_compare.compare([_doc("base", 40.0, 34.0), _doc("change", 36.0, 32.0)], ["base", "change"])
    cols = _line(text, "torch", "dispatch")
    assert cols[:4] == ["torch", "push", "1", "rank"]
    base_copy = 2 * 4096 * ROW_BYTES / 4.0e6 / 40.0
    assert cols[5:7] == ["40.0", f"{base_copy:.4f}"]
    assert cols[7:10] == ["36.0", "(0.900)", f"{base_copy * 40 / 36:.4f}"]
    assert _line(text, "torch", "dispatch", section=1)[5:] == ["34.0", "32.0"]  # the kernels' µs


def test_a_ratio_to_the_copy_just_under_a_target_line_does_not_print_as_the_line():
    docs = [_doc("base", 40.0, 34.0), _doc("change", 36.0, 32.0)]
    docs[1]["results"][0]["layouts"]["rank"]["dispatch"]["ratio_same_size_copy"] = 0.84989
    cols = _line(bench_compare.compare(docs, ["base", "change"]), "torch", "dispatch")
    assert cols[9] == "0.8499"


def test_the_host_s_work_after_the_counts_wait_is_set_beside_the_kernels_where_measured():
    docs = [_doc("base", 40.0, 34.0), _doc("change", 36.0, 32.0)]
    for doc, after in zip(docs, (70.0, 31.5)):
        phases = {k: {"median_us": v, "p10_us": v, "p90_us": v, "n": 3}
                  for k, v in (("before_wait", 60.0), ("wait", 900.0), ("after_wait", after))}
        doc["results"][0]["ranks"][0]["rank"]["dispatch_host_phases_timed"] = phases  # torch only
    text = bench_compare.compare(docs, ["base", "change"])
    assert _line(text, "torch", "dispatch", section=2)[5:] == ["70.0", "31.5"]
    assert not any(ln.startswith("nccl") for ln in text.split("\n\n")[2].splitlines())
    assert len(bench_compare.compare([_doc("a", 1.0, 1.0), _doc("b", 1.0, 1.0)], ["a", "b"]).split("\n\n")) == 3


def test_the_host_s_time_inside_each_call_is_set_beside_the_other_runs_where_measured():
    docs = [_doc("base", 40.0, 34.0), _doc("change", 36.0, 32.0)]
    docs[1]["results"][0]["ranks"][0]["rank"]["combine_host"]["median_us"] = 7.5  # torch's combine, change only
    del docs[1]["results"][1]["ranks"][0]["rank"]["dispatch_host"]  # nccl's dispatch, not measured in the change
    text = bench_compare.compare(docs, ["base", "change"])
    assert text.split("\n\n")[2].startswith("host inside the call")
    assert _line(text, "torch", "dispatch", section=2)[5:] == ["50.0", "50.0"]
    assert _line(text, "torch", "combine", section=2)[5:] == ["10.0", "7.5"]
    assert _line(text, "nccl", "dispatch", section=2)[5:] == ["50.0", "-"]


def test_an_op_missing_from_a_run_shows_a_dash():
    text = bench_compare.compare([_doc("base", 40.0, 34.0), _doc("change", 36.0, 32.0, backends=("torch",))],
                                 ["base", "change"])
    assert _line(text, "nccl", "dispatch")[-1] == "-"


def test_main_names_runs_by_their_commit_and_refuses_a_single_file(tmp_path, capsys):
    paths = []
    for commit, us in (("1a7e89e", 40.0), ("506d33c", 36.0)):
        paths.append(tmp_path / f"{commit}.json")
        paths[-1].write_text(json.dumps(_doc(commit, us, 30.0)))
    assert bench_compare.main([str(p) for p in paths]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[-2:] == ["1a7e89e", "506d33c"]
    assert bench_compare.main([str(paths[0])]) == 2
    assert "needs at least 2" in capsys.readouterr().err


def test_labels_must_match_the_files():
    with pytest.raises(ValueError, match="1 label"):
        bench_compare.compare([_doc("a", 1.0, 1.0), _doc("b", 1.0, 1.0)], ["a"])


def test_a_file_without_results_is_refused_naming_it(tmp_path, capsys):
    empty, full = tmp_path / "empty.json", tmp_path / "full.json"
    empty.write_text(json.dumps({"commit": "x"}))
    full.write_text(json.dumps(_doc("y", 1.0, 1.0)))
    assert bench_compare.main([str(empty), str(full)]) == 2
    assert f"{empty}: no results" in capsys.readouterr().err


def test_a_call_s_kernels_read_as_the_time_some_kernel_ran_where_the_file_has_it():
    """A kernel launched to follow another waits inside its own time for that one: a file that
    holds the kernels' union (ops.BUSY) is read by it instead of the sum; older files are
    summed."""
    docs = [_doc("base", 40.0, 34.0), _doc("change", 40.0, 34.0)]
    kernels = docs[1]["results"][0]["ranks"][0]["rank"]["kernels_us"]["dispatch"]
    kernels.update({"recv_tail_kernel": 27.0, ops.BUSY: 35.5})  # the tail waited 26 µs of its 27
    text = bench_compare.compare(docs, ["base", "change"])
    assert _line(text, "torch", "dispatch", section=1)[5:] == ["34.0", "35.5"]


@pytest.mark.parametrize("intervals, covered", [
    ([], 0.0),
    ([(0.0, 34.0), (30.0, 61.0), (61.5, 64.0)], 63.5),  # a follower overlapping its primary, then a gap
    ([(5.0, 6.0), (0.0, 10.0), (2.0, 3.0)], 10.0),  # inside one another, in any order
])
def test_the_kernels_union_counts_overlapping_time_once(intervals, covered):
    assert ops.union_length(intervals) == pytest.approx(covered)
