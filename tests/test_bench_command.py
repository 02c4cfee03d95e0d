"""scripts/gpu_env.sh's bench_command: what a results JSON records as its command."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench_command(env: dict[str, str], *args: str) -> str:
    # The function alone: sourcing gpu_env.sh would install packages and query the GPU.
    fn = re.search(r"^bench_command\(\) \{.*?^\}", (ROOT / "scripts" / "gpu_env.sh").read_text(), re.S | re.M)
    assert fn, "bench_command() not found in scripts/gpu_env.sh"
    script = fn.group(0) + '\nbench_command "$@"'
    out = subprocess.run(["bash", "-c", script, "bash", *args], env={"PATH": os.environ["PATH"], **env},
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_the_command_names_the_variables_that_chose_the_run():
    env = {"BENCH_SET": "kernel.fan_phases=off kernel.num_sms=64", "BENCH_REPEATS": "20", "UNRELATED": "x"}
    assert _bench_command(env, "scripts/gpu_check.sh", "bench") == (
        "BENCH_REPEATS='20' BENCH_SET='kernel.fan_phases=off kernel.num_sms=64' scripts/gpu_check.sh bench")


def test_without_such_variables_the_command_is_the_script_alone():
    assert _bench_command({}, "scripts/multigpu_check.sh", "bench") == "scripts/multigpu_check.sh bench"
