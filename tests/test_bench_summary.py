"""symmoe.bench's summary of the ranks' timings: the slowest rank sets the time, the bytes of
every rank count, ratios are against the roofline of the whole device, and the table says
which MPS share every rank had, the share ranks get when they split a GPU. CPU only (the
timings are made up here)."""
from __future__ import annotations

import pytest

from symmoe import launch
from symmoe.bench import gpu as bench

ROW_BYTES = 7168 * 2


def stats(us: float) -> dict:
    return {"median_us": us, "p10_us": us * 0.9, "p90_us": us * 1.1, "n": 10}


def layout_result(dispatch_us: float, combine_us: float, host_us: float, rows: int) -> dict:
    return {"rows": rows, "real_rows": rows,
            "kernels_us": {"dispatch": {"push_kernel": 0.8 * dispatch_us}, "combine": {"reduce": 0.9 * combine_us}},
            "host_ops_us": {}, "dispatch": stats(dispatch_us), "combine": stats(combine_us),
            "api_dispatch": stats(dispatch_us + 5), "dispatch_host": stats(host_us),
            "combine_host": stats(host_us / 4), "dispatch_bytes": 2 * rows * ROW_BYTES,
            "combine_bytes": 2 * rows * ROW_BYTES}


def rank_result(dispatch_us: float, combine_us: float, host_us: float, rows: int) -> dict:
    # As _bench_rank returns it: one entry per output layout.
    return {"tokens": 4096, "seed": 0, "rank": layout_result(dispatch_us, combine_us, host_us, rows),
            "expert": layout_result(2 * dispatch_us, 2 * combine_us, host_us, 4 * rows)}


@pytest.fixture
def two_ranks() -> dict:
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    return bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12, mps_percentage=50)


def test_the_slowest_rank_sets_the_time_and_every_rank_s_bytes_count(two_ranks):
    d = two_ranks["layouts"]["rank"]["dispatch"]
    assert d["median_us"] == pytest.approx(400.0)
    assert d["bytes"] == 2 * (8000 + 8200) * ROW_BYTES
    assert d["TBps"] == pytest.approx(d["bytes"] / 400e-6 / 1e12)
    c = two_ranks["layouts"]["rank"]["combine"]
    assert c["median_us"] == pytest.approx(250.0)  # rank 0 is the slower one here


def test_ratio_is_against_the_whole_device_roofline_given(two_ranks):
    d = two_ranks["layouts"]["expert"]["dispatch"]
    assert two_ranks["copy_roofline_TBps"] == 4.0
    assert d["ratio_roofline"] == pytest.approx(d["bytes"] / 4.0e12 / (d["median_us"] * 1e-6))


def test_host_time_is_the_slowest_rank_s(two_ranks):
    assert two_ranks["layouts"]["rank"]["dispatch"]["host_us"] == 120.0
    assert two_ranks["layouts"]["rank"]["combine"]["host_us"] == 30.0


def test_table_names_the_mps_share_and_has_no_plain_torch_column_without_baselines(two_ranks):
    text = bench.table([two_ranks])
    assert "MPS share of every rank, all backends alike: W=2: 50 %" in text
    line = next(ln for ln in text.splitlines() if ln.split()[3:5] == ["rank", "dispatch"])
    cols = line.split()
    assert cols[:3] == ["torch", "push", "2"] and float(cols[5]) == 400.0
    assert cols[8] == "-" and cols[9] == "-"  # no same-size copy measured, no plain torch
    assert float(cols[12]) == 120.0  # host us


def test_each_op_is_set_against_a_copy_of_its_bytes_per_gpu_when_one_was_timed():
    """ratio_same_size_copy = µs of a copy moving the op's bytes on one GPU / the op's µs;
    with two GPUs each moves half the bytes."""
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    asked = []

    def copy_us(nbytes: int) -> float:
        asked.append(nbytes)
        return nbytes / 4.0e6  # 4 TB/s

    res = bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12, gpus=2, copy_us=copy_us)
    d = res["layouts"]["rank"]["dispatch"]
    assert d["bytes"] // 2 in asked
    assert d["same_size_copy_us"] == pytest.approx(d["bytes"] / 2 / 4.0e6)
    assert d["ratio_same_size_copy"] == pytest.approx(d["same_size_copy_us"] / 400.0)
    line = next(ln for ln in bench.table([res]).splitlines() if ln.split()[3:5] == ["rank", "dispatch"])
    assert line.split()[8] == f"{100 * d['ratio_same_size_copy']:.1f}%"


@pytest.mark.parametrize("world_size, gpus, share", [(1, 1, 0), (2, 2, 0), (4, 1, 25), (3, 1, 33), (8, 1, 12),
                                                       (8, 2, 25), (3, 2, 50), (4, 0, 25)])
def test_ranks_sharing_a_gpu_split_it_evenly_and_ranks_with_their_own_get_no_limit(world_size, gpus, share):
    assert launch.mps_share(world_size, gpus=gpus) == share


def test_the_result_records_how_many_gpus_the_ranks_ran_on(two_ranks):
    assert two_ranks["gpus"] == 1  # the default: every rank on one device
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    assert bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12, gpus=2)["gpus"] == 2


