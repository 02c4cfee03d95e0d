"""What every rank reads off the exchanged counts matrix after the one host wait of a GPU
dispatch (symmoe.protocol.counts, shared by the CUDA and NVSHMEM protocols): the rows each
receiver gets and the per-expert counts must be the reference's, over-capacity and bad ids
raise with the same decision on every rank, and the results are views of the worst-case
outputs with a handle that keeps its own copy of the matrix."""
import dataclasses

import numpy as np
import pytest
import torch

from symmoe import reference
from symmoe.config import Config
from symmoe.errors import CapacityError, InputError
from symmoe.protocol.counts import (SUMMARY_HEAD, Guess, bad_input_error, cached_rows, check_summary_head, deferred_error,
                                    dispatch_result, received_rows, summarized_result, summary_of)
from symmoe.protocol.outputs import SRC_RANK, SRC_SLOT, SRC_TOKEN, Int32Block
from symmoe.testing.checks import CHECK_ROUTINGS, _tokens_per_rank
from symmoe.workload import make_inputs


def _case(W: int, routing, seed: int, align: int = 4, **over):
    cfg = Config().replace(**{"buffer.hidden": 16, "buffer.max_tokens_per_rank": 24, "buffer.topk": 4,
                              "buffer.num_experts": 16, "buffer.expert_alignment": align, **over})
    lay = cfg.layout(W)
    inputs = make_inputs(routing, num_tokens=_tokens_per_rank(W, lay.max_tokens, seed), hidden=lay.hidden,
                         topk=lay.topk, num_experts=lay.num_experts, world_size=W, dtype=torch.bfloat16, seed=seed)
    rows = []
    for i in inputs:  # each rank's published row: tokens, tokens per rank, pairs per expert
        r = reference.get_dispatch_layout(i.topk_idx, lay.num_experts, W)
        rows.append(torch.cat([torch.tensor([i.x.shape[0]], dtype=torch.int32), r.num_tokens_per_rank,
                               r.num_tokens_per_expert]))
    return lay, inputs, torch.stack(rows).numpy()


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("alignment", [1, 4])
def test_received_rows_are_the_references(W, layout, alignment):
    for n, routing in enumerate(CHECK_ROUTINGS):
        lay, inputs, counts = _case(W, routing, seed=100 * W + n)
        ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs],
                                 [i.topk_weights for i in inputs], lay.num_experts, layout, alignment)
        for r in range(W):
            totals, per_expert = received_rows(lay, counts, r, layout, alignment)
            # every receiver's rows, not only this rank's: all ranks judge capacity from them
            assert totals.tolist() == [ref.recv[d].x.shape[0] for d in range(W)], (routing, r)
            assert per_expert.tolist() == ref.recv[r].num_recv_tokens_per_expert.tolist(), (routing, r)


def test_a_receiver_over_capacity_raises_on_every_rank():
    from symmoe.workload import Routing
    lay, _, counts = _case(2, Routing("one_expert", expert=0), seed=5, **{"buffer.recv_capacity": 20})
    for r in range(2):  # rank 1 receives nothing, yet raises too: the decision is the matrix's
        with pytest.raises(CapacityError, match="recv_capacity"):
            received_rows(lay, counts, r, "rank", 4)


def test_bad_ids_name_the_id_on_the_bad_rank_and_the_bad_rank_elsewhere():
    from symmoe.workload import Routing
    lay, _, counts = _case(2, Routing("uniform"), seed=6)
    counts[1, 0] = -1  # rank 1's routing kernel rejected its ids
    own = bad_input_error(lay, counts, 1, (1, 3, 1, 23))
    other = bad_input_error(lay, counts, 0, (0, 0, 0, 0))
    assert isinstance(own, InputError) and "expert id 23 (token 3)" in str(own)
    assert "rank 1 passed an invalid topk_idx" in str(other)
    dup = bad_input_error(lay, counts, 1, (2, 5, 2, 7))
    assert "row 5 names expert 7 twice" in str(dup)
    for e in (own, other, dup):
        assert "moved nothing on any rank (ranks with bad input: [1])" in str(e)


