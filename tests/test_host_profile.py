"""scripts/host_profile.py runs a dispatch's whole host path (DeepEP V1 shim -> Buffer -> CUDA
push protocol -> symmoe_host) on the CPU, the device side stood in: what it profiles is the
path a GPU dispatch takes, with the rows the stood-in summary names."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from symmoe.protocol import cuda as cuda_protocol

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "host_profile.py"


def _script():
    spec = importlib.util.spec_from_file_location("host_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("world_size, rows", [(2, 24), (4, 0), (8, 100)])
def test_a_dispatch_returns_the_rows_the_summary_names_through_every_layer(world_size, rows, monkeypatch):
    monkeypatch.setattr(cuda_protocol, "stream_handle", lambda device: 0)
    shim, args = _script().shim_on_cpu(world_size, 16, rows)
    for _ in range(3):  # epochs advance, the routing state is kept for a cached dispatch
        recv_x, recv_idx, recv_w, per_expert, handle, _ = shim.dispatch(**args)
        assert recv_x.shape == (rows, 256) and recv_idx.shape == (rows, 8) and recv_w.shape == (rows, 8)
        assert handle.symmoe.num_recv_rows == rows and handle.symmoe.recv_src_slot.shape == (rows,)
        assert len(per_expert) == 256 // world_size
        assert shim.symmoe._protocol._published is handle.symmoe.cache


def test_rows_a_rank_major_dispatch_cannot_receive_are_refused():
    with pytest.raises(ValueError, match="rows=513: a rank-major dispatch receives 0..512 rows here"):
        _script().shim_on_cpu(2, 16, 513)


def test_the_script_prints_the_whole_call_and_the_layers():
    out = subprocess.run([sys.executable, str(SCRIPT), "--calls", "20", "--top", "40"], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("whole call: ")
    for layer in ("deep_ep_v1.py", "buffer.py", "cuda.py", "symmoe_host"):
        assert layer in out, layer


def test_a_cached_dispatch_reuses_the_routed_dispatchs_handle_on_the_same_buffer(monkeypatch):
    monkeypatch.setattr(cuda_protocol, "stream_handle", lambda device: 0)
    shim, args = _script().shim_on_cpu(2, 16, 24)
    handle = shim.dispatch(**args)[4]
    for _ in range(3):
        recv_x, *_ = shim.dispatch(args["x"], handle=handle)
        assert recv_x.shape == (24, 256)
