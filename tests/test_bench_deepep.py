"""The side-by-side benchmark against DeepEP V1 (symmoe.bench.deepep): how ranks' timings become
a table. The timed runs need a GPU (and DeepEP, optional); what they produce is checked here."""
import pytest

from symmoe.bench import deepep
from symmoe.errors import ConfigError


def _rank(us: dict[str, float], same: bool = True, T: str = "512") -> dict:
    return {"cells": {T: {"median_us": {n: {op: v for op in deepep.OPS} for n, v in us.items()},
                          "bitwise_vs_deepep": {n: {"recv_x": same, "combined_x": True}
                                                for n in us if n != "deepep"}}},
            "notes": {}}


def test_each_cell_takes_the_slowest_ranks_median_and_its_ratio_to_deepep():
    ranks = [_rank({"deepep": 200.0, "torch-push": 100.0}), _rank({"deepep": 180.0, "torch-push": 125.0})]
    res = deepep.summarize(2, ranks, ["deepep", "torch-push"], "default")
    row = next(r for r in res["rows"] if r["op"] == "dispatch")
    assert row["us"] == {"deepep": 200.0, "torch-push": 125.0}
    assert row["ratio"] == {"torch-push": 1.6}  # DeepEP's time / symmoe's: above 1, symmoe is faster
    assert [r["op"] for r in res["rows"]] == list(deepep.OPS)


def test_every_implementation_runs_right_after_each_other_equally_often():
    class Impl:
        def __init__(self, name: str):
            self.name = name

    impls = [Impl("deepep"), Impl("torch-push"), Impl("torch-pull")]
    calls = []
    times = deepep.timed_rounds(impls, ("dispatch", "combine"), 6,
                                lambda im, op: calls.append((im.name, op)) or float(len(calls)))
    order = [calls[i][0] for i in range(0, len(calls), 2)]  # implementation by implementation
    rounds = [order[i:i + 3] for i in range(0, len(order), 3)]
    assert rounds[0] == ["deepep", "torch-push", "torch-pull"]
    after_deepep = [r[r.index("deepep") + 1] for r in rounds if r[-1] != "deepep"]
    assert sorted(after_deepep) == ["torch-pull", "torch-pull", "torch-push", "torch-push"]
    assert {n: {op: len(v) for op, v in t.items()} for n, t in times.items()} == \
        {n: {"dispatch": 6, "combine": 6} for n in ("deepep", "torch-push", "torch-pull")}
    assert times["torch-push"]["dispatch"][0] == 3.0  # each time filed under its own implementation


def test_outputs_count_as_equal_to_deepep_only_when_every_rank_matched():
    ranks = [_rank({"deepep": 1.0, "a": 1.0}), _rank({"deepep": 1.0, "a": 1.0}, same=False)]
    assert deepep.summarize(2, ranks, ["deepep", "a"], "default")["bitwise_vs_deepep"] == {"512": {"a": False}}
    ranks[1] = _rank({"deepep": 1.0, "a": 1.0})
    assert deepep.summarize(2, ranks, ["deepep", "a"], "default")["bitwise_vs_deepep"] == {"512": {"a": True}}


def test_without_deepep_the_table_has_times_and_no_ratios():
    res = deepep.summarize(4, [_rank({"a": 50.0})], ["a"], "split")
    assert all(r["ratio"] == {} and r["us"] == {"a": 50.0} for r in res["rows"])
    md = deepep.markdown([res])
    assert md.splitlines()[0] == "| W | tokens/rank | op | a |"
    assert "| 4 | 512 | combine | 50 |" in md


def test_the_markdown_puts_deepep_first_and_each_ratio_beside_its_time():
    res = deepep.summarize(2, [_rank({"torch-push": 100.0, "deepep": 150.0})], ["deepep", "torch-push"], "default")
    lines = deepep.markdown([res]).splitlines()
    assert lines[0] == "| W | tokens/rank | op | deepep | torch-push |"
    assert "| 2 | 512 | dispatch | 150 | 100 (1.50) |" in lines


def test_the_markdown_marks_a_cell_whose_outputs_differ_from_deepeps_and_says_so():
    res = deepep.summarize(2, [_rank({"torch-push": 100.0, "deepep": 150.0}, same=False)], ["deepep", "torch-push"],
                           "default")
    lines = deepep.markdown([res]).splitlines()
    assert "| 2 | 512 | dispatch | 150 | 100 (1.50) ≠ |" in lines
    assert lines[-1] == "≠ outputs not bitwise equal to DeepEP's: torch-push at W=2, 512 tokens"
    same = deepep.summarize(2, [_rank({"torch-push": 100.0, "deepep": 150.0})], ["deepep", "torch-push"], "default")
    assert "≠" not in deepep.markdown([same])


def test_a_config_argument_is_a_named_file_with_overrides(tmp_path):
    name, cfg = deepep._config_arg("push20=configs/torch.yaml,protocol=push,kernel.num_sms=20")
    assert name == "push20" and cfg["protocol"] == "push" and cfg["kernel"]["num_sms"] == 20
    with pytest.raises(Exception, match="NAME=PATH"):
        deepep._config_arg("configs/torch.yaml")
    with pytest.raises(ConfigError):
        deepep._config_arg("x=configs/torch.yaml,kernel.num_sms=zero")


