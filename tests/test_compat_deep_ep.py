"""DeepEP compat shims (symmoe.compat.deep_ep_v1 / deep_ep_v2).

Model code written for DeepEP -- copied in the shape of DeepEP's README, get_buffer ->
dispatch -> expert compute -> combine and the backward passes -- runs unchanged against the
shims on the host backend at 1, 2 and 4 processes, and returns exactly (bitwise) what
symmoe.reference defines and what symmoe.Buffer returns when called directly. Routings are
fresh every run (masked -1 slots, zipf skew, ranks that receive nothing, a rank with no
tokens). Arguments symmoe cannot honour raise and name the argument, the value and what is
supported.
"""
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist

from conftest import SESSION_SEED, small_config
from symmoe import reference
from symmoe.compat import CompatError, UnsupportedArgument, UnsupportedCall
from symmoe.errors import InputError
from symmoe.launch import spawn
from symmoe.testing import assert_bitwise
from symmoe.workload import Routing, make_inputs

import symmoe.compat.deep_ep_v1 as deep_ep
import symmoe.compat.deep_ep_v2 as deep_ep_v2

CFG = small_config(**{"kernel.timeout_s": 20.0})  # hidden 64, <= 48 tokens per rank, top-4 of 32 experts
B = CFG.buffer
ROUTINGS = (Routing("masked", mask_prob=0.3), Routing("zipf", zipf_s=2.0), Routing("empty_ranks", empty_ranks=(1,)))


# ---- model code written for DeepEP V1 (README of deep_ep.Buffer); nothing here knows symmoe ----
_buffer = None
deep_ep.Buffer.set_num_sms(24)


def get_buffer(group, hidden_bytes):
    global _buffer
    num_nvl_bytes, num_rdma_bytes = 0, 0
    for config in (deep_ep.Buffer.get_dispatch_config(group.size()), deep_ep.Buffer.get_combine_config(group.size())):
        num_nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden_bytes, group.size()), num_nvl_bytes)
        num_rdma_bytes = max(config.get_rdma_buffer_size_hint(hidden_bytes, group.size()), num_rdma_bytes)
    if _buffer is None or _buffer.group != group or _buffer.num_nvl_bytes < num_nvl_bytes \
            or _buffer.num_rdma_bytes < num_rdma_bytes:
        _buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)
    return _buffer


def get_hidden_bytes(x):
    t = x[0] if isinstance(x, tuple) else x
    return t.size(1) * max(t.element_size(), 2)


def dispatch_forward(x, topk_idx, topk_weights, num_experts, previous_event=None):
    num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, previous_event = \
        _buffer.get_dispatch_layout(topk_idx, num_experts, previous_event=previous_event, async_finish=True,
                                    allocate_on_comm_stream=previous_event is not None)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event = \
        _buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights,
                         num_tokens_per_rank=num_tokens_per_rank, num_tokens_per_rdma_rank=num_tokens_per_rdma_rank,
                         is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert,
                         previous_event=previous_event, async_finish=True, allocate_on_comm_stream=True)
    return recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event


def dispatch_backward(grad_recv_x, grad_recv_topk_weights, handle):
    combined_grad_x, combined_grad_recv_topk_weights, event = \
        _buffer.combine(grad_recv_x, handle, topk_weights=grad_recv_topk_weights, async_finish=True)
    return combined_grad_x, combined_grad_recv_topk_weights, event


def combine_forward(x, handle, previous_event=None):
    combined_x, _, event = _buffer.combine(x, handle, async_finish=True, previous_event=previous_event,
                                           allocate_on_comm_stream=previous_event is not None)
    return combined_x, event


def combine_backward(grad_combined_x, handle, previous_event=None):
    grad_x, _, _, _, _, event = _buffer.dispatch(grad_combined_x, handle=handle, async_finish=True,
                                                 previous_event=previous_event,
                                                 allocate_on_comm_stream=previous_event is not None)
    return grad_x, event


def fake_experts(recv_x, recv_topk_idx, recv_topk_weights):
    """Stands in for the expert MLPs: scales each row by its local experts' ids and weights."""
    scale = torch.where(recv_topk_idx >= 0, recv_topk_weights * (recv_topk_idx + 1).float() / 8, 0.0).sum(1)
    return (recv_x.float() * (1 + scale).unsqueeze(1)).to(recv_x.dtype)


def moe_layer(x, topk_idx, topk_weights, num_experts):
    get_buffer(dist.group.WORLD, get_hidden_bytes(x))
    recv_x, recv_topk_idx, recv_topk_weights, tokens_per_expert, handle, event = \
        dispatch_forward(x, topk_idx, topk_weights, num_experts)
    event.current_stream_wait()
    y = fake_experts(recv_x, recv_topk_idx, recv_topk_weights)
    combined_x, event = combine_forward(y, handle)
    event.current_stream_wait()
    return recv_x, recv_topk_idx, recv_topk_weights, tokens_per_expert, handle, combined_x
# ---- end of DeepEP V1 model code ----


# ---- model code written for DeepEP V2 (README of deep_ep.ElasticBuffer) ----
_buffer_v2 = None
_num_comm_sms = 0