def _worst_case_outputs(lay, layout: str) -> dict:
    """Outputs as a GPU dispatch allocates them (worst case), filled with distinct values."""
    cap, K, L = lay.recv_rows, lay.topk, lay.local_experts
    shape = (cap, K) if layout == "rank" else (cap,)
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn((cap, lay.hidden), generator=g).bfloat16(),
            "idx": torch.randint(0, lay.num_experts, shape, generator=g), "w": torch.rand(shape, generator=g),
            "block": _source_columns(cap, g), "expert_offsets": torch.arange(L + 1) if layout == "expert" else None}


def _source_columns(cap: int, g: torch.Generator) -> Int32Block:
    """The source rank, token and slot columns (Int32Block pieces 0-2), filled with distinct values."""
    block = Int32Block(torch.device("cpu"), (cap, cap, cap))
    for i, high in ((SRC_RANK, 4), (SRC_TOKEN, 24), (SRC_SLOT, 4)):
        block.piece(i, cap).copy_(torch.randint(0, high, (cap,), generator=g, dtype=torch.int32))
    return block


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_dispatch_result_views_this_ranks_rows_and_keeps_its_own_copy_of_the_matrix(layout):
    lay, inputs, counts = _case(2, CHECK_ROUTINGS[0], seed=7)
    ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                             lay.num_experts, layout, 4)
    out = _worst_case_outputs(lay, layout)
    mine = inputs[1]
    in_rank = torch.ones((mine.x.shape[0], 2), dtype=torch.bool)
    recv, handle = dispatch_result(lay, counts, 1, layout, 4, lambda: pytest.fail("read only for bad ids"), out,
                                   mine.topk_idx.int(), mine.topk_weights, in_rank, buffer_id=99)
    rows = ref.recv[1].x.shape[0]
    assert 0 < rows < out["x"].shape[0]
    assert recv.x.shape[0] == rows and recv.x.data_ptr() == out["x"].data_ptr()  # a view, no copy
    assert torch.equal(recv.topk_idx, out["idx"][:rows]) and torch.equal(recv.src_token, out["block"].piece(SRC_TOKEN, rows))
    assert recv.num_recv_tokens_per_expert.tolist() == ref.recv[1].num_recv_tokens_per_expert.tolist()
    assert recv.expert_offsets is out["expert_offsets"]
    assert handle.num_recv_rows == rows and handle.num_tokens == mine.x.shape[0] and handle.buffer_id == 99
    assert handle.topk_idx.dtype == torch.int64 and torch.equal(handle.topk_idx, mine.topk_idx)
    assert torch.equal(handle.recv_src_slot, out["block"].piece(SRC_SLOT, rows))
    published = counts.copy()
    counts[:] = -7  # the mapped memory is rewritten by the next dispatch
    assert handle.counts.numpy().tolist() == published.tolist()


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_a_rank_that_receives_every_output_row_gets_the_outputs_themselves(layout):
    """No slice where it would cut nothing: the usual world-size-1 case, where the host's
    work after its wait bounds the exact-size dispatch."""
    lay, inputs, counts = _case(1, CHECK_ROUTINGS[0], seed=8, align=1)
    mine = inputs[0]
    rows = int(received_rows(lay, counts, 0, layout, 1)[0][0])
    out = {k: (v[:rows] if k in ("x", "idx", "w") else v)  # sized as the receiver's rows
           for k, v in _worst_case_outputs(lay, layout).items()}
    in_rank = torch.ones((mine.x.shape[0], 1), dtype=torch.bool)
    recv, handle = summarized_result(lay, summary_of(counts, 0, 1, lay.local_experts), counts, 0, layout, 1,
                                     lambda: pytest.fail("read only for bad ids"), out, mine.topk_idx,
                                     mine.topk_weights, in_rank, 3)
    assert rows > 0 and recv.x is out["x"] and recv.topk_idx is out["idx"] and recv.topk_weights is out["w"]
    for got, i in ((recv.src_rank, SRC_RANK), (recv.src_token, SRC_TOKEN), (handle.recv_src_slot, SRC_SLOT)):
        assert got.data_ptr() == out["block"].ptr(i) and got.shape == (rows,)  # the block's pieces, no copy
    assert handle.num_recv_rows == rows


