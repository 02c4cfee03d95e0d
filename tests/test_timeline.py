"""symmoe.bench.timeline reads the data kernels' stamps (csrc/common/stamps.cuh) into phases."""
import pytest
import torch

from symmoe.bench.timeline import MARKS, ROUTED_MARKS, ROUTED_PHASES, phases, rows_at, rows_table, table

SLOTS = 4  # warp slots per block in these synthetic timelines


def timeline(warps: dict[tuple[int, int], list[tuple[int, int]]], blocks: int = 2) -> torch.Tensor:
    """(block, warp) -> one (ns, clock) pair per mark, in MARKS' order (those past the list stay
    zero: the routing chunk's own marks); other slots stay zero (warps that never ran)."""
    t = torch.zeros(blocks, SLOTS, len(MARKS), 2, dtype=torch.int64)
    for (b, w), marks in warps.items():
        t[b, w, :len(marks)] = torch.tensor(marks)
    return t.flatten()


def marks_at(start_ns: int, offsets_ns: list[int], ghz: float = 2.0, clock0: int = 10_000) -> list[tuple[int, int]]:
    return [(start_ns + o, clock0 + int(o * ghz)) for o in offsets_ns]


def test_phases_split_each_warp_and_place_warps_by_the_globaltimer():
    # warp A starts first; warp B 1 µs later and ends last.
    # marks: enter, checked, tables, built, planned, routed, first_push, loop_end, flushed
    a = marks_at(1_000_000, [0, 400, 1_000, 1_600, 2_000, 2_300, 2_500, 30_000, 31_000])
    b = marks_at(1_001_000, [0, 600, 1_800, 2_400, 3_000, 3_300, 3_500, 32_000, 34_000])
    p = phases(timeline({(0, 0): a, (1, 2): b}), SLOTS)
    assert p["warps"] == 2
    assert p["clock_ghz"] == pytest.approx(2.0)
    assert p["error check"] == pytest.approx({"min": 0.4, "median": 0.5, "max": 0.6})
    assert p["plan"] == pytest.approx({"min": 1.2, "median": 1.5, "max": 1.8})
    assert p["tables"]["max"] == pytest.approx(1.2) and p["checks"]["min"] == pytest.approx(0.6)
    assert p["first route"]["median"] == pytest.approx(0.3) and p["first load"]["median"] == pytest.approx(0.2)
    assert p["prologue"] == pytest.approx({"min": 2.0, "median": 2.5, "max": 3.0})
    assert p["loop"]["max"] == pytest.approx(28.5)
    assert p["drain"] == pytest.approx({"min": 1.0, "median": 1.5, "max": 2.0})
    assert p["start"] == pytest.approx({"min": 0.0, "median": 0.5, "max": 1.0})
    assert p["end"]["max"] == pytest.approx(35.0)
    assert p["span"] == pytest.approx(35.0)


def test_phases_leave_out_warps_that_missed_a_mark():
    full = marks_at(5_000, [0, 100, 300, 500, 1_000, 1_100, 1_200, 9_000, 9_500])
    partial = [m if i < 2 else (0, 0) for i, m in enumerate(marks_at(5_000, [0, 100, 300, 500, 1_000, 1_100, 1_200, 9_000, 9_500]))]
    p = phases(timeline({(0, 1): full, (1, 0): partial}), SLOTS)
    assert p["warps"] == 1
    assert p["span"] == pytest.approx(9.5)


def test_phases_of_a_kernel_with_fewer_marks_leave_out_the_phases_it_cannot_measure():
    marks = ("enter", "planned", "first_push", "loop_end", "flushed")
    t = torch.zeros(1, SLOTS, len(marks), 2, dtype=torch.int64)
    t[0, 0] = torch.tensor(marks_at(7, [0, 1_000, 1_100, 8_000, 9_000]))
    p = phases(t.flatten(), SLOTS, marks)
    assert "plan" not in p and p["prologue"]["median"] == pytest.approx(1.0)


def test_phases_refuse_a_buffer_of_the_wrong_size_or_without_stamps():
    with pytest.raises(ValueError, match="whole number of blocks"):
        phases(torch.zeros(SLOTS * len(MARKS) * 2 + 1, dtype=torch.int64), SLOTS)
    with pytest.raises(ValueError, match="no warp stamped every mark"):
        phases(torch.zeros(SLOTS * len(MARKS) * 2, dtype=torch.int64), SLOTS)


def test_table_names_every_phase():
    p = phases(timeline({(0, 0): marks_at(1, [0, 100, 300, 500, 1_000, 1_050, 1_100, 8_000, 9_000])}), SLOTS)
    text = "\n".join(table("torch/push rank cached dispatch", p))
    for name in ("start", "error check", "tables", "checks", "plan", "mover set-up", "prologue", "first route",
                 "first load", "first push", "loop", "drain", "warp", "end", "span"):
        assert name in text