def get_buffer_v2(group, num_max_tokens_per_rank, hidden, num_topk, num_experts, use_fp8_dispatch=False):
    global _buffer_v2, _num_comm_sms
    required_bytes = deep_ep_v2.ElasticBuffer.get_buffer_size_hint(
        group, num_max_tokens_per_rank, hidden, num_topk=num_topk, use_fp8_dispatch=use_fp8_dispatch)
    if _buffer_v2 is not None and _buffer_v2.group == group and _buffer_v2.num_bytes >= required_bytes:
        return _buffer_v2
    _buffer_v2 = deep_ep_v2.ElasticBuffer(group, num_max_tokens_per_rank=num_max_tokens_per_rank, hidden=hidden,
                                          num_topk=num_topk, use_fp8_dispatch=use_fp8_dispatch)
    _num_comm_sms = _buffer_v2.get_theoretical_num_sms(num_experts, num_topk)
    return _buffer_v2


def dispatch_forward_v2(x, topk_idx, topk_weights, num_experts, num_max_tokens_per_rank, expert_alignment=1,
                        do_expand=False):
    recv_x, recv_topk_idx, recv_topk_weights, handle, event = _buffer_v2.dispatch(
        x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=num_experts,
        num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=expert_alignment,
        num_sms=_num_comm_sms, async_with_compute_stream=True, do_expand=do_expand)
    return recv_x, recv_topk_idx, recv_topk_weights, handle, event


def dispatch_backward_v2(grad_recv_x, grad_recv_topk_weights, handle):
    combined_grad_x, combined_grad_topk_weights, event = _buffer_v2.combine(
        grad_recv_x, handle=handle, topk_weights=grad_recv_topk_weights, num_sms=_num_comm_sms,
        async_with_compute_stream=True)
    return combined_grad_x, combined_grad_topk_weights, event


def combine_forward_v2(x, handle):
    combined_x, _, event = _buffer_v2.combine(x, handle=handle, num_sms=_num_comm_sms, async_with_compute_stream=True)
    return combined_x, event


def combine_backward_v2(grad_combined_x, handle):
    grad_x, _, _, _, event = _buffer_v2.dispatch(grad_combined_x, handle=handle, num_sms=_num_comm_sms,
                                                 async_with_compute_stream=True)
    return grad_x, event
# ---- end of DeepEP V2 model code ----


# ---- per-rank scenarios (one spawn per world size runs them all) --------------------------------
def _inputs(routing, world_size, seed):
    """Every rank's inputs (each rank builds all of them from the seed, for the reference);
    token counts differ per rank and the last of >2 ranks has none."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(B.max_tokens_per_rank // 2, B.max_tokens_per_rank + 1, (world_size,), generator=g).tolist()
    if world_size > 2:
        counts[-1] = 0
    return make_inputs(routing, num_tokens=counts, hidden=B.hidden, topk=B.topk, num_experts=B.num_experts,
                       world_size=world_size, dtype=torch.bfloat16, seed=seed)


def _per_rank_randn(shapes, seed, dtype=torch.bfloat16):
    return [torch.randn(s, generator=torch.Generator().manual_seed(seed * 31 + r)).to(dtype)
            for r, s in enumerate(shapes)]


def _ref(inputs, layout="rank", alignment=1):
    return reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs],
                              [i.topk_weights for i in inputs], B.num_experts, layout, alignment)


def _cases(rank, world_size, seed, layout="rank", alignment=1):
    """One case per routing: (all ranks' inputs, this rank's, the reference dispatch, this
    rank's expected receive, a label for failures)."""
    for i, routing in enumerate(ROUTINGS):
        inputs = _inputs(routing, world_size, seed + i)
        ref = _ref(inputs, layout, alignment)
        yield inputs, inputs[rank], ref, ref.recv[rank], f"rank {rank}/{world_size} routing={routing.kind}"


def _ref_combine(ys, ref, inputs, layout="rank", recv_topk_weights=None, weights=None):
    return reference.combine(ys, ref, [i.topk_idx for i in inputs],
                             weights or [i.topk_weights for i in inputs], B.num_experts, layout, recv_topk_weights)


def v1_forward_matches_reference_and_symmoe(rank, world_size, seed):
    deep_ep.set_default_config(CFG)
    for inputs, mine, ref, want, ctx in _cases(rank, world_size, seed):
        recv_x, recv_idx, recv_w, per_expert, handle, combined_x = \
            moe_layer(mine.x, mine.topk_idx, mine.topk_weights, B.num_experts)
        assert_bitwise("recv_x", recv_x, want.x, ctx)
        assert_bitwise("recv_topk_idx", recv_idx, want.topk_idx, ctx)  # local ids, -1 elsewhere
        assert_bitwise("recv_topk_weights", recv_w, want.topk_weights, ctx)  # 0 where -1
        assert per_expert == want.num_recv_tokens_per_expert.tolist(), ctx
        # handle[0]: DeepEP's rank_prefix_matrix -- rows from source s end at [s][rank]
        ends = handle[0][:, rank].tolist()
        assert ends == torch.bincount(want.src_rank.long(), minlength=world_size).cumsum(0).tolist(), ctx
        assert_bitwise("handle recv_src_idx", handle[3], want.src_token, ctx)
        assert_bitwise("handle is_token_in_rank", handle[4],
                       reference.get_dispatch_layout(mine.topk_idx, B.num_experts, world_size).is_token_in_rank, ctx)
        ys = [fake_experts(r.x, r.topk_idx, r.topk_weights) for r in ref.recv]
        assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], ctx)

        # The same call on symmoe.Buffer directly gives the same tensors.
        sx, si, sw, sper, sh, _ = _buffer.symmoe.dispatch(mine.x, mine.topk_idx, mine.topk_weights,
                                                          output_layout="rank")
        for name, a, b in (("recv_x", sx, recv_x), ("recv_topk_idx", si, recv_idx), ("recv_topk_weights", sw, recv_w)):
            assert_bitwise(name + " (symmoe.Buffer)", a, b, ctx)
        assert_bitwise("combined_x (symmoe.Buffer)", _buffer.symmoe.combine(ys[rank], sh)[0], combined_x, ctx)