def _same_recv(recv, want) -> None:
    for f in ("x", "topk_idx", "topk_weights", "num_recv_tokens_per_expert", "src_rank", "src_token"):
        a, b = getattr(recv, f), getattr(want, f)
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), f


def _same_result(a, b) -> None:
    (recv, handle), (want, want_handle) = a, b
    _same_recv(recv, want)
    for f in ("output_layout", "num_tokens", "num_recv_rows", "buffer_id", "alignment", "num_worst_tokens"):
        assert getattr(handle, f) == getattr(want_handle, f), f
    for f in ("topk_idx", "counts", "recv_src_rank", "recv_src_token", "recv_src_slot"):
        assert torch.equal(getattr(handle, f), getattr(want_handle, f)), f
    assert handle.recv_counts[:2] == want_handle.recv_counts[:2]
    assert torch.equal(handle.recv_counts[2], want_handle.recv_counts[2])


def _wait(mod, lay, summary: np.ndarray, counts: np.ndarray, guess: Guess, stage: int = 0, deferred: int = 0) -> int:
    """What the dispatch's wait (host_wait.h's CountsWait) does for ``guess`` once the counts are
    in, over plain host memory standing in for the mapped words: the ready word at the epoch,
    the ErrorWord's stage and the DeferredError's kind as given."""
    epoch = 3
    ready, err, record = np.array([epoch], np.int64), np.array([stage, 0, 0, 0], np.int64), np.zeros(6, np.int64)
    record[0] = deferred
    w = mod.CountsWait(ready.ctypes.data, err.ctypes.data, record.ctypes.data, summary.ctypes.data, SUMMARY_HEAD,
                       counts.ctypes.data, counts.size, lay.local_experts, lay.recv_rows)
    return w.wait(epoch, 5.0, *guess.target)


@pytest.mark.build
@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_the_wait_fills_a_guessed_result_exactly_where_its_rows_are_the_received_ones(cuda_module, layout):
    """World size 1: the host builds the result for unmasked routing before its counts wait.
    The wait fills it, copying the counts out of the mapped memory (the next dispatch's), only
    when its rows are the received ones; it is then the result built after the wait."""
    used = []
    for n, routing in enumerate(CHECK_ROUTINGS):
        lay, inputs, counts = _case(1, routing, seed=400 + n, align=1)
        mine, in_rank = inputs[0], torch.ones((inputs[0].x.shape[0], 1), dtype=torch.bool)
        args = (_worst_case_outputs(lay, layout), mine.topk_idx, mine.topk_weights, in_rank, 6)
        summary = summary_of(counts, 0, 1, lay.local_experts)
        guess = Guess.of(lay, layout, 1, *args, None)
        got = _wait(cuda_module, lay, summary, counts, guess)
        rows = int(received_rows(lay, counts, 0, layout, 1)[0][0])
        assert got == (cuda_module.COUNTS_FILLED if rows == guess.rows else cuda_module.COUNTS_READY), routing
        used.append(got == cuda_module.COUNTS_FILLED)
        if used[-1]:
            want = summarized_result(lay, summary, counts, 0, layout, 1, lambda: pytest.fail("no bad ids"), *args)
            published = counts.copy()
            counts[:] = -7
            summary[:] = -7
            _same_result((guess.recv, guess.handle), want)
            assert guess.handle.counts.numpy().tolist() == published.tolist(), routing
    assert any(used) and not all(used), used  # both ways taken ("masked" must not be guessed)