def test_the_routed_kernel_s_phases_and_each_mark_on_the_grid_s_clock():
    # ROUTED_MARKS: enter, ticket, chunk routed, routing end, marks + plan, round 0 landed, stored,
    # chunk counted (loop_end's slot), end, then the chunk's own: its pairs walked, its counts
    # scanned; b routes no chunk (counted with its ticket, no walk of its own)
    assert [m for m in ROUTED_MARKS if m not in MARKS] == ["counted"]
    assert ROUTED_MARKS.index("counted") == MARKS.index("loop_end")
    a = marks_at(2_000_000, [0, 1_000, 4_000, 4_000, 9_000, 10_000, 40_000, 2_500, 130_000, 1_800, 2_200])
    b = marks_at(2_000_500, [0, 1_500, 1_500, 7_500, 9_500, 10_500, 41_000, 1_500, 131_000])
    p = phases(timeline({(0, 0): a, (1, 3): b}), SLOTS, ROUTED_MARKS, ROUTED_PHASES)
    assert p["phases"] == [name for name, _, _ in ROUTED_PHASES]
    assert p["route chunk"] == pytest.approx({"min": 0.0, "median": 1.5, "max": 3.0})
    assert p["chunk count"] == pytest.approx({"min": 0.0, "median": 0.75, "max": 1.5})
    assert p["chunk place"]["max"] == pytest.approx(1.5)
    # the chunk's count split where it was walked and scanned: over a alone, the one that routes
    assert p["count walk"] == pytest.approx({"min": 0.8, "median": 0.8, "max": 0.8})
    assert p["count scan"]["median"] == pytest.approx(0.4) and p["count mark"]["median"] == pytest.approx(0.3)
    assert p["at"]["scanned"] == pytest.approx({"min": 2.2, "median": 2.2, "max": 2.2})
    assert p["later rounds"]["max"] == pytest.approx(90.0)
    assert p["routing end"]["max"] == pytest.approx(6.0)
    assert p["to first store"] == pytest.approx({"min": 10.0, "median": 10.25, "max": 10.5})
    assert p["at"]["planned"] == pytest.approx({"min": 9.0, "median": 9.5, "max": 10.0})
    assert p["at"]["built"]["max"] == pytest.approx(8.0)
    assert "error check" not in p
    text = "\n".join(table("torch/push expert dispatch with routing", p, at=True))
    assert "marks + plan" in text and "at (µs after the first warp's enter)" in text and "planned" in text


def test_rows_at_gives_each_block_row_its_last_warp_s_mark_and_leaves_rows_that_never_ran_empty():
    # row 0: two warps (the later one routes longer); row 1: one warp that stops after the ticket;
    # row 2: never ran
    a = marks_at(3_000_000, [0, 500, 9_000, 9_000, 10_000, 11_000, 12_000, 50_000, 50_000])
    b = marks_at(3_000_250, [0, 750, 12_750, 12_750, 13_750, 14_000, 15_000, 51_000, 51_000])
    c = [m if i < 2 else (0, 0) for i, m in enumerate(marks_at(2_999_000, [0, 400, 0, 0, 0, 0, 0, 0, 0]))]
    r = rows_at(timeline({(0, 0): a, (0, 3): b, (1, 1): c}, blocks=3), SLOTS, ("checked", "tables", "flushed"))
    assert r["checked"] == pytest.approx([2.0, 0.4, None])  # µs after row 1's enter, the first
    assert r["tables"][0] == pytest.approx(14.0) and r["tables"][1:] == [None, None]
    assert r["flushed"][0] == pytest.approx(52.25)
    text = "\n".join(rows_table(r, every=2))
    assert "ticket" in text and "tables" in text and "    -" in text
    with pytest.raises(ValueError, match="enter"):
        rows_at(torch.zeros(2 * SLOTS * len(MARKS) * 2, dtype=torch.int64), SLOTS, ("tables",))


def test_probe_inputs_are_the_bench_s_world_size_one_inputs_and_a_copy_of_their_bytes():
    from symmoe.bench.gpu import DEEPSEEK_V3, _inputs, probe_inputs

    x, idx, w, src, dst = probe_inputs(torch.device("cpu"))
    T, H = DEEPSEEK_V3["buffer.max_tokens_per_rank"], DEEPSEEK_V3["buffer.hidden"]
    x0, idx0, w0 = _inputs(T, H, DEEPSEEK_V3["buffer.topk"], DEEPSEEK_V3["buffer.num_experts"], 1, 0, 0,
                           torch.device("cpu"))
    assert torch.equal(x, x0) and torch.equal(idx, idx0) and torch.equal(w, w0)
    assert src.numel() == dst.numel() == x.numel() * x.element_size() and src.dtype == torch.uint8


def test_marks_mirror_the_kernels_stamp_enum():
    import re
    from pathlib import Path

    from symmoe.bench.timeline import words

    text = (Path(__file__).resolve().parent.parent / "csrc" / "common" / "stamps.cuh").read_text()
    enum = text[text.index("enum StampMark"):text.index("};", text.index("enum StampMark"))]
    names = re.findall(r"\bkStamp(\w+)", enum)
    assert names[-1] == "Marks"  # the count, not a mark
    assert [re.sub(r"(?<!^)([A-Z])", r"_\1", n).lower() for n in names[:-1]] == list(MARKS)
    assert words(16) == 16 * len(MARKS) * 2