def v1_backward_passes_match_reference(rank, world_size, seed):
    deep_ep.set_default_config(CFG)
    inputs = _inputs(ROUTINGS[0], world_size, seed)
    mine, ref = inputs[rank], _ref(inputs)
    ctx = f"rank {rank}/{world_size}"
    idx, w = mine.topk_idx.clone(), mine.topk_weights.clone()
    _, _, _, _, handle, _ = moe_layer(mine.x, idx, w, B.num_experts)
    idx.fill_(-1), w.zero_()  # DeepEP's handle holds no routing: the caller may reuse these before backward
    # combine's backward is a cached dispatch: the gradient goes where the tokens went
    grads = _per_rank_randn([(i.x.shape[0], B.hidden) for i in inputs], seed)
    grad_x, event = combine_backward(grads[rank], handle)
    event.current_stream_wait()
    assert_bitwise("combine_backward grad_x", grad_x, _ref([type(i)(g, i.topk_idx, i.topk_weights)
                                                            for i, g in zip(inputs, grads)]).recv[rank].x, ctx)
    # dispatch's backward is a combine that also sums the top-k weight gradients
    gx = _per_rank_randn([tuple(r.x.shape) for r in ref.recv], seed + 1)
    gw = _per_rank_randn([tuple(r.topk_weights.shape) for r in ref.recv], seed + 2, torch.float32)
    combined_grad_x, combined_grad_w, _ = dispatch_backward(gx[rank], gw[rank], handle)
    want = _ref_combine(gx, ref, inputs, recv_topk_weights=gw)[rank]
    assert_bitwise("dispatch_backward grad_x", combined_grad_x, want[0], ctx)
    assert_bitwise("dispatch_backward grad_topk_weights", combined_grad_w, want[1], ctx)


def v1_handles_of_several_layers_stay_valid(rank, world_size, seed):
    """Layers share one buffer; a layer's handle is used again after other layers dispatched."""
    deep_ep.set_default_config(CFG)
    get_buffer(dist.group.WORLD, B.hidden * 2)
    layers = [_inputs(r, world_size, seed + i) for i, r in enumerate(ROUTINGS[:2])]
    outs = [dispatch_forward(l[rank].x, l[rank].topk_idx, l[rank].topk_weights, B.num_experts) for l in layers]
    for inputs, out in reversed(list(zip(layers, outs))):
        ref = _ref(inputs)
        ys = [fake_experts(r.x, r.topk_idx, r.topk_weights) for r in ref.recv]
        combined_x, _ = combine_forward(fake_experts(*out[:3]), out[4])
        assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], f"rank {rank}")


def v1_expert_alignment_and_num_worst_tokens(rank, world_size, seed):
    deep_ep.set_default_config(CFG)
    buf = get_buffer(dist.group.WORLD, B.hidden * 2)
    inputs = _inputs(ROUTINGS[1], world_size, seed)
    mine, ref = inputs[rank], _ref(inputs)
    want, ctx = ref.recv[rank], f"rank {rank}/{world_size}"
    n = want.x.shape[0]
    layout = buf.get_dispatch_layout(mine.topk_idx, B.num_experts)
    # expert_alignment rounds each local expert's count up; recv_x itself is not padded
    _, _, _, per_expert, _, _ = buf.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights,
                                             num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                                             num_tokens_per_expert=layout[2], expert_alignment=8)
    assert per_expert == [(c + 7) // 8 * 8 for c in want.num_recv_tokens_per_expert.tolist()], ctx
    # num_worst_tokens: worst-case-sized outputs, real rows first, then -1 expert ids; empty list
    worst = B.max_tokens_per_rank * world_size
    rx, ri, rw, per_expert, handle, _ = buf.dispatch(
        mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights, num_tokens_per_rank=layout[0],
        is_token_in_rank=layout[3], num_tokens_per_expert=layout[2], num_worst_tokens=worst)
    assert per_expert == [] and rx.shape[0] == ri.shape[0] == rw.shape[0] == worst, ctx
    assert_bitwise("recv_x[:n]", rx[:n], want.x, ctx)
    assert bool((ri[n:] == -1).all()), ctx
    # combine takes the worst-case-sized tensor; its tail rows carry nothing
    ys = [fake_experts(r.x, r.topk_idx, r.topk_weights) for r in ref.recv]
    y = torch.cat([ys[rank], torch.full((worst - n, B.hidden), 7.0, dtype=torch.bfloat16)])
    combined_x, _, _ = buf.combine(y, handle)
    assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], ctx)