def test_a_guess_is_made_only_where_the_rows_are_known_up_to_masked_pairs():
    for W, layout, alignment, known in ((1, "rank", 4, True), (1, "expert", 1, True), (1, "expert", 4, False),
                                        (2, "rank", 1, False), (2, "expert", 1, False)):
        lay, inputs, _ = _case(W, CHECK_ROUTINGS[0], seed=9, align=alignment)
        mine = inputs[0]
        in_rank = torch.ones((mine.x.shape[0], W), dtype=torch.bool)
        guess = Guess.of(lay, layout, alignment, _worst_case_outputs(lay, layout), mine.topk_idx, mine.topk_weights,
                         in_rank, 1, None)
        assert (guess is not None) == known, (W, layout, alignment)
        if known:
            T, K = mine.topk_idx.shape
            assert guess.rows == (T if layout == "rank" else T * K)
            # Outputs of fewer rows (buffer.recv_capacity below the tokens): no guess, which could
            # only be over capacity
            short = {k: (v[:guess.rows - 1] if k in ("x", "idx", "w") else v)
                     for k, v in _worst_case_outputs(lay, layout).items()}
            assert Guess.of(lay, layout, alignment, short, mine.topk_idx, mine.topk_weights, in_rank, 1, None) is None


@pytest.mark.build
def test_the_wait_leaves_bad_ids_a_receiver_over_capacity_and_failures_to_the_host_s_checks(cuda_module):
    """A guess is filled only where nothing is to be raised: otherwise the wait says the counts
    are in and the host reads them (and raises) as without a guess."""
    lay, inputs, counts = _case(1, CHECK_ROUTINGS[0], seed=10, align=1)
    mine, in_rank = inputs[0], torch.ones((inputs[0].x.shape[0], 1), dtype=torch.bool)
    args = (_worst_case_outputs(lay, "rank"), mine.topk_idx, mine.topk_weights, in_rank, 6)
    guess = Guess.of(lay, "rank", 1, *args, None)
    summary = summary_of(counts, 0, 1, lay.local_experts)
    assert _wait(cuda_module, lay, summary, counts, guess) == cuda_module.COUNTS_FILLED  # the checks below can fail
    assert _wait(cuda_module, lay, summary, counts, guess, stage=1) == cuda_module.COUNTS_READY  # a device wait expired
    assert _wait(cuda_module, lay, summary, counts, guess, deferred=2) == cuda_module.COUNTS_READY  # an earlier error

    tight, _, _ = _case(1, CHECK_ROUTINGS[0], seed=10, align=1, **{"buffer.recv_capacity": 8})
    assert _wait(cuda_module, tight, summary, counts, guess) == cuda_module.COUNTS_READY
    with pytest.raises(CapacityError, match="recv_capacity"):
        summarized_result(tight, summary, counts, 0, "rank", 1, lambda: (0, 0, 0, 0), *args)
    counts[0, 0] = -1  # the routing kernel rejected this rank's ids
    summary = summary_of(counts, 0, 1, lay.local_experts)
    assert _wait(cuda_module, lay, summary, counts, guess) == cuda_module.COUNTS_READY
    with pytest.raises(InputError, match="expert id 99"):
        summarized_result(lay, summary, counts, 0, "rank", 1, lambda: (1, 2, 0, 99), *args)


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("alignment", [1, 4])
def test_the_routing_kernel_s_summary_holds_what_received_rows_reduces(W, alignment):
    """summary_of specifies the words kernels/route.cuh's summarize_counts writes for the host."""
    for n, routing in enumerate(CHECK_ROUTINGS):
        lay, _, counts = _case(W, routing, seed=300 + 10 * W + n)
        for r in range(W):
            s = summary_of(counts, r, alignment, lay.local_experts)
            assert s.dtype.name == "int32" and s.shape == (SUMMARY_HEAD + lay.local_experts,)
            rank_totals, per_expert = received_rows(lay, counts, r, "rank", alignment)
            expert_totals, _ = received_rows(lay, counts, r, "expert", alignment)
            assert s[:5].tolist() == [0, rank_totals[r], rank_totals.max(), expert_totals[r], expert_totals.max()]
            assert s[5:SUMMARY_HEAD].tolist() == [0] * (SUMMARY_HEAD - 5)
            assert s[SUMMARY_HEAD:].tolist() == per_expert.tolist()
    counts[W - 1, 0] = -1  # the last rank's routing kernel rejected its ids
    assert summary_of(counts, 0, alignment, lay.local_experts)[0] == 1


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_a_result_from_the_summary_is_the_result_from_the_matrix(layout):
    lay, inputs, counts = _case(2, CHECK_ROUTINGS[1], seed=11)
    mine, in_rank = inputs[0], torch.ones((inputs[0].x.shape[0], 2), dtype=torch.bool)
    out = _worst_case_outputs(lay, layout)
    args = (out, mine.topk_idx, mine.topk_weights, in_rank, 5)
    recv, handle = summarized_result(lay, summary_of(counts, 0, 4, lay.local_experts), counts, 0, layout, 4,
                                     lambda: pytest.fail("read only for bad ids"), *args)
    want, want_handle = dispatch_result(lay, counts, 0, layout, 4, lambda: (0, 0, 0, 0), *args)
    _same_recv(recv, want)
    assert handle.num_recv_rows == want_handle.num_recv_rows > 0
    assert torch.equal(handle.counts, want_handle.counts) and torch.equal(handle.recv_src_slot, want_handle.recv_src_slot)
    counts[:] = -7  # the mapped memory is rewritten by the next dispatch
    assert torch.equal(handle.counts, want_handle.counts)


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_a_cached_dispatch_reads_its_rows_off_the_handle_as_the_matrix_gives_them(W, layout):
    """An exact dispatch keeps (most rows, its rows, its per-expert counts) in the handle; the
    cached dispatch along it gets what reducing the handle's matrix again gives, and a tensor
    of its own."""
    for n, routing in enumerate(CHECK_ROUTINGS):
        lay, inputs, counts = _case(W, routing, seed=400 + 10 * W + n)
        out = _worst_case_outputs(lay, layout)
        for r in range(W):
            in_rank = torch.ones((inputs[r].x.shape[0], W), dtype=torch.bool)
            made = [summarized_result(lay, summary_of(counts, r, 4, lay.local_experts), counts, r, layout, 4,
                                      lambda: (0, 0, 0, 0), out, inputs[r].topk_idx, inputs[r].topk_weights, in_rank, 0)[1],
                    dispatch_result(lay, counts, r, layout, 4, lambda: (0, 0, 0, 0), out, inputs[r].topk_idx,
                                    inputs[r].topk_weights, in_rank, 0)[1]]
            for handle in made:
                assert handle.recv_counts is not None
                for worst in (0, lay.recv_rows):
                    most, rows, per_expert = cached_rows(lay, handle, r, worst)
                    want = cached_rows(lay, dataclasses.replace(handle, recv_counts=None), r, worst)
                    assert (most, rows, per_expert.tolist()) == (want[0], want[1], want[2].tolist()), (routing, r)
                    assert rows == handle.num_recv_rows
                    per_expert += 1  # the caller's own tensor: the handle's counts stay
                    assert cached_rows(lay, handle, r, worst)[2].tolist() == want[2].tolist()


