"""scripts/baseline_tree.sh: another commit's sources beside this tree, for a baseline
measured in the same GPU call."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "baseline_tree.sh"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def in_git_checkout():
    try:
        _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def test_the_tree_holds_the_commits_sources(in_git_checkout, tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), "HEAD", str(tmp_path)], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    rev = _git("rev-parse", "--short", "HEAD")
    tree = Path(out)
    assert tree == tmp_path / rev
    for part in ("pyproject.toml", "symmoe/buffer.py", "backends", "csrc/kernels/dispatch.cuh", "scripts/gpu_check.sh"):
        assert (tree / part).exists(), part
    assert (tree / "csrc/kernels/dispatch.cuh").read_bytes() == _git_bytes("HEAD:csrc/kernels/dispatch.cuh")


def _git_bytes(obj: str) -> bytes:
    return subprocess.run(["git", "show", obj], cwd=ROOT, check=True, capture_output=True).stdout


def test_a_name_that_is_no_commit_is_refused_naming_it(in_git_checkout, tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "no-such-rev-xyz", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert "'no-such-rev-xyz' is not a commit" in r.stderr
    assert not any(tmp_path.iterdir())
