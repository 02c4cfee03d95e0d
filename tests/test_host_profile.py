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


def _fp8_shim(monkeypatch, splits: bool, tokens: int = 16, rows: int = 24, hidden: int = 256,
              scale_format: str = "float32"):
    """The stood-in shim dispatching FP8 x (H = 256: two float32 scales a row), its protocol
    splitting received rows itself or not, and what each routed dispatch's launch was handed:
    (x's address, the outputs). The input region's view starts as 0xAB bytes."""
    import torch

    from symmoe import fp8
    monkeypatch.setattr(cuda_protocol, "stream_handle", lambda device: 0)
    shim, args = _script().shim_on_cpu(2, tokens, rows, hidden=hidden)
    proto = shim.symmoe._protocol
    proto._splits_fp8 = splits
    rb = fp8.formats(hidden)[scale_format].row_bytes(hidden)
    proto._input_views[(tokens, torch.uint8, rb)] = torch.full((tokens, rb), 0xAB, dtype=torch.uint8)
    handed = []
    launch = proto.ctx.dispatch
    monkeypatch.setattr(proto.ctx, "dispatch", lambda *a: (handed.append((a[12], dict(a[13]))), launch(*a))[1],
                        raising=False)
    args["x"] = fp8.quantize(args["x"], scale_format)
    return shim, args, handed


def test_a_protocol_that_splits_fp8_rows_hands_the_kernels_both_outputs_and_returns_them(monkeypatch):
    import torch

    shim, args, handed = _fp8_shim(monkeypatch, splits=True)
    (data, scales), *_ = shim.dispatch(**args)
    assert data.dtype == torch.float8_e4m3fn and data.shape == (24, 256)
    assert scales.dtype == torch.float32 and scales.shape == (24, 2)
    _, out = handed[-1]
    assert (out["fp8_data"], out["fp8_scales"], out["fp8_h"], out["fp8_s"]) == \
        (data.data_ptr(), scales.data_ptr(), 256, 2)
    assert out["x"] == out["fp8_data"]  # the e4m3 rows are the outputs' x: no packed rows to allocate


def test_a_cached_fp8_dispatch_is_split_by_the_protocol_too(monkeypatch):
    shim, args, _ = _fp8_shim(monkeypatch, splits=True)
    handle = shim.dispatch(**args)[4]
    moved = []
    monkeypatch.setattr(shim.symmoe._protocol.ctx, "move", lambda *a: moved.append(dict(a[1])), raising=False)
    (data, scales), *_ = shim.dispatch(args["x"], handle=handle)
    assert data.shape == (24, 256) and scales.shape == (24, 2)
    assert (moved[-1]["fp8_data"], moved[-1]["fp8_scales"]) == (data.data_ptr(), scales.data_ptr())


def test_fp8_rows_are_split_after_the_dispatch_where_the_protocol_does_not_split_them(monkeypatch):
    shim, args, handed = _fp8_shim(monkeypatch, splits=False)
    (data, scales), *_ = shim.dispatch(**args)
    assert data.shape == (24, 256) and scales.shape == (24, 2)
    assert "fp8_data" not in handed[-1][1]


def test_worst_case_sized_fp8_outputs_are_never_split_by_the_protocol(monkeypatch):
    shim, args, handed = _fp8_shim(monkeypatch, splits=True)
    monkeypatch.setattr(shim.symmoe._protocol.ctx, "recv_tail", lambda *a: None, raising=False)  # the tail kernel
    (data, scales), *_ = shim.dispatch(**args, num_worst_tokens=32)
    assert data.shape == (32, 256) and scales.shape == (32, 2)  # split after, from whole rows
    assert "fp8_data" not in handed[-1][1]


def test_the_push_reads_fp8_rows_where_they_lie_when_their_scale_bytes_are_whole_vectors(monkeypatch):
    import torch
    shim, args, handed = _fp8_shim(monkeypatch, splits=True, hidden=512)  # 4 float32 scales: 16 bytes
    data_in, scales_in = args["x"]
    shim.dispatch(**args)
    x_ptr, out = handed[-1]
    assert (x_ptr, out["x_tail"], out["x_head"]) == (data_in.data_ptr(), scales_in.data_ptr(), 512)
    view = shim.symmoe._protocol._input_views[(16, torch.uint8, 528)]
    assert bool((view == 0xAB).all())  # nothing packed: no pass over the rows before the push


def test_fp8_rows_whose_scale_bytes_are_not_whole_vectors_are_packed_first(monkeypatch):
    import torch

    from symmoe import fp8
    shim, args, handed = _fp8_shim(monkeypatch, splits=True, hidden=512, scale_format="ue8m0")  # 4 bytes
    shim.dispatch(**args)
    x_ptr, out = handed[-1]
    view = shim.symmoe._protocol._input_views[(16, torch.uint8, 528)]
    assert "x_tail" not in out and x_ptr == view.data_ptr()
    want = fp8.pack(*args["x"], torch.full_like(view, 0xAB))
    assert torch.equal(view, want)
