"""GPU tests that cannot run (no GPU, or their backend unusable) skip with the reason printed
(pytest -rs, from pyproject), except on the GPU machine: there scripts/gpu_check.sh sets
SYMMOE_REQUIRE_GPU=1 and they fail, so a broken GPU setup never passes as a row of skips."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REQUIRE_GPU_ENV, gpu_unusable


def test_a_gpu_test_that_cannot_run_skips_saying_why(monkeypatch):
    monkeypatch.delenv(REQUIRE_GPU_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="^nccl backend unusable here: nccl4py missing$"):
        gpu_unusable("nccl backend unusable here: nccl4py missing")


def test_with_symmoe_require_gpu_it_fails_saying_why(monkeypatch):
    monkeypatch.setenv(REQUIRE_GPU_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"^nccl backend unusable here: nccl4py missing "
                                                    r"\(SYMMOE_REQUIRE_GPU=1: GPU tests must run here\)$"):
        gpu_unusable("nccl backend unusable here: nccl4py missing")


def _pytest_without_a_gpu(require: str, tests: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", REQUIRE_GPU_ENV: require}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_without_a_gpu_the_gpu_tests_skip_on_one_line_with_the_reason_or_fail_where_a_gpu_is_required():
    skipped = _pytest_without_a_gpu("0", "tests/gpu")
    assert skipped.returncode == 0, skipped.stdout
    assert re.search(r"^SKIPPED \[\d+\] tests/conftest\.py:\d+: needs a CUDA GPU \(none here\)$", skipped.stdout,
                     re.M), skipped.stdout  # -rs: every GPU test, one line
    failed = _pytest_without_a_gpu("1", "tests/gpu/test_nccl.py::test_window_peer_bases_and_local_view")
    assert failed.returncode == 1, failed.stdout
    assert "needs a CUDA GPU (none here) (SYMMOE_REQUIRE_GPU=1: GPU tests must run here)" in failed.stdout
