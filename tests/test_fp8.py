"""FP8 dispatch: (x_e4m3, scales) rows move as bytes, bitwise equal to symmoe.reference on the
host backend in both protocols and layouts, with DeepGEMM's grouped layout and scale layout
for expert-major outputs; bad FP8 input is refused before anything moves."""
import pytest
import torch

from conftest import small_config
from symmoe import Buffer, fp8, reference
from symmoe.errors import InputError
from symmoe.launch import spawn
from symmoe.testing import CHECK_ROUTINGS, check_fp8_dispatch

H = 256  # two UE8M0 words per row: 2 x 4 scales of 128 channels


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_fp8_rows_and_scales_match_the_reference_bitwise(world_size, protocol, seed):
    cfg = small_config(protocol=protocol, **{"buffer.hidden": H})
    cases = len(CHECK_ROUTINGS) * 2 * 2
    assert spawn(check_fp8_dispatch, world_size, args=(cfg.to_dict(), seed + world_size)) == [cases] * world_size


@pytest.mark.parametrize("hidden, scale_format, row_bytes", [
    (7168, "float32", 7392),  # 7168 + 56 scales x 4 bytes: 0.52x a 14336-byte bfloat16 row
    (7168, "ue8m0", 7232),    # 7168 + 14 words of 4 packed exponents = 7224, rounded up to 16
    (256, "float32", 272),
    (256, "ue8m0", 272),
    (640, "ue8m0", 656),      # 5 exponents in two words
])
def test_fp8_rows_are_the_e4m3_and_scale_bytes_rounded_up_to_16(hidden, scale_format, row_bytes):
    assert fp8.formats(hidden)[scale_format].row_bytes(hidden) == row_bytes


@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("protocol", ["push", "pull"])
def test_fp8_dispatch_moves_rows_of_row_bytes_not_bfloat16_rows(layout, protocol, seed, monkeypatch):
    """What reaches the protocol is x packed into rows of Fp8Format.row_bytes bytes (exact,
    cached and worst-case dispatches), and what it returns is rows of that width; the results
    are the reference's, bit for bit."""
    T, E = 12, 32
    cfg = small_config(protocol=protocol, **{"buffer.hidden": H, "buffer.num_experts": E})
    x = _fp8_x(T, H, seed=seed)
    idx, w = _routing(T, 4, E, seed)
    rb = fp8.formats(H)["float32"].row_bytes(H)
    sent, received = [], []
    with Buffer(None, cfg) as buf:
        proto = type(buf._protocol)
        for name in ("dispatch", "dispatch_cached"):  # the host's cached dispatch calls its dispatch
            def spy(self, x, *args, _real=getattr(proto, name), **kw):
                sent.append((tuple(x.shape), x.dtype))
                out = _real(self, x, *args, **kw)
                recv = out[0] if isinstance(out, tuple) else out
                received.append((recv.x.shape[1], recv.x.dtype))
                return out
            monkeypatch.setattr(proto, name, spy)
        want = reference.dispatch([x], [idx], [w], E, layout, cfg.buffer.expert_alignment).recv[0]
        (a, sf), *_, handle, _ = buf.dispatch(x, idx, w, output_layout=layout)
        assert torch.equal(a.view(torch.uint8), want.x[0].view(torch.uint8)) and torch.equal(sf, want.x[1])
        (a, sf), *_ = buf.dispatch(x, handle=handle)
        assert torch.equal(a.view(torch.uint8), want.x[0].view(torch.uint8)) and torch.equal(sf, want.x[1])
        worst = want.topk_idx.shape[0] + 5
        (a, sf), *_ = buf.dispatch(x, idx, w, output_layout=layout, num_worst_tokens=worst)
        padded = reference.pad_recv(want, worst)
        assert torch.equal(a.view(torch.uint8), padded.x[0].view(torch.uint8)) and torch.equal(sf, padded.x[1])
    assert len(sent) >= 3 and set(sent) == {((T, rb), torch.uint8)} and set(received) == {(rb, torch.uint8)}