def v2_forward_matches_reference(rank, world_size, seed):
    deep_ep_v2.set_default_config(CFG)
    for inputs, mine, ref, want, ctx in _cases(rank, world_size, seed):
        get_buffer_v2(dist.group.WORLD, B.max_tokens_per_rank, B.hidden, B.topk, B.num_experts)
        recv_x, recv_idx, recv_w, handle, event = dispatch_forward_v2(
            mine.x, mine.topk_idx, mine.topk_weights, B.num_experts, B.max_tokens_per_rank, expert_alignment=2)
        event.current_stream_wait()
        assert_bitwise("recv_x", recv_x, want.x, ctx)
        assert_bitwise("recv_topk_idx", recv_idx, want.topk_idx, ctx)
        assert_bitwise("recv_topk_weights", recv_w, want.topk_weights, ctx)
        counts = want.num_recv_tokens_per_expert.tolist()
        assert handle.num_recv_tokens_per_expert_list == [(c + 1) // 2 * 2 for c in counts], ctx
        assert handle.psum_num_recv_tokens_per_scaleup_rank.tolist() == \
            torch.bincount(want.src_rank.long(), minlength=world_size).cumsum(0).tolist(), ctx
        meta = handle.recv_src_metadata  # DeepEP's src_token_global_idx in column 0
        assert meta[:, 0].tolist() == (want.src_rank * B.max_tokens_per_rank + want.src_token).tolist(), ctx
        ys = [fake_experts(r.x, r.topk_idx, r.topk_weights) for r in ref.recv]
        combined_x, _ = combine_forward_v2(ys[rank], handle)
        assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], ctx)


def v2_expanded_layout_matches_reference(rank, world_size, seed):
    """do_expand=True is symmoe's expert-major layout; combine sums the slots, unweighted."""
    deep_ep_v2.set_default_config(CFG)
    a = B.expert_alignment
    for i, (inputs, mine, ref, want, ctx) in enumerate(_cases(rank, world_size, seed, "expert", a)):
        get_buffer_v2(dist.group.WORLD, B.max_tokens_per_rank, B.hidden, B.topk, B.num_experts)
        recv_x, recv_idx, recv_w, handle, _ = dispatch_forward_v2(
            mine.x, mine.topk_idx, mine.topk_weights, B.num_experts, B.max_tokens_per_rank, expert_alignment=a,
            do_expand=True)
        assert recv_idx is None, ctx
        assert_bitwise("recv_x", recv_x, want.x, ctx)
        assert_bitwise("recv_topk_weights", recv_w, want.topk_weights, ctx)
        counts = want.num_recv_tokens_per_expert.long()
        assert handle.psum_num_recv_tokens_per_expert.tolist() == (want.expert_offsets[:-1] + counts).tolist(), ctx
        assert handle.num_expanded_tokens == recv_x.shape[0], ctx
        # recv_src_metadata[:, 2:] names each slot's expanded row (as DeepEP's tests use it)
        meta = handle.recv_src_metadata
        slots = meta[:, 2:]
        rows = slots[slots >= 0].long()
        assert sorted(rows.tolist()) == (want.src_rank >= 0).nonzero().flatten().tolist(), ctx
        owner = meta[:, :1].expand_as(slots)[slots >= 0]
        assert owner.tolist() == (want.src_rank * B.max_tokens_per_rank + want.src_token)[rows].tolist(), ctx
        ys = [(r.x.float() * (1 + r.topk_weights).unsqueeze(1)).to(r.x.dtype) for r in ref.recv]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            combined_x, _ = combine_forward_v2(ys[rank], handle)
        assert i > 0 or any("allow_multiple_reduction" in str(w.message) for w in caught), ctx
        ones = [(inp.topk_idx >= 0).float() for inp in inputs]
        assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs, "expert", weights=ones)[rank][0], ctx)


def v2_backward_and_cached_dispatch(rank, world_size, seed):
    deep_ep_v2.set_default_config(CFG)
    inputs = _inputs(ROUTINGS[0], world_size, seed)
    mine, ref = inputs[rank], _ref(inputs)
    ctx = f"rank {rank}/{world_size}"
    get_buffer_v2(dist.group.WORLD, B.max_tokens_per_rank, B.hidden, B.topk, B.num_experts)
    recv_x, recv_idx, recv_w, handle, _ = dispatch_forward_v2(mine.x, mine.topk_idx, mine.topk_weights,
                                                              B.num_experts, B.max_tokens_per_rank)
    grads = _per_rank_randn([(i.x.shape[0], B.hidden) for i in inputs], seed)
    grad_x, _ = combine_backward_v2(grads[rank], handle)
    assert_bitwise("combine_backward grad_x", grad_x, _ref([type(i)(g, i.topk_idx, i.topk_weights)
                                                            for i, g in zip(inputs, grads)]).recv[rank].x, ctx)
    # decoding loop: a cached dispatch returns the same handle and the same rows
    cached_x, cached_idx, _, cached_handle, _ = _buffer_v2.dispatch(mine.x, handle=handle)
    assert cached_handle is handle, ctx
    assert_bitwise("cached recv_x", cached_x, recv_x, ctx)
    assert_bitwise("cached recv_topk_idx", cached_idx, recv_idx, ctx)
    # dispatch's backward: V2 returns, per slot, the value the rank owning that expert sent
    # back -- whatever the other ranks hold in that slot
    gx = _per_rank_randn([tuple(r.x.shape) for r in ref.recv], seed + 1)
    gw = _per_rank_randn([tuple(r.topk_weights.shape) for r in ref.recv], seed + 2, torch.float32)
    combined_grad_x, combined_grad_w, _ = dispatch_backward_v2(gx[rank], gw[rank], handle)
    owned = [g.masked_fill(r.topk_idx < 0, 0.0) for g, r in zip(gw, ref.recv)]
    want = _ref_combine(gx, ref, inputs, recv_topk_weights=owned)[rank]
    assert_bitwise("dispatch_backward grad_x", combined_grad_x, want[0], ctx)
    assert_bitwise("dispatch_backward grad_topk_weights", combined_grad_w, want[1], ctx)


