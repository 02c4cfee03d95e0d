import functools
import os
import secrets
from typing import NoReturn

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


# On the GPU machine (scripts/gpu_check.sh sets it) a GPU test that cannot run is a failure,
# not a skip: a missing GPU or an unusable backend there must not pass unnoticed.
REQUIRE_GPU_ENV = "SYMMOE_REQUIRE_GPU"


def gpu_unusable(reason: str) -> NoReturn:
    """A GPU test cannot run here (no GPU, or its backend unusable): skip it saying why, or,
    with SYMMOE_REQUIRE_GPU=1, fail it saying why. The report names the line that called it."""
    __tracebackhide__ = True
    if os.environ.get(REQUIRE_GPU_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_GPU_ENV}=1: GPU tests must run here)", pytrace=False)
    pytest.skip(reason)


# Several ranks on one GPU: overlapping devices allowed; NVLink multicast kept off in every
# process a GPU test starts (machines with several GPUs).
GPU_ENV = {"TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}


def on_ranks(check, world_size: int, args: tuple, env: dict[str, str] | None = None) -> list:
    """``check(rank, world_size, *args)`` (a symmoe.testing check) in this process alone, or
    in world_size processes sharing the GPU, with ``env`` (default GPU_ENV) set for it only."""
    from unittest import mock

    from symmoe.launch import spawn
    env = GPU_ENV if env is None else env
    if world_size == 1:
        with mock.patch.dict(os.environ, env):  # for this check only, not the rest of the session
            return [check(0, 1, *args)]
    return spawn(check, world_size, args=args, env=env, timeout_s=300.0)


@functools.cache
def _has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def pytest_runtest_setup(item):
    if "gpu" in item.keywords and not _has_gpu():
        gpu_unusable("needs a CUDA GPU (none here)")


def small_config(**over):
    """A host config small enough for many CPU processes; keys as dotted paths."""
    from symmoe.config import Config
    base = {"backend": "host", "buffer.hidden": 64, "buffer.max_tokens_per_rank": 48, "buffer.topk": 4,
            "buffer.num_experts": 32, "buffer.expert_alignment": 4, "kernel.timeout_s": 60.0,
            "host.poll_interval_us": 20}
    base.update(over)
    return Config().replace(**base)
