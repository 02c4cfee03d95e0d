"""scripts/microbench/to_json.py: the row_copy printout of a committed GPU run becomes a results
JSON whose every row keeps its group, time and ratio to the run's own cudaMemcpy. CPU only."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TXT = ROOT / "results" / "session8" / "micro_row_copy_002dfa6.txt"


def to_json():
    spec = importlib.util.spec_from_file_location("to_json", ROOT / "scripts" / "microbench" / "to_json.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_timed_line_becomes_a_row_of_its_group():
    doc = to_json().parse(TXT.read_text())
    assert doc["device"] == "NVIDIA H200" and doc["shape"].startswith("4096 rows of 14336 B")
    groups = [r["group"] for r in doc["rows"]]
    assert groups[0] == "roofline" and doc["rows"][0]["name"] == "cudaMemcpy D2D"
    assert groups.count("copy, identity rows") == groups.count("copy, permuted rows") == 20
    assert groups.count("reduce, rank-major (1 slot per token)") == 9
    assert not any(r["mismatch"] for r in doc["rows"])


def test_ratios_are_against_the_memcpy_of_the_same_run():
    rows = to_json().parse(TXT.read_text())["rows"]
    memcpy = rows[0]
    for r in rows[1:]:
        if r["group"].startswith("copy"):  # same bytes as the memcpy: the ratio is a time ratio
            assert r["ratio_memcpy"] == pytest.approx(memcpy["us"] / r["us"], abs=0.006)


def test_a_mismatch_is_kept_and_a_foreign_file_is_refused(tmp_path):
    mod = to_json()
    text = TXT.read_text().replace("37.6 us   3.12 TB/s  0.934", "37.6 us   3.12 TB/s  0.934  MISMATCH", 1)
    assert sum(r["mismatch"] for r in mod.parse(text)["rows"]) == 1
    with pytest.raises(ValueError, match="not a row_copy printout"):
        mod.parse("hello\n")
    (tmp_path / "m.txt").write_text(TXT.read_text())
    assert mod.main([str(tmp_path / "m.txt"), "--commit", "abc1234", "--command", "x"]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["commit"], doc["command"], len(doc["rows"])) == ("abc1234", "x", 59)