def v2_without_cpu_sync_returns_worst_case_sizes(rank, world_size, seed):
    deep_ep_v2.set_default_config(CFG)
    buf = get_buffer_v2(dist.group.WORLD, B.max_tokens_per_rank, B.hidden, B.topk, B.num_experts)
    inputs = _inputs(ROUTINGS[0], world_size, seed)
    mine, ref = inputs[rank], _ref(inputs)
    want, ctx = ref.recv[rank], f"rank {rank}/{world_size}"
    stats = torch.zeros(B.num_experts // world_size, dtype=torch.int32)
    recv_x, recv_idx, _, handle, _ = buf.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights,
                                                  do_cpu_sync=False, cumulative_local_expert_recv_stats=stats)
    n = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])  # how DeepEP code finds the real rows
    assert recv_x.shape[0] == handle.num_recv_tokens == B.max_tokens_per_rank * world_size, ctx
    assert handle.num_recv_tokens_per_expert_list == [] and stats.tolist() == want.num_recv_tokens_per_expert.tolist()
    assert_bitwise("recv_x[:n]", recv_x[:n], want.x, ctx)
    assert_bitwise("recv_topk_idx[:n]", recv_idx[:n], want.topk_idx, ctx)
    ys = [fake_experts(r.x, r.topk_idx, r.topk_weights) for r in ref.recv]
    y = torch.zeros_like(recv_x)
    y[:n] = ys[rank]
    combined_x, _, _ = buf.combine(y, handle)
    assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], ctx)