def test_a_run_with_x_in_the_buffer_is_marked_in_the_result_and_the_table(two_ranks):
    assert two_ranks["x_in_buffer"] is False
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    zc = bench.summarize(bench.bench_config("pull", 66), 2, ranks, roof=4.0e12, x_in_buffer=True)
    assert zc["x_in_buffer"] is True
    text = bench.table([two_ranks, zc])
    assert [ln.split()[1] for ln in text.splitlines() if ln.startswith("torch ")][::4] == ["push", "pull*"]
    assert "proto*: x built in Buffer.input_view, dispatched where it lies (no publish copy)" in text


def test_a_cached_dispatch_is_summarised_with_dispatch_bytes_and_named_in_the_table():
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    for rk in ranks:
        for lay in ("rank", "expert"):
            e = rk[lay]
            e["cached_dispatch"] = stats(e["dispatch"]["median_us"] / 2)
            e["cached_dispatch_host"] = stats(10.0)
            e["cached_dispatch_bytes"] = e["dispatch_bytes"]
    s = bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12)
    d, cd = s["layouts"]["rank"]["dispatch"], s["layouts"]["rank"]["cached_dispatch"]
    assert cd["median_us"] == pytest.approx(200.0) and cd["bytes"] == d["bytes"]
    assert cd["ratio_roofline"] == pytest.approx(2 * d["ratio_roofline"])
    text = bench.table([s])
    line = next(ln for ln in text.splitlines() if " rank   cached dispatch " in ln)
    assert line.split()[6] == "200.0"  # backend proto W layout "cached dispatch" µs
    assert "cached dispatch: dispatch(x, handle=...)" in text


@pytest.mark.parametrize("cached_baseline", [True, False])
def test_a_cached_dispatch_is_compared_with_plain_torch_along_a_routing_computed_once(cached_baseline):
    """Like for like: plain torch's cached baseline when the file has one; older files have only
    plain torch's whole dispatch, which every dispatch op was compared with."""
    rk = rank_result(300.0, 250.0, 80.0, 8000)
    for lay in ("rank", "expert"):
        e = rk[lay]
        e.update(cached_dispatch=stats(100.0), cached_dispatch_host=stats(10.0),
                 cached_dispatch_bytes=e["dispatch_bytes"], worst_dispatch=stats(150.0),
                 worst_dispatch_host=stats(10.0), worst_dispatch_bytes=e["dispatch_bytes"])
    cached = {"cached_dispatch": stats(400.0)} if cached_baseline else {}
    rk["torch"] = {lay: {"dispatch": stats(600.0), "combine": stats(500.0), **cached} for lay in ("rank", "expert")}
    s = bench.summarize(bench.bench_config("push", 66), 1, [rk], roof=4.0e12)["layouts"]["expert"]
    assert s["cached_dispatch"]["torch_us"] == (400.0 if cached_baseline else 600.0)
    assert s["cached_dispatch"]["speedup_vs_torch"] == pytest.approx(4.0 if cached_baseline else 6.0)
    assert s["dispatch"]["torch_us"] == s["worst_dispatch"]["torch_us"] == 600.0  # these route as plain torch does
    assert s["combine"]["torch_us"] == 500.0


def test_the_table_splits_dispatch_host_time_at_the_counts_wait(two_ranks):
    ranks = [rank_result(300.0, 250.0, 80.0, 8000), rank_result(400.0, 200.0, 120.0, 8200)]
    ranks[0]["rank"]["dispatch_host_phases"] = {"before_wait": stats(61.0), "wait": stats(33.0),
                                                "after_wait": stats(47.0)}
    s = bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12)
    lines = bench.table([s]).splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("dispatch, host wall time before / in / after"))
    assert lines[head + 1].split() == ["torch", "push", "2", "rank", "61", "/", "33", "/", "47"]
    assert not lines[head + 2].startswith("  torch")  # the expert layout had no phases
    assert "dispatch, host wall time" not in bench.table([two_ranks])


def test_the_dispatch_s_host_phases_are_printed_for_the_host_pass_and_the_timed_calls():
    ranks = [rank_result(300.0, 250.0, 80.0, 8000) for _ in range(2)]
    phases = {"before_wait": stats(120.0), "wait": stats(8.0), "after_wait": stats(95.0)}
    timed = {"before_wait": stats(130.0), "wait": stats(900.0), "after_wait": stats(150.0)}
    ranks[0]["rank"].update(dispatch_host_phases=phases, dispatch_host_phases_timed=timed)
    ranks[0]["expert"].update(dispatch_host_phases=phases)  # an older JSON: no timed split
    text = bench.table([bench.summarize(bench.bench_config("push", 66), 2, ranks, roof=4.0e12)])
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("  torch") and "/" in ln and "total" not in ln]
    assert ["rank", "120", "/", "8", "/", "95", "(timed", "calls:", "130", "/", "900", "/", "150)"] in \
        [ln[3:] for ln in lines]
    assert ["expert", "120", "/", "8", "/", "95"] in [ln[3:] for ln in lines]


def test_a_dispatch_s_marks_split_into_host_time_before_in_and_after_its_wait():
    """The bench keeps each dispatch's raw marks (entry, its wait's start and end, return) and
    splits them only after the timed calls; a dispatch that did not wait is left out."""
    marks = [(10.0, (10.5, 12.0), 12.25), (20.0, None, 20.5), (30.0, (31.0, 31.5), 32.0)]
    assert bench._host_phases(marks) == [(0.5, 1.5, 0.25), (1.0, 0.5, 0.5)]
    assert bench.HOST_PHASES == ("before_wait", "wait", "after_wait")
