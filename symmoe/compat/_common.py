"""Pieces both DeepEP shims share: errors, events, the symmoe config they run on, and
placeholders for DeepEP internals symmoe does not have."""
from __future__ import annotations

import os
from typing import Any

import torch

from ..config import Config, load
from ..errors import InputError, SymmoeError

topk_idx_t: torch.dtype = torch.int64  # deep_ep.topk_idx_t in DeepEP's default build


class CompatError(SymmoeError):
    """Base class of what the DeepEP shims raise about DeepEP features."""


class UnsupportedArgument(CompatError, ValueError):
    """A DeepEP argument whose value symmoe cannot honour without changing results."""

    def __init__(self, api: str, arg: str, value: Any, supported: str):
        self.api, self.arg, self.value, self.supported = api, arg, value, supported
        super().__init__(f"{api}: {arg}={describe(value)} is not supported by symmoe; {supported}")


class UnsupportedCall(CompatError, NotImplementedError):
    """A DeepEP method symmoe has no equivalent for."""

    def __init__(self, api: str, why: str):
        self.api = api
        super().__init__(f"{api} is not supported by symmoe: {why}")


def unsupported(api: str, name: str, why: str, static: bool = False) -> Any:
    """A method of ``api`` that symmoe does not have: calling it raises UnsupportedCall."""
    def method(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedCall(f"{api}.{name}", why)

    method.__name__ = name
    method.__doc__ = f"Not supported: {why}."
    return staticmethod(method) if static else method


def describe(value: Any) -> str:
    """Short repr for messages: tensors by dtype and shape, not contents."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(dtype={value.dtype}, shape={tuple(value.shape)})"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def reject(api: str, arg: str, value: Any, unsupported: bool, supported: str) -> None:
    if unsupported:
        raise UnsupportedArgument(api, arg, value, supported)


def check_not_fp8(api: str, x: Any, arg: str = "x") -> None:
    if isinstance(x, tuple):
        raise UnsupportedArgument(api, arg, x, "combine takes the rows of the symmoe config's buffer.dtype (FP8 "
                                  "is for dispatch only, as in DeepEP); pass a bfloat16/float16/float32 tensor")


# -- the symmoe config a shim runs on ----------------------------------------------------------
_default: Config | str | os.PathLike | None = None


def set_default_config(config: Config | str | os.PathLike | None) -> None:
    """The symmoe config (a Config or a YAML path) that shim buffers created without
    ``symmoe_config=`` use, and that the static size hints read. Call it once where the job
    starts; model code that builds ``Buffer(group, ...)`` itself then needs no change.
    ``None`` restores symmoe's own default, ``symmoe.Config()``."""
    global _default
    _default = config


def resolve(config: Config | str | os.PathLike | None) -> Config:
    """As ``symmoe.Buffer`` does: a Config as is, a path loaded, None the default."""
    config = _default if config is None else config
    if config is None:
        return Config()
    return config if isinstance(config, Config) else load(config)


def hidden_from_bytes(api: str, cfg: Config, hidden_bytes: int) -> None:
    """DeepEP sizes by ``hidden * max(element_size, 2)`` bytes; symmoe by the config. Refuse a
    hint for a hidden size the config would then reject at the first dispatch."""
    from ..layout import DTYPES
    elem = max(DTYPES[cfg.buffer.dtype].itemsize, 2)
    if hidden_bytes != cfg.buffer.hidden * elem:
        raise UnsupportedArgument(api, "hidden_bytes", hidden_bytes,
                                  f"the symmoe config ({cfg.source or 'defaults'}) has buffer.hidden="
                                  f"{cfg.buffer.hidden} x {elem} bytes = {cfg.buffer.hidden * elem}; set "
                                  "buffer.hidden (symmoe.compat.set_default_config) to the model's hidden size")


# -- events ------------------------------------------------------------------------------------
class EventHandle:
    """DeepEP's ``EventHandle``: an event recorded on the current CUDA stream when created
    (nothing on the CPU, where every call has finished when it returns)."""

    def __init__(self) -> None:
        self.event = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


def wait(event: Any) -> None:
    """Make the current stream wait for a ``previous_event`` given in any of DeepEP's forms
    (EventOverlap, EventHandle) or symmoe's."""
    if event is None:
        return
    if isinstance(event, torch.cuda.Event):
        torch.cuda.current_stream().wait_event(event)
    else:
        event.current_stream_wait()


class EventOverlap:
    """DeepEP's ``EventOverlap``: ``current_stream_wait()`` and ``with event: ...``.

    symmoe runs every call on the caller's current stream, so the event is already ordered
    before later work on that stream; waiting on it is still correct and cheap."""

    def __init__(self, event: Any = None, extra_tensors: tuple[torch.Tensor, ...] | None = None) -> None:
        # symmoe's EventOverlap carries a torch.cuda.Event (or None); DeepEP code passes an EventHandle.
        self.event = getattr(event, "event", event) if not isinstance(event, EventHandle) else event
        self.extra_tensors = extra_tensors
        self._release = False

    def current_stream_wait(self, release_handle: bool = False) -> None:
        wait(self.event)
        if release_handle:
            self.event = None

    def synchronize(self) -> None:
        ev = getattr(self.event, "event", self.event)
        if ev is not None:
            ev.synchronize()

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        self._release = release_handle
        return self

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release)
        self._release = False


def capture() -> EventOverlap:
    return EventOverlap(EventHandle())


# -- DeepEP internals symmoe does not have -------------------------------------------------
class Unavailable:
    """Stands where DeepEP returns an internal tensor of its own kernels (channel prefix
    sums, ring-buffer heads, RDMA slots). Holding it is fine -- handles carry these around
    unused -- but any use raises and says why, instead of handing out made-up values."""

    __slots__ = ("_name", "_why")

    def __init__(self, name: str, why: str) -> None:
        self._name, self._why = name, why

    def _fail(self, *args: object, **kwargs: object):
        raise CompatError(f"{self._name} is not provided by symmoe's DeepEP shim: {self._why}")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    __getitem__ = __setitem__ = __iter__ = __len__ = __bool__ = __int__ = __float__ = __index__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __lt__ = __gt__ = _fail

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in list(args) + list((kwargs or {}).values()):
            if isinstance(a, Unavailable):
                a._fail()
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{self._name}: not provided by symmoe ({self._why})>"


def check_int(api: str, name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InputError(f"{api}: {name}={value!r}; allowed: an integer >= {lo}")
    return value


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def pad_rows(t: torch.Tensor, rows: int, fill: float | int) -> torch.Tensor:
    """``t`` grown to ``rows`` rows with ``fill`` (DeepEP's worst-case-sized outputs)."""
    if t.shape[0] >= rows:
        return t
    out = t.new_full((rows, *t.shape[1:]), fill)
    out[:t.shape[0]] = t
    return out


def rows_for_combine(api: str, name: str, t: torch.Tensor | None, exact: int, allocated: int) -> torch.Tensor | None:
    """Combine takes one row per received row; DeepEP code may pass the worst-case-sized
    tensor dispatch returned. Its tail rows carry nothing, so they are dropped."""
    if t is None or not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] == exact:
        return t
    if t.shape[0] == allocated:
        return t[:exact]
    raise InputError(f"{api}: {name} has {t.shape[0]} rows; this handle received {exact} rows"
                     + (f" (or pass the {allocated} rows dispatch returned)" if allocated != exact else ""))