def v2_low_latency_path_is_the_normal_modes_bitwise(rank, world_size, seed):
    """ElasticBuffer(symmoe_low_latency=True): the expanded dispatch without CPU sync (V2's
    decode path), a cached dispatch of its handle and its combine run on the low-latency engine
    (capturable) and return what the normal mode returns, bitwise: outputs, weights, handle."""
    a = B.expert_alignment
    normal = deep_ep_v2.ElasticBuffer(dist.group.WORLD, symmoe_config=CFG, allow_multiple_reduction=False)
    fast = deep_ep_v2.ElasticBuffer(dist.group.WORLD, symmoe_config=CFG, allow_multiple_reduction=False,
                                    symmoe_low_latency=True)
    try:
        for inputs, mine, ref, want, ctx in _cases(rank, world_size, seed, "expert", a):
            kw = dict(topk_idx=mine.topk_idx, topk_weights=mine.topk_weights, expert_alignment=a, do_cpu_sync=False,
                      do_expand=True)
            stats = torch.zeros(B.num_experts // world_size, dtype=torch.int32)
            recv_x, recv_idx, recv_w, handle, _ = fast.dispatch(mine.x, cumulative_local_expert_recv_stats=stats, **kw)
            n_x, _, n_w, n_handle, _ = normal.dispatch(mine.x, **kw)
            assert handle._ll is not None and n_handle._ll is None, ctx
            m = want.x.shape[0]
            assert recv_idx is None and recv_x.shape[0] == handle.num_expanded_tokens == n_handle.num_expanded_tokens
            assert_bitwise("recv_x", recv_x, n_x, ctx)
            assert_bitwise("recv_x[:m]", recv_x[:m], want.x, ctx)
            assert not recv_x[m:].any(), ctx
            assert_bitwise("recv_topk_weights", recv_w, n_w, ctx)
            assert_bitwise("recv_topk_weights[:m]", recv_w[:m], want.topk_weights, ctx)
            assert stats.tolist() == want.num_recv_tokens_per_expert.tolist(), ctx
            for name in ("psum_num_recv_tokens_per_scaleup_rank", "psum_num_recv_tokens_per_expert",
                         "num_unaligned_recv_tokens_per_expert", "recv_src_metadata"):
                assert_bitwise(name, getattr(handle, name), getattr(n_handle, name), ctx)
            assert (handle.num_recv_tokens, handle.num_recv_tokens_per_expert_list) == (
                n_handle.num_recv_tokens, n_handle.num_recv_tokens_per_expert_list), ctx
            # the decoding loop's cached dispatch: the same handle, the same rows
            again, _, _, same, _ = fast.dispatch(mine.x, handle=handle, do_expand=True)
            assert same is handle, ctx
            assert_bitwise("cached recv_x", again, recv_x, ctx)
            ys = [(r.x.float() * (1 + r.topk_weights).unsqueeze(1)).to(r.x.dtype) for r in ref.recv]
            y = torch.zeros_like(recv_x)
            y[:m] = ys[rank]
            combined_x, combined_w, _ = fast.combine(y, handle)
            assert combined_w is None, ctx
            assert_bitwise("combined_x", combined_x, normal.combine(y, n_handle)[0], ctx)
            ones = [(inp.topk_idx >= 0).float() for inp in inputs]
            assert_bitwise("combined_x vs reference", combined_x,
                           _ref_combine(ys, ref, inputs, "expert", weights=ones)[rank][0], ctx)
    finally:
        fast.destroy()
        normal.destroy()

CFG8 = small_config(**{"kernel.timeout_s": 20.0, "buffer.hidden": 256})  # FP8: a multiple of 128 channels


def _fp8_cases(rank, world_size, seed, layout, alignment):
    """Per routing: every rank's FP8 inputs (float32 and UE8M0 scales in turn), this rank's x,
    the reference dispatch and a label."""
    from symmoe import fp8
    for i, routing in enumerate(ROUTINGS):
        counts = torch.randint(0, CFG8.buffer.max_tokens_per_rank + 1, (world_size,),
                               generator=torch.Generator().manual_seed(seed + i)).tolist()
        inputs = make_inputs(routing, num_tokens=counts, hidden=256, topk=B.topk, num_experts=B.num_experts,
                             world_size=world_size, dtype=torch.bfloat16, seed=seed + i)
        fmt = ("float32", "ue8m0")[i % 2]
        xs = [fp8.quantize(inp.x, fmt) for inp in inputs]
        ref = reference.dispatch(xs, [inp.topk_idx for inp in inputs], [inp.topk_weights for inp in inputs],
                                 B.num_experts, layout, alignment)
        yield inputs, xs, ref, f"rank {rank}/{world_size} FP8 {fmt} routing={routing.kind}"


def _assert_fp8(name, got, want, ctx):
    assert isinstance(got, tuple) and len(got) == 2, f"{ctx}: {name} is {type(got).__name__}, not (x_e4m3, scales)"
    assert_bitwise(name + " e4m3", got[0].view(torch.uint8), want[0].view(torch.uint8), ctx)
    assert_bitwise(name + " scales", got[1], want[1], ctx)


def v1_fp8_dispatch_matches_reference(rank, world_size, seed):
    """DeepEP V1's FP8 dispatch: x = (x_e4m3, x_scales) in, recv_x = (e4m3, scales) out, bytes
    unchanged; combine in bfloat16; the cached dispatch of the backward pass takes FP8 too."""
    buf = deep_ep.Buffer(dist.group.WORLD, 0, symmoe_config=CFG8)
    try:
        for inputs, xs, ref, ctx in _fp8_cases(rank, world_size, seed, "rank", 1):
            mine = inputs[rank]
            recv_x, recv_idx, recv_w, per_expert, handle, _ = buf.dispatch(
                xs[rank], topk_idx=mine.topk_idx, topk_weights=mine.topk_weights)
            want = ref.recv[rank]
            _assert_fp8("recv_x", recv_x, want.x, ctx)
            assert_bitwise("recv_topk_idx", recv_idx, want.topk_idx, ctx)
            assert per_expert == want.num_recv_tokens_per_expert.tolist(), ctx
            ys = _per_rank_randn([(r.topk_idx.shape[0], 256) for r in ref.recv], seed)
            combined_x, _, _ = buf.combine(ys[rank], handle)
            assert_bitwise("combined_x", combined_x, _ref_combine(ys, ref, inputs)[rank][0], ctx)
            recv_again, *_ = buf.dispatch(xs[rank], handle=handle)
            _assert_fp8("cached recv_x", recv_again, want.x, ctx)
    finally:
        buf.destroy()


def v2_fp8_expanded_dispatch_is_deep_gemm_ready(rank, world_size, seed):
    """DeepEP V2's FP8 dispatch with do_expand and use_tma_aligned_col_major_sf: the rows
    grouped by expert, the scales in DeepGEMM's MN-major TMA-aligned layout, and the handle's
    psum_num_recv_tokens_per_expert DeepGEMM's psum grouped layout."""
    from symmoe.fp8 import tma_aligned_rows
    buf = deep_ep_v2.ElasticBuffer(dist.group.WORLD, use_fp8_dispatch=True, symmoe_config=CFG8,
                                   allow_multiple_reduction=False)
    try:
        for inputs, xs, ref, ctx in _fp8_cases(rank, world_size, seed, "expert", 4):
            mine, want = inputs[rank], ref.recv[rank]
            recv_x, _, recv_w, handle, _ = buf.dispatch(
                xs[rank], topk_idx=mine.topk_idx, topk_weights=mine.topk_weights, expert_alignment=4, do_expand=True,
                use_tma_aligned_col_major_sf=True)
            _assert_fp8("recv_x", recv_x, want.x, ctx)
            M = recv_x[1].shape[0]
            assert M == 0 or recv_x[1].stride() == (1, tma_aligned_rows(M)), f"{ctx}: {recv_x[1].stride()}"
            assert_bitwise("recv_topk_weights", recv_w, want.topk_weights, ctx)
            assert_bitwise("psum_num_recv_tokens_per_expert", handle.psum_num_recv_tokens_per_expert,
                           reference.grouped_layout(want, psum=True), ctx)
            recv_again, *_ = buf.dispatch(xs[rank], handle=handle, do_expand=True, use_tma_aligned_col_major_sf=True)
            _assert_fp8("cached recv_x", recv_again, want.x, ctx)
    finally:
        buf.destroy()


SCENARIOS = [v1_forward_matches_reference_and_symmoe, v1_backward_passes_match_reference,
             v1_handles_of_several_layers_stay_valid, v1_expert_alignment_and_num_worst_tokens,
             v2_forward_matches_reference, v2_expanded_layout_matches_reference, v2_backward_and_cached_dispatch,
             v2_without_cpu_sync_returns_worst_case_sizes, v1_fp8_dispatch_matches_reference,
             v2_fp8_expanded_dispatch_is_deep_gemm_ready, v2_low_latency_path_is_the_normal_modes_bitwise]


def run_scenarios(rank, world_size, seed):
    """Each scenario's outcome on this rank: 'ok' or the traceback."""
    out = {}
    for i, scenario in enumerate(SCENARIOS):
        try:
            scenario(rank, world_size, seed + 1009 * i)
            out[scenario.__name__] = "ok"
        except Exception:
            out[scenario.__name__] = traceback.format_exc()
    return out


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda w: f"{w}proc")
def ranks(request):
    return spawn(run_scenarios, request.param, args=(SESSION_SEED + request.param,), timeout_s=120)


