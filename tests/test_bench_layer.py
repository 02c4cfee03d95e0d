"""The layer benchmark (symmoe.bench.layer) on the CPU: MoELayer forward + backward over the
host backend, the DeepEP V1 shim and an all_to_all_single dispatcher in one job, at W = 2."""
import json

from symmoe.bench import layer


def test_the_layer_bench_times_every_variant_with_ratios_and_checks_them_bitwise(tmp_path, seed):
    """One warm-up and one timed step per variant: a row per (tokens, phase) with every variant's
    time, each variant's ratio to the all_to_all_single baseline (no DeepEP here), and the
    variants' outputs and x gradients bitwise equal (the same weights, routing and rank order)."""
    out_json, out_md = tmp_path / "layer.json", tmp_path / "layer.md"
    rc = layer.main(["--world-sizes", "2", "--tokens", "24", "--config", "host=configs/host.yaml",
                     "--config", "host-pull=configs/host.yaml,protocol=pull", "--hidden", "64", "--topk", "4",
                     "--experts", "8", "--ffn-hidden", "16", "--shared-ffn-hidden", "8", "--repeats", "1",
                     "--warmup", "1", "--seed", str(seed % 1000), "--json", str(out_json), "--md", str(out_md)])
    assert rc == 0
    doc = json.loads(out_json.read_text())
    (res,) = doc["results"]
    assert res["world_size"] == 2 and res["baseline"] == "a2a"
    assert [(r["tokens"], r["op"]) for r in res["rows"]] == [(24, p) for p in layer.PHASES]
    names = {"host", "host-pull", "v1-shim", "a2a"}
    for row in res["rows"]:
        assert set(row["us"]) == names and all(v > 0 for v in row["us"].values())
        assert set(row["ratio"]) == names - {"a2a"}
        assert all(r == round(row["us"]["a2a"] / row["us"][n], 3) for n, r in row["ratio"].items())
    assert res["bitwise_vs_first"] == {"24": {n: True for n in names}}
    assert "deep_ep" in json.dumps(res["notes"])  # DeepEP is absent here, and the run says why
    table = out_md.read_text().splitlines()
    assert table[0] == "| W | tokens/rank | op | a2a | host | host-pull | v1-shim |"
    assert len(table) == 2 + len(layer.PHASES) and table[2].startswith("| 2 | 24 | forward | ")
