"""The Python host work of one exact-size (or cached) dispatch through the DeepEP V1 shim, without a GPU.

A small-batch dispatch on the GPU machine is bound by its host time, not its kernels (README,
Performance), and the GPU machine is scarce: this runs the shim -> Buffer -> CUDA protocol path
on the CPU with the device side stood in for (launches that do nothing, a counts wait that finds
the counts in, a summary of `--rows` received rows), so every Python function, torch op and
`symmoe_host` call of the host path runs as on the GPU machine. It prints the whole call's µs and
cProfile's account (own and cumulative µs per call). CPU tensors are cheaper to make than CUDA
ones and this host's Python is faster than the GPU machine's (about 2.5x): compare its numbers
with each other, before and after a change, never with a GPU run.

    python scripts/host_profile.py --world-size 2 --tokens 128 --rows 200 [--cached] [--top 30]
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import time
import types
from typing import Any

import numpy as np
import torch

from symmoe.bench.timing import profile_table
from symmoe.buffer import Buffer
from symmoe.compat import deep_ep_v1
from symmoe.config import Config
from symmoe.layout import DTYPES
from symmoe.protocol import cuda as cuda_protocol
from symmoe.protocol.counts import SUMMARY_HEAD

# symmoe_cuda's constants the host path reads (csrc/bindings/bind_context.cuh, host_wait.h)
MOVE_PUSH, COUNTS_READY = 1, 1


class _Device:
    """The device side of a dispatch, stood in for: the launches do nothing, the routing
    "publishes" its epoch as the kernel would, and the counts wait finds the counts in."""

    def __init__(self, ready: np.ndarray):
        self.ready = ready

    def dispatch(self, *args: Any) -> None:
        self.ready[0] = args[11]  # route_epoch: what route_kernel writes once the counts are in

    def move(self, *args: Any) -> None:
        pass

    def republish(self, *args: Any) -> None:  # a cached dispatch's routing put back
        pass

    def wait(self, *args: Any) -> int:
        return COUNTS_READY


def shim_on_cpu(world_size: int, tokens: int, rows: int, max_tokens: int = 256,
                hidden: int = 256) -> tuple[deep_ep_v1.Buffer, dict[str, Any]]:
    """A DeepEP V1 shim (rank-major, as DeepEP V1) over a Buffer whose push protocol runs its
    host path on the CPU (top-8 of 256 experts; hidden 256 by default: the host path does not
    depend on it, and full-width outputs on the CPU would time malloc), every receiver given
    ``rows`` rows (at most world_size * max_tokens, as a rank-major dispatch can)."""
    if not 0 <= rows <= world_size * max_tokens:
        raise ValueError(f"rows={rows}: a rank-major dispatch receives 0..{world_size * max_tokens} rows here")
    cfg = Config().replace(**{"backend": "torch", "buffer.hidden": hidden, "buffer.max_tokens_per_rank": max_tokens,
                              "buffer.topk": 8, "buffer.num_experts": 256})
    lay = cfg.layout(world_size)
    cpu = torch.device("cpu")
    W, E, L = world_size, lay.num_experts, lay.local_experts
    counts = np.zeros((W, 1 + W + E), dtype=np.int32)
    summary = np.zeros(SUMMARY_HEAD + L, dtype=np.int32)
    summary[1:5] = rows  # this rank's rows and the most any receiver gets, both layouts
    records = {"counts": counts, "summary": summary, "ready": np.zeros(1, dtype=np.int64),
               "deferred": (ctypes.c_int64 * 6)(), "err": (ctypes.c_int64 * 4)()}
    device = _Device(records["ready"])
    proto = object.__new__(cuda_protocol.CudaPush)  # its state as __init__ leaves it, device side stood in
    proto.__dict__.update(
        mem=types.SimpleNamespace(device=cpu), layout=lay, config=cfg, buffer_id=1, device=cpu, rank=0,
        world_size=W, mod=types.SimpleNamespace(), ctx=device, _move_mode=(MOVE_PUSH, 0, 0), _epoch=0,
        _published=None, _scratch_ptr=0, _splits_fp8=False, _counts_np=counts, _summary_np=summary, _counts_mapped=(0, 0),
        _summary=(0, 0), _counts_ready=(0, 0), _deferred=(0, 0), _counts_shape=(W, 1 + W + E),
        _deferred_rec=records["deferred"], _err_rec=records["err"], _counts_wait=device,
        _filled=COUNTS_READY + 1, _offs=lay.offsets(), _base=0, _bad_info=(0, 0),
        shape=types.SimpleNamespace(stream=0), _closed=True, _input_views={})
    buf = object.__new__(Buffer)
    buf.__dict__.update(config=cfg, layout=lay, dtype=DTYPES[cfg.buffer.dtype], memory=types.SimpleNamespace(device=cpu),
                        _protocol=proto, _closed=False, _ll=None, rank=0, world_size=W, group=None)
    proto.buffer_id = id(buf)  # what Buffer checks a handle against (a cached dispatch's)
    shim = object.__new__(deep_ep_v1.Buffer)
    shim.__dict__.update(symmoe=buf, group_size=W, _last_layout=None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, lay.hidden, generator=g).to(torch.bfloat16)
    idx = torch.rand(tokens, E, generator=g).topk(lay.topk, dim=1).indices
    w = torch.rand(tokens, lay.topk, generator=g)
    return shim, {"x": x, "topk_idx": idx, "topk_weights": w}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rows", type=int, default=200, help="rows this rank receives")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--cached", action="store_true", help="the cached dispatch of one routed dispatch's handle")
    a = p.parse_args()
    cuda_protocol.stream_handle = lambda device: 0  # no CUDA stream on the CPU
    shim, args = shim_on_cpu(a.world_size, a.tokens, a.rows)
    if a.cached:
        handle = shim.dispatch(**args)[4]
        call = lambda: shim.dispatch(args["x"], handle=handle)  # noqa: E731
    else:
        call = lambda: shim.dispatch(**args)  # noqa: E731
    for _ in range(50):
        call()
    t0 = time.perf_counter()
    for _ in range(a.calls):
        call()
    print(f"whole {'cached ' if a.cached else ''}call: {(time.perf_counter() - t0) / a.calls * 1e6:.1f} us "
          f"(W={a.world_size}, {a.tokens} tokens, "
          f"{a.rows} rows; CPU, device side stood in)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        call()
    prof.disable()
    print(profile_table(prof, a.calls, a.top), end="")


if __name__ == "__main__":
    main()