def test_a_cached_dispatch_below_the_most_rows_raises_naming_the_receiver_on_every_rank():
    from symmoe.workload import Routing
    lay, inputs, counts = _case(2, Routing("one_expert", expert=0), seed=15)
    out = _worst_case_outputs(lay, "rank")
    for r in range(2):
        handle = summarized_result(lay, summary_of(counts, r, 4, lay.local_experts), counts, r, "rank", 4,
                                   lambda: (0, 0, 0, 0), out, inputs[r].topk_idx, inputs[r].topk_weights,
                                   torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 0)[1]
        most = handle.recv_counts[0]
        assert cached_rows(lay, handle, r, most)[0] == most
        with pytest.raises(CapacityError, match=f"num_worst_tokens={most - 1} but rank 0 receives {most} rows"):
            cached_rows(lay, handle, r, most - 1)


def test_a_summary_naming_bad_ids_or_a_receiver_over_capacity_raises_from_the_matrix_on_every_rank():
    from symmoe.workload import Routing
    lay, inputs, counts = _case(2, Routing("uniform"), seed=12)
    out = _worst_case_outputs(lay, "rank")
    counts[1, 0] = -1
    for r in range(2):
        with pytest.raises(InputError, match=r"ranks with bad input: \[1\]"):
            summarized_result(lay, summary_of(counts, r, 4, lay.local_experts), counts, r, "rank", 4,
                              lambda: (1, 2, 0, 99), out, inputs[r].topk_idx, inputs[r].topk_weights,
                              torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 0)
    lay, inputs, counts = _case(2, Routing("one_expert", expert=0), seed=5, **{"buffer.recv_capacity": 20})
    for r in range(2):
        with pytest.raises(CapacityError, match="rank 0 would receive"):
            summarized_result(lay, summary_of(counts, r, 4, lay.local_experts), counts, r, "rank", 4,
                              lambda: (0, 0, 0, 0), out, inputs[r].topk_idx, inputs[r].topk_weights,
                              torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 0)


