import os
import secrets

import pytest
import torch

# Fresh random routings every run; a failure names its seed, and SYMMOE_TEST_SEED=N replays it.
SESSION_SEED = int(os.environ.get("SYMMOE_TEST_SEED") or secrets.randbelow(1 << 30))


def pytest_report_header(config):
    return f"symmoe test seed: {SESSION_SEED} (replay with SYMMOE_TEST_SEED={SESSION_SEED})"


@pytest.fixture
def seed() -> int:
    return SESSION_SEED


@pytest.fixture(scope="session")
def cuda_module():
    """symmoe_cuda, built here (skipped without nvcc): its host-only bindings run without a GPU."""
    from symmoe import build
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    return build.load("symmoe_cuda")


def _has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def small_config(**over):
    """A host config small enough for many CPU processes; keys as dotted paths."""
    from symmoe.config import Config
    base = {"backend": "host", "buffer.hidden": 64, "buffer.max_tokens_per_rank": 48, "buffer.topk": 4,
            "buffer.num_experts": 32, "buffer.expert_alignment": 4, "kernel.timeout_s": 60.0,
            "host.poll_interval_us": 20}
    base.update(over)
    return Config().replace(**base)