def test_without_a_gpu_the_command_says_so_and_fails(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the command would run")
    assert deepep.main(["--world-sizes", "2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_ranks_keep_the_default_mps_share_unless_a_put_protocol_runs(monkeypatch):
    """DeepEP V1 needs MPS's default share; nvshmem's push on the device API needs the shares
    split, but on one node nvshmem runs the shared kernels, so 'auto' splits only when that
    push is forced."""
    monkeypatch.setattr(deepep.launch, "mps_share", lambda world_size: 100 // world_size)
    monkeypatch.delenv("SYMMOE_NVSHMEM_PUTS", raising=False)
    monkeypatch.delenv("SYMMOE_NVSHMEM_STAGE", raising=False)
    share = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    assert share not in deepep.rank_env(4, "auto", "torch", "nvshmem")
    assert deepep.rank_env(4, "split", "torch")[share] == "25"
    monkeypatch.setenv("SYMMOE_NVSHMEM_PUTS", "1")
    assert deepep.rank_env(4, "auto", "torch", "nvshmem")[share] == "25"
    assert share not in deepep.rank_env(4, "auto", "torch")
    assert share not in deepep.rank_env(4, "default", "nvshmem")


def test_fp8_ops_get_their_own_rows_beside_the_bf16_ops_of_the_same_run():
    rank = _rank({"deepep": 200.0, "torch-push": 100.0})
    for n in ("deepep", "torch-push"):
        rank["cells"]["512"]["median_us"][n].update({"fp8_dispatch": 80.0 if n == "torch-push" else 120.0,
                                                     "fp8_cached_dispatch": 60.0})
    res = deepep.summarize(2, [rank], ["deepep", "torch-push"], "default")
    assert [r["op"] for r in res["rows"]] == list(deepep.OPS) + ["fp8_dispatch", "fp8_cached_dispatch"]
    row = next(r for r in res["rows"] if r["op"] == "fp8_dispatch")
    assert row["us"] == {"deepep": 120.0, "torch-push": 80.0} and row["ratio"] == {"torch-push": 1.5}
    assert "| 2 | 512 | fp8_dispatch | 120 | 80 (1.50) |" in deepep.markdown([res])


def test_the_report_says_the_bytes_an_fp8_row_moves_beside_a_bf16_row():
    rows = deepep.fp8_rows("float32")
    assert rows == {"scales": "float32", "fp8_row_bytes": 7392, "bf16_row_bytes": 14336, "ratio": 0.516}
    assert deepep.fp8_rows_line(rows) == "FP8 rows (float32 scales) move 7392 bytes each, bfloat16 rows 14336 (0.52x).\n"
    assert deepep.fp8_rows("ue8m0")["fp8_row_bytes"] == 7232


def test_fp8_outputs_are_equal_only_when_the_e4m3_bytes_and_the_scales_are():
    import torch
    from symmoe import fp8
    data, sf = fp8.quantize(torch.randn(6, 256))
    col_major = fp8.mn_major_like(sf)  # DeepEP may lay its scales out otherwise: values count, not strides
    assert deepep._bitwise((data, sf), (data.clone(), col_major))
    flipped = data.view(torch.uint8).clone()
    flipped[2, 7] ^= 1
    assert not deepep._bitwise((flipped.view(torch.float8_e4m3fn), sf), (data, sf))
    assert not deepep._bitwise((data, sf), (data, sf + 1))
    assert not deepep._bitwise((data, sf), data)


def test_the_fp8_option_names_its_scale_kinds(capsys):
    with pytest.raises(SystemExit):
        deepep.main(["--fp8", "e5m2"])
    assert "invalid choice: 'e5m2' (choose from 'none', 'float32', 'ue8m0')" in capsys.readouterr().err


def test_host_split_times_each_named_layer_and_kernel_method_then_puts_them_back():
    class Kernels:  # a pybind11 object's stand-in: methods only
        def launch(self, n):
            return n + 1

    class Engine:
        def __init__(self):
            self.kernels = Kernels()

        def step(self):
            return self.kernels.launch(1) + self.kernels.launch(2)

    eng = Engine()
    calls, syncs = [], []
    split = deepep.host_split(lambda: calls.append(eng.step()), lambda: syncs.append(1),
                              [(eng, "step", "engine.step"), (eng, "absent", "never")], [(eng, "kernels", "k")],
                              calls=3, device_sync=lambda: None)
    assert calls == [5, 5, 5] and syncs == [1, 1, 1]
    assert set(split) == {"call", "engine.step", "k.launch"}  # what does not exist is not timed
    assert all(v >= 0 for v in split.values()) and split["call"] >= split["engine.step"] >= split["k.launch"]
    assert list(split) == sorted(split, key=lambda k: -split[k])
    assert "step" not in eng.__dict__ and type(eng.kernels) is Kernels  # as they were


def test_deepep_keeps_its_sms_unless_every_rank_could_not_be_resident_at_once():
    assert deepep.deepep_num_sms(2, 132) == 20
    assert deepep.deepep_num_sms(4, 132) == 20
    assert deepep.deepep_num_sms(8, 132) == 16  # 8 x 20 > 132: its senders spun on blocks never scheduled
    assert deepep.deepep_num_sms(8, 132, default=24) == 16
    assert deepep.deepep_num_sms(6, 132) == 20
    assert deepep.deepep_num_sms(7, 132) == 18  # even: DeepEP makes a channel of every two SMs


def test_the_markdown_says_where_deepep_ran_at_fewer_sms():
    res = deepep.summarize(8, [{**_rank({"deepep": 300.0, "a": 200.0}), "deepep_num_sms": 16}], ["deepep", "a"],
                           "default")
    assert res["deepep_num_sms"] == 16
    md = deepep.markdown([res, {**res, "world_size": 2, "deepep_num_sms": 20}])
    assert md.rstrip().splitlines()[-1].endswith("per rank, so that every rank's blocks are resident at once: 16 at W=8")