def test_dispatch_result_raises_for_bad_ids_and_over_capacity_on_every_rank():
    from symmoe.workload import Routing
    lay, inputs, counts = _case(2, Routing("uniform"), seed=8)
    out = _worst_case_outputs(lay, "rank")
    bad = counts.copy()
    bad[0, 0] = -1
    for r in range(2):
        with pytest.raises(InputError, match=r"ranks with bad input: \[0\]"):
            dispatch_result(lay, bad, r, "rank", 4, lambda: (1, 2, 0, 99), out, inputs[r].topk_idx,
                            inputs[r].topk_weights, torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 0)
    lay, inputs, counts = _case(2, Routing("one_expert", expert=0), seed=5, **{"buffer.recv_capacity": 20})
    for r in range(2):
        with pytest.raises(CapacityError, match="recv_capacity"):
            dispatch_result(lay, counts, r, "rank", 4, lambda: (0, 0, 0, 0), out, inputs[r].topk_idx,
                            inputs[r].topk_weights, torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 0)


@pytest.mark.parametrize("layout", ["rank", "expert"])
def test_dispatch_result_with_num_worst_tokens_views_that_many_rows_in_outputs_and_handle(layout):
    """num_worst_tokens=N on a GPU dispatch: N rows of the worst-case outputs, the kernels' rows
    first and the rest filled (x 0, ids -1, weights 0, sources -1); the handle covers the same
    N rows (combine takes N rows and skips sources -1); fewer than some rank receives raises
    on every rank."""
    lay, inputs, counts = _case(2, CHECK_ROUTINGS[0], seed=9)
    ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                             lay.num_experts, layout, 4)
    out = _worst_case_outputs(lay, layout)
    kernel_rows = {k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)}
    kernel_rows["src_token"] = out["block"].piece(SRC_TOKEN, out["x"].shape[0]).clone()
    mine, in_rank = inputs[1], torch.ones((inputs[1].x.shape[0], 2), dtype=torch.bool)
    rows, most = ref.recv[1].x.shape[0], max(r.x.shape[0] for r in ref.recv)
    worst = most + 2
    assert worst <= out["x"].shape[0]
    recv, handle = dispatch_result(lay, counts, 1, layout, 4, lambda: pytest.fail("read only for bad ids"), out,
                                   mine.topk_idx, mine.topk_weights, in_rank, buffer_id=1, worst=worst)
    assert recv.x.shape[0] == recv.topk_idx.shape[0] == recv.src_rank.shape[0] == worst
    assert recv.x.data_ptr() == out["x"].data_ptr()  # a view, no copy
    assert torch.equal(recv.x[:rows], kernel_rows["x"][:rows]) and torch.equal(recv.src_token[:rows], kernel_rows["src_token"][:rows])
    assert bool((recv.x[rows:] == 0).all()) and bool((recv.topk_idx[rows:] == -1).all())
    assert bool((recv.topk_weights[rows:] == 0).all()) and bool((recv.src_rank[rows:] == -1).all())
    assert handle.num_recv_rows == handle.num_worst_tokens == worst
    assert handle.recv_src_rank.shape[0] == handle.recv_src_token.shape[0] == handle.recv_src_slot.shape[0] == worst
    assert handle.recv_src_rank.data_ptr() == out["block"].ptr(SRC_RANK)  # the kernels' rows, no copy
    for src in (handle.recv_src_rank, handle.recv_src_token, handle.recv_src_slot):
        assert bool((src[rows:] == -1).all())
    for r in range(2):
        with pytest.raises(CapacityError, match="num_worst_tokens"):
            dispatch_result(lay, counts, r, layout, 4, lambda: (0, 0, 0, 0), _worst_case_outputs(lay, layout),
                            inputs[r].topk_idx, inputs[r].topk_weights,
                            torch.ones((inputs[r].x.shape[0], 2), dtype=torch.bool), 1, worst=most - 1)


