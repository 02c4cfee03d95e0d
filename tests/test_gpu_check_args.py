"""scripts/gpu_check.sh's section_pytest_args: which extra pytest arguments each section gets."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extra(env: dict[str, str], section: str) -> list[str]:
    """The arguments a section passes to pytest, as the script splits them (quoted -k kept whole)."""
    # The function alone: running gpu_check.sh would install packages and start MPS.
    fn = re.search(r"^section_pytest_args\(\) \{.*?^\}", (ROOT / "scripts" / "gpu_check.sh").read_text(), re.S | re.M)
    assert fn, "section_pytest_args() not found in scripts/gpu_check.sh"
    script = fn.group(0) + '\neval "extra=($(section_pytest_args "$1"))"; for a in "${extra[@]}"; do printf "%s\\n" "$a"; done'
    out = subprocess.run(["bash", "-c", script, "bash", section], env={"PATH": os.environ["PATH"], **env},
                         check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def test_every_section_takes_pytest_args():
    assert _extra({"PYTEST_ARGS": "-k pull"}, "nvshmem") == ["-k", "pull"]


def test_a_section_s_own_variable_replaces_them_for_that_section_alone():
    env = {"PYTEST_ARGS": "-k pull", "PYTEST_ARGS_FP8": "-k 'pack or torch_fp8'", "PYTEST_ARGS_TEST_QUICK": "-x"}
    assert _extra(env, "fp8") == ["-k", "pack or torch_fp8"]
    assert _extra(env, "test-quick") == ["-x"]
    assert _extra(env, "lowlat") == ["-k", "pull"]


def test_an_empty_section_variable_means_no_extra_arguments():
    assert _extra({"PYTEST_ARGS": "-k pull", "PYTEST_ARGS_LOWLAT": ""}, "lowlat") == []


def test_without_either_variable_a_section_adds_nothing():
    assert _extra({}, "test") == []
