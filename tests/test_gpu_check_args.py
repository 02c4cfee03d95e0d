"""scripts/gpu_check.sh: which extra pytest arguments each section gets, and what a run brings back."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shell_function(script: str, name: str) -> str:
    """The definition of shell function ``name`` in scripts/``script``: run alone, since running
    the script would install packages and start MPS."""
    fn = re.search(rf"^{name}\(\) \{{.*?^\}}", (ROOT / "scripts" / script).read_text(), re.S | re.M)
    assert fn, f"{name}() not found in scripts/{script}"
    return fn.group(0)


def _extra(env: dict[str, str], section: str) -> list[str]:
    """The arguments a section passes to pytest, as the script splits them (quoted -k kept whole)."""
    script = _shell_function("gpu_check.sh", "section_pytest_args") + '\neval "extra=($(section_pytest_args "$1"))"; for a in "${extra[@]}"; do printf "%s\\n" "$a"; done'
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


# -- what a run brings back ------------------------------------------------------------------
def test_every_json_a_section_writes_is_among_the_files_a_run_brings_back():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    written = set(re.findall(r'--json "\$LOG/([\w./]+)"', script))
    brought = re.search(r"^finish_run (.*)$", script, re.M).group(1).split()
    assert written and written <= set(brought), sorted(written - set(brought))


def test_the_logs_tarball_leaves_out_the_deepep_and_deepgemm_builds_but_keeps_their_logs(tmp_path):
    log, out = tmp_path / "log", tmp_path / "out"
    for f in ("deep_ep/deep_ep/_C.so", "deep_gemm/deep_gemm/_C.so", "deepep_build.log", "fp8_bench.json"):
        (log / f).parent.mkdir(parents=True, exist_ok=True)
        (log / f).write_text("x")
    out.mkdir()
    script = f'LOG={log}; OUT={out}; SUMMARY=(one); ' + _shell_function("gpu_env.sh", "finish_run") + '\nfinish_run fp8_bench.json > /dev/null'
    subprocess.run(["bash", "-c", script], check=True, env={"PATH": os.environ["PATH"]})
    listed = subprocess.run(["tar", "tzf", str(out / "logs.tar.gz")], check=True, capture_output=True,
                            text=True).stdout.split()
    assert "./deepep_build.log" in listed and "./fp8_bench.json" in listed
    assert not [f for f in listed if f.startswith(("./deep_ep", "./deep_gemm"))]
    assert (out / "fp8_bench.json").exists() and (out / "summary.txt").read_text() == "one\n"