def _passed(ranks, scenario):
    failed = {r: o[scenario.__name__] for r, o in enumerate(ranks) if o[scenario.__name__] != "ok"}
    assert not failed, "\n".join(f"rank {r}:\n{tb}" for r, tb in failed.items())


# ---- the specification -------------------------------------------------------------------------
def test_v1_model_code_runs_unchanged_and_matches_reference_and_symmoe_bitwise(ranks):
    _passed(ranks, v1_forward_matches_reference_and_symmoe)


def test_v1_backward_cached_dispatch_and_weight_combine_match_reference(ranks):
    _passed(ranks, v1_backward_passes_match_reference)


def test_v1_handles_stay_valid_while_other_layers_dispatch(ranks):
    _passed(ranks, v1_handles_of_several_layers_stay_valid)


def test_v1_expert_alignment_rounds_counts_and_num_worst_tokens_pads_outputs(ranks):
    _passed(ranks, v1_expert_alignment_and_num_worst_tokens)


def test_v2_model_code_runs_unchanged_and_matches_reference_bitwise(ranks):
    _passed(ranks, v2_forward_matches_reference)


def test_v2_expanded_layout_is_symmoe_expert_major_and_combine_sums_slots(ranks):
    _passed(ranks, v2_expanded_layout_matches_reference)


def test_v2_backward_and_cached_dispatch_match_reference(ranks):
    _passed(ranks, v2_backward_and_cached_dispatch)


def test_v2_without_cpu_sync_outputs_have_deepep_worst_case_sizes(ranks):
    _passed(ranks, v2_without_cpu_sync_returns_worst_case_sizes)


def test_v1_fp8_dispatch_returns_the_bytes_as_deepep_returns_them(ranks):
    _passed(ranks, v1_fp8_dispatch_matches_reference)


def test_v2_fp8_expanded_dispatch_gives_deep_gemm_its_layout(ranks):
    _passed(ranks, v2_fp8_expanded_dispatch_is_deep_gemm_ready)


def test_v2_decode_path_on_the_low_latency_engine_returns_the_normal_modes_outputs(ranks):
    _passed(ranks, v2_low_latency_path_is_the_normal_modes_bitwise)


# ---- what cannot be honoured raises (one process, no spawn) ---------------------------------------
@pytest.fixture
def v1():
    buf = deep_ep.Buffer(None, symmoe_config=CFG)
    yield buf
    buf.destroy()


@pytest.fixture
def v2():
    buf = deep_ep_v2.ElasticBuffer(None, symmoe_config=CFG, allow_multiple_reduction=False)
    yield buf
    buf.destroy()


def _one_rank_inputs(seed=1):
    return _inputs(ROUTINGS[0], 1, seed)[0]


@pytest.mark.parametrize("kwargs, arg", [
    ({"num_rdma_bytes": 1 << 20}, "num_rdma_bytes=1048576"),
    ({"enable_shrink": True}, "enable_shrink=True"),
    ({"comm": object()}, "comm="),
])
def test_v1_buffer_rejects_modes_symmoe_does_not_have(kwargs, arg):
    with pytest.raises(UnsupportedArgument, match=arg) as e:
        deep_ep.Buffer(None, symmoe_config=CFG, **kwargs)
    assert "not supported by symmoe" in str(e.value)


def test_v1_fp8_combine_bias_and_layout_only_dispatch_raise_naming_the_argument(v1):
    mine = _one_rank_inputs()
    layout = v1.get_dispatch_layout(mine.topk_idx, B.num_experts)
    fp8 = (mine.x.to(torch.float8_e4m3fn), torch.ones(mine.x.shape[0], 1))
    with pytest.raises(InputError, match="FP8 x has hidden size 64; FP8 dispatch needs a multiple of 128"):
        v1.dispatch(fp8, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights)
    with pytest.raises(UnsupportedArgument, match="topk_idx=None.*layout-only dispatch"):
        v1.dispatch(mine.x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                    num_tokens_per_expert=layout[2])
    *_, handle, _ = v1.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights)
    with pytest.raises(UnsupportedArgument, match=r"x=\(Tensor\(dtype=torch.float8_e4m3fn.*FP8 is for dispatch only"):
        v1.combine(fp8, handle)
    with pytest.raises(UnsupportedArgument, match="bias=Tensor.*no bias term"):
        v1.combine(torch.zeros(handle.symmoe.num_recv_rows, B.hidden, dtype=torch.bfloat16), handle,
                   bias=torch.zeros(mine.x.shape, dtype=torch.bfloat16))


