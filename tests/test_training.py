"""Training through symmoe on the host backend: autograd, the custom ops under torch.compile,
the MoE layer against a single-process MoE, and the errors of bad use.

Every routing is drawn fresh from the session seed (masked -1 ids, ranks that receive
nothing, skew); upstream gradients are random, never zeros."""
import pytest
import torch

from conftest import small_config
from symmoe import Buffer, autograd, ops
from symmoe.errors import InputError
from symmoe.launch import spawn
from symmoe.testing.training import GRAD_ROUTINGS, check_autograd, check_compiled_layer, check_layer
from symmoe.workload import Routing, make_inputs

CASES = len(GRAD_ROUTINGS)
LAYER = {"ffn_hidden": 32, "shared_ffn_hidden": 16}
F32 = {"buffer.dtype": "float32"}


@pytest.mark.parametrize("protocol", ["push", "pull"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dispatch_and_combine_gradients_are_the_references_combine_and_dispatch_bitwise(world_size, protocol, seed):
    """dispatch's backward is the combine of the row gradients (plus the weights' gradient from
    the owner's row), combine's backward the cached dispatch of the output's gradient (times the
    row's weight, expert-major, plus the weights' dot-product gradient): bitwise equal to the
    reference's, in both layouts, with exact and worst-case sizes (whose tail rows carry random
    gradients that must be ignored)."""
    cfg = small_config(protocol=protocol)
    assert spawn(check_autograd, world_size, args=(cfg.to_dict(), seed + world_size)) == [CASES * 4] * world_size


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_expert_major_weight_gradients_come_back_exactly_in_every_row_dtype(dtype, seed):
    """Expert-major weight gradients travel back through a combine of rows of the buffer's
    dtype: fp32 values split into pieces must arrive bit for bit (bfloat16 is the default
    config, checked above)."""
    cfg = small_config(protocol="push", **{"buffer.dtype": dtype})
    assert spawn(check_autograd, 2, args=(cfg.to_dict(), seed + 3, ("expert",))) == [CASES * 2] * 2


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_custom_ops_have_the_same_gradients_and_release_every_handle(world_size, seed):
    """symmoe::dispatch / symmoe::combine (worst-case sizes) give the reference's gradients
    bitwise, and no handle stays in the table after backward."""
    cfg = small_config(protocol="pull")
    got = spawn(check_autograd, world_size, args=(cfg.to_dict(), seed + 17, ("rank", "expert"), (True,), "cpu", True))
    assert got == [CASES * 2] * world_size


@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("worst", [0, "auto"], ids=["exact", "worst"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_layer_matches_a_single_process_moe_with_the_same_weights_and_routing(world_size, worst, layout, seed):
    """A fresh random routing with masked ids: the W-rank layer's output and gradients (x,
    topk_weights, its experts, the shared expert summed over ranks) equal a plain-torch MoE
    over all tokens in one process, within rtol = atol = 1e-5 in fp32: the two sum a token's
    slots and run the expert GEMMs in a different order, so only the last bits may differ."""
    cfg = small_config(protocol="push", **F32)
    kw = dict(LAYER, num_worst_tokens=worst, output_layout=layout)
    routing = Routing("masked", mask_prob=0.3, masked_tokens=0.1)
    spawn(check_layer, world_size, args=(cfg.to_dict(), seed + world_size, kw, routing))


@pytest.mark.parametrize("router", [dict(score_func="softmax"),
                                    dict(score_func="sigmoid", num_groups=4, topk_groups=2, route_scale=2.5)],
                         ids=["softmax", "sigmoid-group-limited"])
def test_the_router_gradient_matches_the_single_process_moe(router, seed):
    """The layer routes (softmax, or DeepSeek-V3's sigmoid with group-limited routing): the
    router's gradient summed over ranks equals the single process's, within the same 1e-5."""
    cfg = small_config(protocol="pull", **F32)
    spawn(check_layer, 2, args=(cfg.to_dict(), seed + 40, dict(LAYER, **router), None))


def test_layer_gradients_are_bitwise_equal_across_protocols_layouts_of_the_ops_and_reruns(seed):
    """Deterministic expert parallelism: push, pull and a rerun give the same bits for the
    output and every gradient; so do exact and worst-case sizes."""
    digests = []
    for protocol, worst in (("push", 0), ("pull", 0), ("push", 0), ("pull", "auto")):
        cfg = small_config(protocol=protocol, **F32)
        digests.append(spawn(check_layer, 2, args=(cfg.to_dict(), seed + 50, dict(LAYER, num_worst_tokens=worst),
                                                   Routing("masked", mask_prob=0.3))))
    assert all(d == digests[0] for d in digests), digests


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_compiles_the_layers_forward_and_backward(backend, seed):
    """torch.compile(fullgraph=True) of a MoE layer's forward + loss, then backward, at two
    ranks: one graph (fullgraph raises at any break), no handle left, and eager's results:
    bitwise with aot_eager (the same aten ops), within 1e-5 with inductor (its C++ kernels
    fuse and reorder fp32 sums; this machine has a C++ compiler, so inductor itself runs)."""
    cfg = small_config(protocol="push", **F32, **{"buffer.max_tokens_per_rank": 16})
    for layout in ("rank", "expert"):
        got = spawn(check_compiled_layer, 2, args=(cfg.to_dict(), seed + 60, backend,
                                                   dict(LAYER, output_layout=layout)), timeout_s=600.0)
        assert [g["frames"] for g in got] == [1, 1], got


# -- bad use ---------------------------------------------------------------------------------------
def _inputs(buf, seed, tokens=12):
    b = buf.config.buffer
    (i,) = make_inputs(Routing("masked", mask_prob=0.3), num_tokens=tokens, hidden=b.hidden, topk=b.topk,
                       num_experts=b.num_experts, world_size=1, dtype=buf.dtype, seed=seed)
    return i.x.requires_grad_(True), i.topk_idx, i.topk_weights.requires_grad_(True)


def test_a_gradient_of_the_wrong_dtype_or_shape_is_refused_naming_it(seed):
    with Buffer(None, small_config()) as buf:
        x, idx, w = _inputs(buf, seed)
        for layout in ("rank", "expert"):
            d = autograd.dispatch(buf, x, idx, w, output_layout=layout)
            n, H = d.x.shape
            with pytest.raises(InputError, match=r"^backward of dispatch: grad_recv_x has dtype torch.float64; "
                                                 r"expected torch.bfloat16$"):
                autograd.dispatch_backward(buf, d.handle, torch.randn(n, H, dtype=torch.float64))
            with pytest.raises(InputError, match=rf"^backward of dispatch: grad_recv_x has shape \({n + 1}, {H}\); "
                                                 rf"expected \({n}, {H}\)$"):
                autograd.dispatch_backward(buf, d.handle, torch.randn(n + 1, H).to(buf.dtype))
            with pytest.raises(InputError, match=r"^backward of dispatch: grad_recv_topk_weights has dtype "
                                                 r"torch.bfloat16; expected torch.float32$"):
                autograd.dispatch_backward(buf, d.handle, torch.randn(n, H).to(buf.dtype),
                                           torch.randn(d.topk_weights.shape).to(buf.dtype), d.topk_idx)
            with pytest.raises(InputError, match=rf"^backward of combine: grad_x has shape \(3, {H}\); "
                                                 rf"expected \({x.shape[0]}, {H}\)$"):
                autograd.combine_backward(buf, d.handle, torch.randn(3, H).to(buf.dtype))
            with pytest.raises(InputError, match=r"^backward of combine: grad_x has dtype torch.float32; "
                                                 r"expected torch.bfloat16$"):
                autograd.combine_backward(buf, d.handle, torch.randn(x.shape[0], H))


def test_a_handle_from_another_buffer_is_refused(seed):
    with Buffer(None, small_config()) as a, Buffer(None, small_config()) as b:
        x, idx, w = _inputs(a, seed)
        d = autograd.dispatch(a, x, idx, w)
        with pytest.raises(InputError, match=r"handle was made by another Buffer; combine with the Buffer that "
                                             r"dispatched"):
            autograd.combine(b, d.x, d.handle)
        with pytest.raises(InputError, match=r"^handle was made by another Buffer; run the backward of dispatch with the "
                                             r"Buffer that dispatched$"):
            autograd.dispatch_backward(b, d.handle, torch.zeros_like(d.x))
        rx, _, _, _, ref = ops.dispatch(a, x, idx, w, num_worst_tokens=64)
        with pytest.raises(InputError, match=rf"^handle was made by Buffer #{ref.buffer}; combine with the Buffer "
                                             rf"that dispatched \(this is Buffer #{ops.register(b)}\)$"):
            ops.combine(b, rx, ref)
        with pytest.raises(InputError, match=rf"symmoe::combine: handle key {int(ref.key)} was made by Buffer "
                                             rf"#{ref.buffer}; this call is on Buffer #{ops.register(b)}"):
            torch.ops.symmoe.combine(rx, ref.key, None, ops.register(b), x.shape[0], False, False)


@pytest.mark.parametrize("use_ops", [False, True], ids=["autograd", "ops"])
def test_backward_after_close_raises_instead_of_touching_freed_memory(use_ops, seed):
    buf = Buffer(None, small_config())
    x, idx, w = _inputs(buf, seed)
    if use_ops:
        rx, _, rw, _, h = ops.dispatch(buf, x, idx, w, num_worst_tokens=64)
        out = ops.combine(buf, rx * rw.sum(1, keepdim=True).to(rx.dtype), h)
        expect = rf"^backward of symmoe::combine: Buffer #{h.buffer} was closed; keep it open until the backward "
    else:
        d = autograd.dispatch(buf, x, idx, w)
        out = autograd.combine(buf, d.x * d.topk_weights.sum(1, keepdim=True).to(d.x.dtype), d.handle)
        expect = r"^backward of combine: its Buffer was closed before backward ran; keep the Buffer open"
    buf.close()
    with pytest.raises(InputError, match=expect):
        out.float().sum().backward()


def test_misused_arguments_are_refused_naming_the_value(seed):
    with Buffer(None, small_config()) as buf:
        x, idx, w = _inputs(buf, seed)
        with pytest.raises(InputError, match=r"^num_worst_tokens=0: the symmoe ops need worst-case sizes"):
            ops.dispatch(buf, x, idx, w, num_worst_tokens=0)
        d = autograd.dispatch(buf, x, idx, w, output_layout="rank")
        with pytest.raises(InputError, match=r"^combine: topk_weights given for a rank-major handle"):
            autograd.combine(buf, d.x, d.handle, w)
        rx, _, _, _, h = ops.dispatch(buf, x.detach(), idx, w.detach(), num_worst_tokens=64)
        with torch.no_grad():
            ops.combine(buf, rx, h)  # nothing needs a gradient: the combine is the handle's last use
        assert ops.live_handles(buf) == 0
        with pytest.raises(InputError, match=rf"^symmoe::combine: handle key {int(h.key)} is not live"):
            ops.combine(buf, rx, h)
    from symmoe.nn import MoELayer
    with Buffer(None, small_config()) as buf:
        with pytest.raises(InputError, match=r"^num_groups=3, topk_groups=2: need num_experts=32 divisible"):
            MoELayer(buf, 16, num_groups=3, topk_groups=2)
        with pytest.raises(InputError, match=r"^score_func='relu'; allowed: 'softmax', 'sigmoid'$"):
            MoELayer(buf, 16, score_func="relu")


class _GarbageGroupedMM(torch.autograd.Function):
    """torch._grouped_mm's contract on the CPU: rows of each group through its matrix, and the
    rows past the last group left unwritten, here NaN, in the output and in the input gradient."""

    @staticmethod
    def forward(ctx, x, w, offs):
        ctx.save_for_backward(x, w, offs)
        out = torch.full((x.shape[0], w.shape[2]), float("nan"), dtype=x.dtype)
        start = 0
        for g, end in enumerate(offs.tolist()):
            out[start:end] = x[start:end] @ w[g]
            start = end
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w, offs = ctx.saved_tensors
        gx, gw = torch.full_like(x, float("nan")), torch.zeros_like(w)
        start = 0
        for g, end in enumerate(offs.tolist()):
            gx[start:end] = grad[start:end] @ w[g].T
            gw[g] = x[start:end].T @ grad[start:end]
            start = end
        return gx, gw, None


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_the_grouped_gemm_experts_equal_the_loop_over_experts_and_keep_garbage_rows_out(layout, seed):
    """MoELayer's grouped path (taken on the GPU) against its loop over experts (float32,
    1e-5: the slot sum and the expert loop add in other orders), forward and every gradient,
    with a grouped GEMM that leaves NaN wherever torch._grouped_mm leaves memory unwritten."""
    from symmoe.nn import MoELayer
    g = torch.Generator().manual_seed(seed)
    with Buffer(None, small_config(**{"buffer.dtype": "float32"})) as buf:
        layer = MoELayer(buf, 24, seed=seed)
        L, N, K = layer.local_experts, 40, buf.config.buffer.topk
        x = torch.randn(N, layer.hidden, generator=g)
        if layout == "rank":
            idx = torch.randint(0, L, (N, K), generator=g)
            idx[torch.rand(N, K, generator=g) < 0.4] = -1
            idx[:3] = -1  # rows no local slot names (worst-size padding)
            w = torch.randn(N, K, generator=g)  # masked slots too: never read
            slots, coef = idx, w
        else:
            idx = torch.randint(-1, L, (N,), generator=g)
            slots, coef, w = idx.unsqueeze(1), (idx >= 0).float().unsqueeze(1), None
        outs = []
        for grouped in (False, True):
            layer.zero_grad()
            xi = x.clone().requires_grad_(True)
            ci = coef.clone().requires_grad_(True)
            y = (layer._grouped(xi, slots, ci, gmm=_GarbageGroupedMM.apply) if grouped
                 else layer.experts(xi, idx, ci if w is not None else None))
            y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1)))
            outs.append((y.detach(), xi.grad, layer.w13.grad.clone(), layer.w2.grad.clone(),
                         ci.grad if w is not None else torch.zeros(())))
        for name, a, b in zip(("output", "x grad", "w13 grad", "w2 grad", "weights grad"), *outs):
            assert bool(torch.isfinite(b).all()), f"{name}: NaN from unwritten rows reached it"
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
