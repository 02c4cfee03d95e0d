"""examples/train_moe.py under torchrun at W = 2 on the host backend: the loss curve and the
final weights are bitwise identical across protocols, reruns, worst-case sizes through the
custom ops and torch.compile (aot_eager), and the loss goes down."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "train_moe.py"), "--config", str(ROOT / "configs" / "train_host.yaml"),
           "--steps", "6", "--out", str(out), *extra]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "final weights sha256" in run.stdout
    return json.loads(out.read_text())


def test_loss_curve_and_final_weights_are_bitwise_identical_across_protocols_and_reruns(tmp_path):
    runs = {
        "push": _train(tmp_path, "push", "--set", "protocol=push"),
        "pull": _train(tmp_path, "pull", "--set", "protocol=pull"),
        "push again": _train(tmp_path, "again", "--set", "protocol=push"),
        "pull, worst-case sizes": _train(tmp_path, "worst", "--set", "protocol=pull", "--worst"),
        "push, compiled": _train(tmp_path, "compiled", "--set", "protocol=push", "--compile", "aot_eager"),
    }
    assert [r["protocol"] for r in runs.values()] == ["push", "pull", "push", "pull", "push"]
    first = runs["push"]
    for name, r in runs.items():
        assert r["losses"] == first["losses"], f"{name}: loss curve differs: {r['losses']} vs {first['losses']}"
        assert r["weights_sha256"] == first["weights_sha256"], f"{name}: final weights differ"
    losses = [float.fromhex(v) for v in first["losses"]]
    assert losses[-1] < losses[0], losses