def test_v1_layout_that_disagrees_with_topk_idx_raises_instead_of_routing_differently(v1):
    mine = _one_rank_inputs()
    per_rank, _, per_expert, in_rank, _ = v1.get_dispatch_layout(mine.topk_idx, B.num_experts)
    other = in_rank.clone()
    other[0] = ~other[0]
    with pytest.raises(InputError, match="is_token_in_rank does not match topk_idx"):
        v1.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights, num_tokens_per_rank=per_rank,
                    is_token_in_rank=other, num_tokens_per_expert=per_expert)


def test_v1_deepep_internals_and_low_latency_calls_raise_with_reasons(v1):
    mine = _one_rank_inputs()
    *_, handle, _ = v1.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights)
    rank_prefix_matrix, channel_prefix_matrix, _, recv_src_idx, is_token_in_rank, send_head = handle
    with pytest.raises(CompatError, match="send_head is not provided.*channel/ring-buffer"):
        send_head.shape
    with pytest.raises(CompatError, match="channel_prefix_matrix"):
        torch.equal(channel_prefix_matrix, rank_prefix_matrix)
    with pytest.raises(UnsupportedCall, match="low_latency_dispatch.*low_latency_mode=True"):
        v1.low_latency_dispatch(mine.x, mine.topk_idx, 128, B.num_experts, use_fp8=False)
    with pytest.raises(InputError, match="another Buffer"):
        other = deep_ep.Buffer(None, symmoe_config=CFG)
        try:
            other.combine(torch.zeros(handle.symmoe.num_recv_rows, B.hidden, dtype=torch.bfloat16), handle)
        finally:
            other.destroy()


def test_v1_size_hints_map_onto_symmoe_layout():
    deep_ep.set_default_config(CFG)
    try:
        cfg = deep_ep.Buffer.get_dispatch_config(8)
        assert cfg.get_nvl_buffer_size_hint(B.hidden * 2, 8) == CFG.layout(8).total_bytes
        assert cfg.get_rdma_buffer_size_hint(B.hidden * 2, 8) == 0
        with pytest.raises(UnsupportedArgument, match="hidden_bytes=256.*buffer.hidden=64"):
            cfg.get_nvl_buffer_size_hint(256, 8)
    finally:
        deep_ep.set_default_config(None)


@pytest.mark.parametrize("kwargs, arg", [({"num_cpu_bytes": 1 << 21}, "num_cpu_bytes=2097152")])
def test_v2_buffer_rejects_engram_storage(kwargs, arg):
    with pytest.raises(UnsupportedArgument, match=arg):
        deep_ep_v2.ElasticBuffer(None, symmoe_config=CFG, **kwargs)


def test_v2_bias_expanded_weights_and_mismatched_cached_dispatch_raise(v2):
    mine = _one_rank_inputs()
    recv_x, _, recv_w, handle, _ = v2.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights)
    with pytest.raises(UnsupportedArgument, match="bias=Tensor"):
        v2.combine(recv_x, handle, bias=torch.zeros(mine.x.shape, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="do_expand=True but the handle was made with do_expand=False"):
        v2.dispatch(mine.x, handle=handle, do_expand=True)
    ex_x, _, ex_w, ex_handle, _ = v2.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights,
                                              do_expand=True, expert_alignment=B.expert_alignment)
    with pytest.raises(UnsupportedArgument, match="topk_weights=Tensor.*do_expand=False handle"):
        v2.combine(ex_x, ex_handle, topk_weights=ex_w)
    with pytest.raises(UnsupportedCall, match="engram_fetch.*Engram"):
        v2.engram_fetch(torch.zeros(4, 1, dtype=torch.int32))
    with pytest.raises(InputError, match="expert_alignment=8 exceeds buffer.expert_alignment=4"):
        v2.dispatch(mine.x, topk_idx=mine.topk_idx, topk_weights=mine.topk_weights, do_expand=True,
                    expert_alignment=8)


def test_v2_low_latency_flag_is_checked_and_its_path_refuses_fp8_naming_the_way_out():
    with pytest.raises(InputError, match="symmoe_low_latency='yes'; expected True or False"):
        deep_ep_v2.ElasticBuffer(None, symmoe_config=CFG, symmoe_low_latency="yes")
    cfg8 = small_config(**{"buffer.hidden": 256})
    buf = deep_ep_v2.ElasticBuffer(None, symmoe_config=cfg8, symmoe_low_latency=True)
    try:
        g = torch.Generator().manual_seed(SESSION_SEED)
        idx = torch.stack([torch.randperm(B.num_experts, generator=g)[:B.topk] for _ in range(5)])
        x8 = torch.randn(5, 256, generator=g).to(torch.float8_e4m3fn)
        sf = torch.rand(5, 2, generator=g)
        with pytest.raises(UnsupportedCall, match="FP8 x on symmoe_low_latency's path.*without symmoe_low_latency"):
            buf.dispatch((x8, sf), topk_idx=idx, do_expand=True, do_cpu_sync=False)
        # other calls of that buffer run the normal mode: an expanded dispatch with CPU sync
        _, _, _, handle, _ = buf.dispatch((x8, sf), topk_idx=idx, do_expand=True)
        assert handle._ll is None and handle.symmoe is not None
    finally:
        buf.destroy()
