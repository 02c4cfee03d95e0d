"""symmoe.reference on a case small enough to write out by hand: 2 ranks, 4 experts
(experts 0-1 on rank 0, 2-3 on rank 1), top-2."""
import torch

from symmoe import reference


def inputs():
    x0 = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    x1 = torch.tensor([[7.0, 8.0], [9.0, 10.0]])
    i0 = torch.tensor([[0, 2], [1, -1], [3, 2]])  # token 0 -> both ranks, 1 -> rank 0, 2 -> rank 1
    i1 = torch.tensor([[-1, -1], [1, 0]])  # token 0 -> nowhere, 1 -> rank 0
    w0 = torch.tensor([[0.5, 0.25], [1.0, 0.0], [0.75, 0.125]])
    w1 = torch.tensor([[0.0, 0.0], [0.5, 0.5]])
    return [x0, x1], [i0, i1], [w0, w1]


def test_layout_counts():
    lay = reference.get_dispatch_layout(inputs()[1][0], 4, 2)
    assert lay.num_tokens_per_rank.tolist() == [2, 2]
    assert lay.num_tokens_per_expert.tolist() == [1, 1, 2, 1]
    assert lay.is_token_in_rank.tolist() == [[True, True], [True, False], [False, True]]


def test_rank_major_orders_by_source_then_token_and_localises_ids():
    xs, idx, w = inputs()
    res = reference.dispatch(xs, idx, w, 4, "rank")
    r0, r1 = res.recv
    assert r0.x.tolist() == [[1, 2], [3, 4], [9, 10]]
    assert r0.topk_idx.tolist() == [[0, -1], [1, -1], [1, 0]]
    assert r0.topk_weights.tolist() == [[0.5, 0.0], [1.0, 0.0], [0.5, 0.5]]
    assert r0.num_recv_tokens_per_expert.tolist() == [2, 2]
    assert r1.x.tolist() == [[1, 2], [5, 6]]
    assert r1.topk_idx.tolist() == [[-1, 0], [1, 0]]
    assert res.send_rows[0].tolist() == [[0, 0], [1, -1], [-1, 1]]
    assert res.send_rows[1].tolist() == [[-1, -1], [2, -1]]


def test_expert_major_groups_by_expert_and_pads_with_zero_rows():
    xs, idx, w = inputs()
    r0 = reference.dispatch(xs, idx, w, 4, "expert", alignment=4).recv[0]
    # expert 0: (s0,t0), (s1,t1); expert 1: (s0,t1), (s1,t1); each padded to 4 rows
    assert r0.expert_offsets.tolist() == [0, 4, 8]
    assert r0.x.tolist() == [[1, 2], [9, 10], [0, 0], [0, 0], [3, 4], [9, 10], [0, 0], [0, 0]]
    assert r0.topk_idx.tolist() == [0, 0, -1, -1, 1, 1, -1, -1]
    assert r0.topk_weights.tolist() == [0.5, 0.5, 0, 0, 1.0, 0.5, 0, 0]
    assert r0.src_rank.tolist() == [0, 1, -1, -1, 0, 1, -1, -1]
    assert r0.num_recv_tokens_per_expert.tolist() == [2, 2]


def test_rank_major_combine_sums_over_ranks():
    xs, idx, w = inputs()
    res = reference.dispatch(xs, idx, w, 4, "rank")
    ys = [r.x * 10 for r in res.recv]
    out = reference.combine(ys, res, idx, w, 4, "rank")
    assert out[0][0].tolist() == [[20, 40], [30, 40], [50, 60]]
    assert out[1][0].tolist() == [[0, 0], [90, 100]]  # a token routed nowhere combines to zero


def test_expert_major_combine_weights_each_slot_in_k_order():
    xs, idx, w = inputs()
    res = reference.dispatch(xs, idx, w, 4, "expert")
    ys = [torch.ones_like(r.x) for r in res.recv]
    out = reference.combine(ys, res, idx, w, 4, "expert")
    assert out[0][0][:, 0].tolist() == [0.75, 1.0, 0.875]
    assert out[1][0][:, 0].tolist() == [0.0, 1.0]


def test_combine_rounds_each_product_before_adding():
    # fp32: w*y then add, not a fused multiply-add
    xs, idx, w = inputs()
    w = [t.clone() for t in w]
    w[0][0] = torch.tensor([1 / 3, 1 / 7])
    res = reference.dispatch(xs, idx, w, 4, "expert")
    ys = [torch.full_like(r.x, 0.1) for r in res.recv]
    got = reference.combine(ys, res, idx, w, 4, "expert")[0][0][0, 0]
    a = torch.tensor(1 / 3) * torch.tensor(0.1)
    b = torch.tensor(1 / 7) * torch.tensor(0.1)
    assert got.item() == (torch.tensor(0.0) + a + b).item()


def test_worst_case_outputs_append_rows_with_zero_x_no_expert_and_no_source():
    xs, idx, w = inputs()
    recv = reference.dispatch(xs, idx, w, 4, "rank").recv[1]  # 2 rows
    padded = reference.pad_recv(recv, 4)
    assert padded.x.tolist() == recv.x.tolist() + [[0.0, 0.0]] * 2
    assert padded.topk_idx.tolist() == recv.topk_idx.tolist() + [[-1, -1]] * 2
    assert padded.topk_weights.tolist() == recv.topk_weights.tolist() + [[0.0, 0.0]] * 2
    assert padded.src_rank.tolist() == recv.src_rank.tolist() + [-1, -1]
    assert padded.src_token.tolist() == recv.src_token.tolist() + [-1, -1]
    assert padded.num_recv_tokens_per_expert is recv.num_recv_tokens_per_expert
    assert reference.pad_recv(recv, 2) is recv  # no more rows than received: unchanged
