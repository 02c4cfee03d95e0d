"""symmoe.bench.timeline reads the data kernels' stamps (csrc/common/stamps.cuh) into phases."""
import pytest
import torch

from symmoe.bench.timeline import MARKS, phases, table

SLOTS = 4  # warp slots per block in these synthetic timelines


def timeline(warps: dict[tuple[int, int], list[tuple[int, int]]], blocks: int = 2) -> torch.Tensor:
    """(block, warp) -> one (ns, clock) pair per mark, in MARKS' order (those past the list stay
    zero); other slots stay zero (warps that never ran)."""
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