def _fp8_x(T: int, hidden: int, scale_format: str = "float32", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return fp8.quantize(torch.randn(T, hidden, generator=g) * 3, scale_format)


def _routing(T: int, K: int, E: int, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    idx[torch.rand(T, K, generator=g) < 0.25] = -1
    return idx, torch.rand(T, K, generator=g)


def _deq(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 rows from e4m3 and float32 per-128 scales (what DeepGEMM's 1x128 LHS scaling means)."""
    T, H = data.shape
    return (data.float().view(T, H // 128, 128) * scales.unsqueeze(2)).view(T, H)


def test_expert_major_fp8_output_is_what_deep_gemms_contiguous_grouped_gemm_takes(seed):
    """DeepGEMM's contract for m_grouped_fp8_gemm_nt_contiguous(a=(x, sf), b, d, grouped_layout):
    x [M, K] e4m3 K-major and contiguous; sf [M, K/128] float32 in the MN-major TMA-aligned
    layout (strides (1, align(M, 4))); each expert's segment starts at a multiple of the M
    alignment (128); grouped_layout[m] the expert of row m, -1 on padding rows; its psum form
    psum[e] the end of expert e's real rows, the next segment starting at align(psum[e], 128).
    A grouped GEMM emulated from exactly that contract equals the same GEMM on the tokens
    routed to each expert, taken from the source ranks' inputs."""
    T, K, E, A = 40, 4, 8, 128
    cfg = small_config(**{"buffer.hidden": H, "buffer.num_experts": E, "buffer.expert_alignment": A})
    x = _fp8_x(T, H, seed=seed)
    idx, w = _routing(T, K, E, seed)
    idx[idx == 3] = -1
    idx[:, 0] = 3  # one expert gets every token; others may get none
    with Buffer(None, cfg) as buf:
        (a, sf), ri, _, per_expert, handle, _ = buf.dispatch(x, idx, w, output_layout="expert", scale_layout="mn_major")
        layout = buf.grouped_layout(handle)
        psum = buf.grouped_layout(handle, psum=True)
    M = a.shape[0]
    assert a.dtype == torch.float8_e4m3fn and a.is_contiguous() and M % A == 0
    assert sf.dtype == torch.float32 and sf.shape == (M, H // 128) and sf.stride() == (1, -(-M // 4) * 4)
    assert layout.dtype == torch.int32 and layout.shape == (M,) and psum.dtype == torch.int32 and psum.shape == (E,)
    start = 0
    for e in range(E):
        assert start % A == 0
        n = per_expert[e]
        assert int(psum[e]) == start + n
        assert bool((layout[start:start + n] == e).all()) and bool((layout[start + n:-(-(start + n) // A) * A] == -1).all())
        start = -(-int(psum[e]) // A) * A
    assert start == M and per_expert[3] == T
    wts = torch.randn(E, 16, H, generator=torch.Generator().manual_seed(seed + 2))
    got = torch.zeros(M, 16)
    for e in range(E):  # the grouped GEMM as DeepGEMM defines it: rows of expert e times w[e]^T
        rows = (layout == e).nonzero().flatten()
        got[rows] = _deq(a[rows], sf[rows]) @ wts[e].t()
    deq_src = _deq(*x)
    for e in range(E):
        tokens = (idx == e).any(1).nonzero().flatten()  # one source rank: in token order
        rows = (layout == e).nonzero().flatten()
        assert torch.equal(got[rows], deq_src[tokens] @ wts[e].t())
    assert bool((got[layout == -1] == 0).all())


def test_ue8m0_scales_come_packed_and_mn_major_as_deep_gemm_lays_them_out(seed):
    T, E = 24, 8
    cfg = small_config(**{"buffer.hidden": 640, "buffer.num_experts": E})  # 5 scales: two words, one partly empty
    x = _fp8_x(T, 640, "ue8m0", seed)
    assert x[1].shape == (T, 2) and x[1].dtype == torch.int32
    idx, w = _routing(T, 4, E, seed)
    with Buffer(None, cfg) as buf:
        (a, sf), *_ = buf.dispatch(x, idx, w, output_layout="expert", scale_layout="mn_major")
    want = reference.dispatch([x], [idx], [w], E, "expert", cfg.buffer.expert_alignment).recv[0].x
    M = a.shape[0]
    assert sf.shape == (M, 2) and sf.stride() == (1, -(-M // 4) * 4)
    assert torch.equal(sf, want[1]) and torch.equal(a.view(torch.uint8), want[0].view(torch.uint8))


def _buf(**over):
    return Buffer(None, small_config(**{"buffer.hidden": H, **over}))


@pytest.mark.parametrize("make_x, message", [
    (lambda x: (x[0], torch.cat([x[1], x[1][:, :1]], 1)),
     r"x\[1\] \(scales\) has shape \(6, 3\); float32 scales of x \[6, 256\] must be \(6, 2\)"),
    (lambda x: (x[0], x[1][:5]), r"x\[1\] \(scales\) has shape \(5, 2\); float32 scales .* must be \(6, 2\)"),
    (lambda x: (x[0], x[1].view(torch.int32)),
     r"int32 of shape \(6, 2\): int32 scales are UE8M0 packed four to an int32, \(6, 1\); .* must be torch.float32"),
    (lambda x: (x[0], x[1][:, :1].contiguous()),
     r"float32 of shape \(6, 1\), the shape of UE8M0 scales .* \(6, 2\) \(packed UE8M0 scales must be torch.int32\)"),
    (lambda x: (x[0], x[1].double()), r"x\[1\] \(scales\) has dtype torch.float64; allowed: torch.float32 .* or torch.int32"),
    (lambda x: (x[0].view(torch.uint8).view(torch.float8_e5m2), x[1]),
     r"x\[0\] \(FP8 data\) has dtype torch.float8_e5m2; allowed: torch.float8_e4m3fn"),
    (lambda x: (x[0], x[1], x[1]), r"x is a tuple of 3 items; FP8 x is \(x_e4m3 \[T, H\], scales\)"),
    (lambda x: (x[0].view(3, 512)[:, :256], x[1][:3]), r"x\[0\] \(FP8 data\) must be contiguous"),
    (lambda x: (x[0][:, :128].contiguous(), x[1]), r"x\[0\] \(FP8 data\) has hidden size 128; this Buffer was sized for hidden=256"),
])
def test_bad_fp8_input_is_refused_naming_the_value_before_anything_is_written(make_x, message, seed):
    x = _fp8_x(6, H, seed=seed)
    idx, w = _routing(6, 4, 32, seed)
    with _buf() as buf:
        marker = buf.input_view(6).copy_(torch.randn(6, H, generator=torch.Generator().manual_seed(seed)))
        before = marker.clone()
        with pytest.raises(InputError, match=message):
            buf.dispatch(make_x(x), idx, w)
        assert torch.equal(buf.input_view(6).view(torch.int16), before.view(torch.int16))


def test_fp8_x_with_bad_routing_is_refused_before_its_rows_are_packed(seed):
    x = _fp8_x(6, H, seed=seed)
    idx, w = _routing(6, 4, 32, seed)
    idx[2, 1] = 32
    with _buf() as buf:
        before = buf.input_view(6).copy_(torch.randn(6, H)).clone()
        with pytest.raises(InputError, match="expert id 32"):
            buf.dispatch(x, idx, w)
        assert torch.equal(buf.input_view(6).view(torch.int16), before.view(torch.int16))


def test_hidden_not_a_multiple_of_128_is_refused():
    x = fp8.quantize(torch.randn(6, 256), "float32")
    x = (x[0][:, :192].contiguous(), x[1])
    idx, w = _routing(6, 4, 32, 0)
    with Buffer(None, small_config(**{"buffer.hidden": 192})) as buf, \
            pytest.raises(InputError, match="FP8 x has hidden size 192; FP8 dispatch needs a multiple of 128"):
        buf.dispatch(x, idx, w)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fp8_x_needs_a_bfloat16_buffer(dtype):
    idx, w = _routing(6, 4, 32, 0)
    with _buf(**{"buffer.dtype": dtype}) as buf, \
            pytest.raises(InputError, match=f"buffer.dtype={dtype}; FP8 dispatch needs buffer.dtype bfloat16"):
        buf.dispatch(_fp8_x(6, H), idx, w)


def test_scale_layout_and_grouped_layout_refuse_what_they_do_not_know(seed):
    idx, w = _routing(6, 4, 32, seed)
    with _buf() as buf:
        with pytest.raises(InputError, match=r"scale_layout='col'; allowed: 'row' .* or 'mn_major'"):
            buf.dispatch(_fp8_x(6, H), idx, w, scale_layout="col")
        *_, handle, _ = buf.dispatch(_fp8_x(6, H), idx, w, output_layout="rank")
        with pytest.raises(InputError, match="dispatch was rank-major; DeepGEMM's grouped layout exists for "
                                             "output_layout='expert' only"):
            buf.grouped_layout(handle)


def test_quantize_matches_deep_gemms_per_token_cast_and_refuses_other_formats(seed):
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(seed)) * 10
    data, sf = fp8.quantize(x)
    amax = x.view(5, 2, 128).abs().amax(2).clamp(min=1e-4)
    # IEEE fp32 divisions (correctly rounded, as a float64 division rounded once is), on every
    # device: not a multiply by 448's rounded reciprocal, which torch does for a CUDA tensor.
    assert torch.equal(sf, (amax.double() / 448).float())
    want = (x.view(5, 2, 128) * (448 / amax.double()).float().unsqueeze(2)).to(torch.float8_e4m3fn).view(5, 256)
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))
    d8, packed = fp8.quantize(x, "ue8m0")
    assert packed.shape == (5, 1) and packed.dtype == torch.int32
    exps = packed.view(torch.uint8)[:, :2].float() - 127  # two of the word's four bytes used, little-endian
    sf = torch.pow(2.0, exps)
    assert bool((sf >= amax / 448.0).all()) and bool((sf / 2 < amax / 448.0).all())  # the power of two at or above
    assert bool((packed.view(torch.uint8)[:, 2:] == 0).all())
    want = (x.view(5, 2, 128) * (1.0 / sf).unsqueeze(2)).to(torch.float8_e4m3fn).view(5, 256)
    assert torch.equal(d8.view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(InputError, match="scale_format='e8m0'; allowed: 'float32', 'ue8m0'"):
        fp8.quantize(x, "e8m0")


@pytest.mark.parametrize("rows", [0, 1, 5, 37])
@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
@pytest.mark.parametrize("scale_layout", ["row", "mn_major"])
def test_the_gpu_split_s_outputs_have_the_layout_unpack_gives(rows, scale_format, scale_layout):
    """fp8.unpack on the GPU splits into tensors made by symmoe_host.fp8_split_outputs (made on the
    CPU here): the e4m3 data contiguous, the scales of the shape, dtype and strides the torch path's
    scales have, and the strides the kernel is told are the scales' own."""
    from symmoe import build

    H = 512
    fmt = fp8.formats(H)[scale_format]
    data, scales, *strides = build.load("symmoe_host").fp8_split_outputs(
        rows, H, fmt.scale_cols, fmt.scale_dtype, scale_layout != "row", torch.device("cpu"))
    packed = fp8.pack(*fp8.quantize(torch.randn(rows, H), scale_format),
                      torch.zeros(rows, fmt.row_bytes(H), dtype=torch.uint8))
    want_d, want_s = fp8.unpack(packed, H, fmt, scale_layout)
    assert (data.shape, data.dtype, data.is_contiguous()) == (want_d.shape, want_d.dtype, True)
    assert (scales.shape, scales.dtype) == (want_s.shape, want_s.dtype)
    if rows > 1:  # torch keeps any strides on a 0- or 1-row view
        assert scales.stride() == want_s.stride() == tuple(strides)
