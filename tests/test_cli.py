"""The symmoe command line."""
import json
import os
import subprocess
import sys

import pytest

from symmoe.cli import main


def symmoe(*args, env=None):
    return subprocess.run([sys.executable, "-m", "symmoe.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_info_lists_every_backend_with_a_status():
    out = symmoe("info")
    assert out.returncode == 0, out.stderr
    for name in ["host", "torch", "nvshmem", "nccl"]:
        line = next(l for l in out.stdout.splitlines() if l.startswith(name + " "))
        _, _, status, *detail = line.split(maxsplit=3)
        assert status in ("usable", "unusable"), line
        assert status == "usable" or detail and len(detail[0]) > 10, f"no reason given: {line}"
    host = next(l for l in out.stdout.splitlines() if l.startswith("host "))
    assert " usable " in host


def test_size_lists_regions_that_add_up():
    out = symmoe("size", "configs/torch.yaml", "--world-size", "8")
    assert out.returncode == 0, out.stderr
    rows = {l.split()[0]: l.split() for l in out.stdout.splitlines()[2:] if not l.startswith("#")}
    assert set(rows) == {"signals", "counts", "input", "recv", "combine", "total"}
    assert sum(int(rows[r][2]) for r in ["signals", "counts", "input", "recv", "combine"]) == int(rows["total"][1])
    # torch.yaml pushes: senders store rows into each receiver's pool of 4096 rows per peer
    assert "# recv: a pool of 32768 rows (torch/push); a rank receives at most 266208 rows" in out.stdout
    assert int(rows["recv"][2]) >= 32768 * 7168 * 2  # the rows, and their metadata


def test_size_of_a_pull_config_has_no_receive_pool(tmp_path):
    """Receivers read the sources' inputs, so no receive pool, whatever they receive."""
    cfg = tmp_path / "pull.yaml"
    cfg.write_text(open("configs/torch.yaml").read().replace("protocol: push", "protocol: pull"))
    out = symmoe("size", str(cfg), "--world-size", "8")
    assert out.returncode == 0, out.stderr
    assert "# recv: a pool of 0 rows (torch/pull); a rank receives at most 266208 rows" in out.stdout
    rows = {l.split()[0]: l.split() for l in out.stdout.splitlines()[2:] if not l.startswith("#")}
    assert int(rows["recv"][2]) == 1024


def test_bench_spawns_ranks_and_reports_each(tmp_path):
    out = symmoe("bench", "configs/host.yaml", "--world-size", "2", "--repeats", "3", "--warmup", "1",
                 "--tokens", "32", "--json", str(tmp_path / "b.json"))
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert {"date", "commit", "device", "torch"} <= set(data) and data["command"].startswith("symmoe bench")
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["dispatch"]["n"] == 3 and r["dispatch"]["median_s"] > 0 for r in data["ranks"])
    assert "bench host/push" in out.stderr  # the progress bar


def test_bench_reports_a_bad_config_without_traceback(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("backend: host\nbuffer:\n  num_experts: 63\n")
    out = symmoe("bench", str(p), "--world-size", "2")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "must be divisible by the world size (2)" in out.stderr


def test_check_compares_every_config_with_the_reference_and_prints_the_seed():
    small = ["--set", "buffer.max_tokens_per_rank=48", "--set", "buffer.hidden=64"]
    out = symmoe("check", "configs/host.yaml", "configs/ab/../host.yaml", "--world-size", "2", *small)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum("bitwise equal to symmoe.reference on every one of 2 ranks: 12 cases" in l for l in lines) == 2, out.stdout
    assert lines[-1].startswith("seed ")
    zc = symmoe("check", "configs/host.yaml", "--world-size", "2", "--x-in-buffer", "--cached", *small)
    assert zc.returncode == 0, zc.stderr
    assert ("12 cases (6 routings x 2 layouts x 1, x built in Buffer.input_view); cached dispatch (handle=...): "
            "12 cases") in zc.stdout
    bad = symmoe("check", "configs/host.yaml", "--set", "buffer.topk=99", *small)
    assert bad.returncode == 1 and "buffer.topk" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_and_ab_run_under_torchrun_and_exit_cleanly(tmp_path):
    for args in (["-m", "symmoe.cli", "check", "configs/host.yaml", "--set", "buffer.max_tokens_per_rank=32",
                  "--set", "buffer.hidden=64"],
                 ["-m", "symmoe.cli", "bench", "configs/host.yaml", "--repeats", "2", "--warmup", "1", "--tokens", "16"],
                 ["-m", "symmoe.ab", "configs/ab/quickstart.yaml", "--repeats", "2", "--warmup", "1",
                  "--out", str(tmp_path / "ab"), "--quiet", "--no-plot"]):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                              "--standalone", *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "SIGABRT" not in out.stderr
    assert (tmp_path / "ab" / "results.json").exists()


# -- bad input: one line naming the value and what is allowed, no traceback, exit status != 0 ------
@pytest.mark.parametrize("command", [["size", "configs/torch.yaml"], ["check", "configs/host.yaml"],
                                     ["bench", "configs/host.yaml"], ["ab", "configs/ab/quickstart.yaml"]],
                         ids=lambda c: c[0])
@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_every_command_taking_a_world_size_refuses_one_below_1(command, bad, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--world-size", bad])
    assert e.value.code != 0
    assert f"argument --world-size: '{bad}': the world size (ranks) must be an integer >= 1" in capsys.readouterr().err


def test_check_and_bench_of_a_gpu_config_without_a_gpu_name_the_backend_that_needs_one():
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for command in ("check", "bench"):
        out = symmoe(command, "configs/torch.yaml", env=no_gpu)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr == ("symmoe: error: configs/torch.yaml: backend 'torch' needs a CUDA GPU and none is "
                              "visible here; use a host config (configs/host.yaml)\n")


def test_tune_and_the_deepep_side_by_side_need_a_gpu_and_say_so(capsys):
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for command in (["tune", "configs/torch.yaml"], ["bench", "configs/torch.yaml", "--against", "deepep"]):
        out = symmoe(*command, env=no_gpu)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert "backend 'torch' needs a CUDA GPU" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_tune_refuses_the_host_backend_which_has_no_launch_settings(capsys):
    assert main(["tune", "configs/host.yaml"]) == 1
    assert "the host backend has no launch settings to tune" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["config", "check"], ["size"], ["check"], ["bench"], ["ab"]], ids=" ".join)
def test_a_directory_or_a_binary_file_given_as_config_or_spec_is_named(command, tmp_path, capsys):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe" * 16)
    what = "spec" if command == ["ab"] else "config"
    for path, problem in ((str(tmp_path), f"is a directory; expected a {what} YAML file"),
                          (str(binary), f"not a text file (byte 0 is not UTF-8); expected a {what} YAML file")):
        assert main([*command, path]) != 0
        err = capsys.readouterr().err
        assert f"{path}: <file> = '{path}': {problem}" in err and len(err.strip().splitlines()) == 1, err


def test_config_check_takes_several_files_and_reports_each(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("buffer:\n  topk: x\n")
    assert main(["config", "check", "configs/host.yaml", str(bad), "configs/torch.yaml"]) == 1
    cap = capsys.readouterr()
    assert "# configs/host.yaml: valid" in cap.out and "# configs/torch.yaml: valid" in cap.out
    assert cap.err == f"symmoe: error: {bad}: buffer.topk = 'x': expected an integer\n"
    assert main(["config", "check", "configs/host.yaml", "configs/torch.yaml"]) == 0