KINDS = {"capacity": 1, "bad_ids": 2}  # the DEFERRED codes of the CUDA modules (csrc/kernels/tail.cuh)


def test_a_deferred_bad_id_names_the_id_on_the_bad_rank_and_the_bad_rank_elsewhere():
    """A num_worst_tokens dispatch on the CUDA protocols does not wait: its tail kernel leaves
    (kind, epoch, rank, rows, worst, expert_major) and a later call raises from it."""
    lay, _, _ = _case(2, CHECK_ROUTINGS[0], seed=12)
    record = (KINDS["bad_ids"], 7, 1, 0, 40, 0)
    own = deferred_error(lay, record, 1, KINDS, lambda: (1, 3, 1, 23))
    other = deferred_error(lay, record, 0, KINDS, lambda: pytest.fail("read only on the bad rank"))
    assert type(own) is InputError and "expert id 23 (token 3)" in str(own)
    assert "rank 1 passed an invalid topk_idx" in str(other)
    for e in (own, other):
        assert "num_worst_tokens=40 (epoch 7)" in str(e) and "moved nothing on any rank" in str(e)


def test_a_deferred_overflow_names_the_receiver_and_the_limit_it_passed():
    lay, _, _ = _case(2, CHECK_ROUTINGS[0], seed=13, **{"buffer.recv_capacity": 20})
    over_worst = deferred_error(lay, (KINDS["capacity"], 3, 1, 19, 18, 0), 0, KINDS, lambda: (0, 0, 0, 0))
    over_pool = deferred_error(lay, (KINDS["capacity"], 4, 0, 25, 30, 1), 1, KINDS, lambda: (0, 0, 0, 0))
    assert isinstance(over_worst, CapacityError) and "num_worst_tokens=18 but rank 1 receives 19 rows" in str(over_worst)
    assert isinstance(over_pool, CapacityError) and "rank 0 would receive 25 rows (expert-major)" in str(over_pool)
    assert "recv_capacity" in str(over_pool)


def test_a_record_without_an_error_kind_is_a_bug_not_an_error_to_raise():
    lay, _, _ = _case(2, CHECK_ROUTINGS[0], seed=14)
    with pytest.raises(AssertionError, match="names no error"):
        deferred_error(lay, (9, 1, 0, 0, 8, 0), 0, KINDS, lambda: (0, 0, 0, 0))


def test_an_extension_built_with_another_summary_layout_is_refused_by_name():
    check_summary_head("symmoe_cuda", SUMMARY_HEAD)
    with pytest.raises(RuntimeError, match=f"symmoe_nccl: summary head {SUMMARY_HEAD + 1} words, counts.py reads "
                                           f"{SUMMARY_HEAD}: rebuild"):
        check_summary_head("symmoe_nccl", SUMMARY_HEAD + 1)
