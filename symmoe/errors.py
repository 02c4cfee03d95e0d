"""The errors symmoe raises. Every one says what was wrong and what is allowed."""
from __future__ import annotations


class SymmoeError(Exception):
    """Base class of every error symmoe raises on purpose."""


class ConfigError(SymmoeError, ValueError):
    """A config file or mapping is invalid: names the file, the key path, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str, source: str | None = None):
        self.key, self.value, self.allowed, self.source = key, value, allowed, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key} = {value!r}: {allowed}")


class InputError(SymmoeError, ValueError):
    """An argument to dispatch/combine/get_dispatch_layout is invalid; nothing was moved."""


class CapacityError(InputError):
    """The call needs more room than the symmetric buffer was sized for."""


class BackendUnavailable(SymmoeError, RuntimeError):
    """A backend cannot run here (library missing, no GPU, version too old)."""


class StallError(SymmoeError, TimeoutError):
    """A device or host wait expired: names the rank and the stage that stalled."""

    def __init__(self, rank: int, stage: str, timeout_s: float, detail: str = ""):
        self.rank, self.stage, self.timeout_s = rank, stage, timeout_s
        msg = f"rank {rank}: stage '{stage}' did not complete within {timeout_s:g} s"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class ConfigMismatch(SymmoeError, RuntimeError):
    """Ranks started with different effective configs."""


class BuildError(SymmoeError, RuntimeError):
    """A CUDA extension failed to compile or load."""


class NcclError(SymmoeError, RuntimeError):
    """An NCCL call failed: names the call and NCCL's result string."""

    def __init__(self, call: str, detail: str, code: int | None = None):
        self.call, self.detail, self.code = call, detail, code
        super().__init__(f"nccl backend: {call} failed: {detail}")
