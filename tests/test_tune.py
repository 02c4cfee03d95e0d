"""symmoe tune: which knobs it searches for a backend, and how it ranks candidates. The timed
search needs a GPU; its choices are checked here from given times."""
import math

from symmoe.bench import tune
from symmoe.config import Config


def test_torch_searches_protocol_sms_push_mode_and_copy_depth_within_the_devices_sms():
    knobs = tune.knobs_for(Config().replace(backend="torch"), sms=78)
    assert list(knobs) == ["protocol", "kernel.num_sms", "kernel.push_mode", "kernel.copy_depth"]
    assert max(knobs["kernel.num_sms"]) <= 78 and 20 in knobs["kernel.num_sms"]


def test_nvshmem_has_one_protocol_and_searches_its_channels_instead():
    knobs = tune.knobs_for(Config().replace(backend="nvshmem"), sms=132)
    assert "protocol" not in knobs and "kernel.push_mode" not in knobs
    assert knobs["kernel.num_channels"] == tune.KNOBS["kernel.num_channels"]


def test_a_score_weighs_every_op_and_batch_size_alike():
    # halving a 20 µs call counts as much as halving a 2000 µs one
    base = {"128/dispatch": 20.0, "4096/dispatch": 2000.0}
    assert math.isclose(tune.score({**base, "128/dispatch": 10.0}), tune.score({**base, "4096/dispatch": 1000.0}))


def test_a_candidate_takes_each_cells_slowest_rank_and_fails_if_any_rank_could_not_run_it():
    assert tune._slowest([{"a": 1.0, "b": 5.0}, {"a": 3.0, "b": 2.0}]) == {"a": 3.0, "b": 5.0}
    assert tune._slowest([{"a": 1.0}, None]) is None


def test_the_shipped_torch_config_is_what_the_committed_tune_run_chose():
    """configs/torch.yaml defaults to the launch settings `symmoe tune` found on the GPU machine
    (benchmarks/tune_h100/), so a rerun that finds others updates both."""
    from symmoe.config import load

    shipped, tuned = load("configs/torch.yaml"), load("benchmarks/tune_h100/tuned_torch.yaml")
    for knob in tune.knobs_for(shipped, sms=132):
        section, _, key = knob.rpartition(".")
        got = getattr(getattr(shipped, section), key) if section else getattr(shipped, key)
        want = getattr(getattr(tuned, section), key) if section else getattr(tuned, key)
        assert got == want, f"{knob}: configs/torch.yaml has {got!r}, the tune run chose {want!r}"
