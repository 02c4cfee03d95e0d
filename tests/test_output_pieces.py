"""A GPU dispatch's small int32 state comes from one allocation (protocol.outputs.Int32Block), and its
outputs are made and cut in one call each of the C++ host module (csrc/host/tensors.cpp)."""
from __future__ import annotations

import pytest
import torch

from symmoe.layout import BufferLayout
from symmoe.protocol.outputs import SRC_RANK, SRC_SLOT, SRC_TOKEN, Int32Block, cut, dispatch_outputs


def test_pieces_have_their_sizes_start_128_byte_aligned_and_never_overlap():
    sizes = (5, 32, 1, 70, 33)
    block = Int32Block(torch.device("cpu"), sizes)
    pieces = [block.piece(i, n) for i, n in enumerate(sizes)]
    assert [p.numel() for p in pieces] == list(sizes)
    assert all(p.dtype == torch.int32 and p.is_contiguous() for p in pieces)
    base = pieces[0].data_ptr()
    starts = [p.data_ptr() - base for p in pieces]
    assert all(s % 128 == 0 for s in starts)
    for a, b, n in zip(starts, starts[1:], sizes):
        assert b >= a + 4 * n
    for i, p in enumerate(pieces):  # writing one piece leaves the others as they were
        p.fill_(i + 1)
    assert [p.unique().tolist() for p in pieces] == [[i + 1] for i in range(len(sizes))]


def test_a_piece_viewed_as_float32_or_reshaped_is_the_same_memory():
    block = Int32Block(torch.device("cpu"), (8, 2 * 259))
    w, counts = block.piece(0, 8), block.piece(1, 2 * 259)
    assert w.view(torch.float32).data_ptr() == w.data_ptr()
    assert counts.view(2, 259).shape == (2, 259)


def test_a_blocks_pointers_are_its_pieces_addresses_and_pieces_are_views_of_one_allocation():
    sizes = (3, 40, 7)
    block = Int32Block(torch.device("cpu"), sizes)
    for i, n in enumerate(sizes):
        piece = block.piece(i, n)
        assert piece.data_ptr() == block.ptr(i) and piece.numel() == n
        assert piece.untyped_storage().data_ptr() == block.base.untyped_storage().data_ptr()
    assert block.piece(1, 5).data_ptr() == block.ptr(1)  # a shorter piece starts at the same place


# -- a dispatch's outputs, made and cut by the C++ host module (csrc/host/tensors.cpp) ----------

CPU = torch.device("cpu")
LAY = BufferLayout(2, 64, 256, 8, 32, 2)  # W, max tokens, hidden, top-k, experts, combine slots


def test_rank_major_outputs_have_the_shapes_dtypes_and_block_the_kernels_fill():
    out = dispatch_outputs(LAY, 40, "rank", torch.bfloat16, CPU, 11, 7, in_rank_tokens=5)
    assert (out["x"].shape, out["x"].dtype) == ((40, 256), torch.bfloat16)
    assert (out["idx"].shape, out["idx"].dtype) == ((40, 8), torch.int64)
    assert (out["w"].shape, out["w"].dtype) == ((40, 8), torch.float32)
    assert out["expert_offsets"] is None
    assert (out["in_rank"].shape, out["in_rank"].dtype) == ((5, 2), torch.bool)
    block = out["block"]
    assert block.base.dtype == torch.int32 and block.base.numel() == Int32Block.plan((40, 40, 40, 11, 7))[1]
    assert [block.piece(i, n).numel() for i, n in enumerate((40, 40, 40, 11, 7))] == [40, 40, 40, 11, 7]


def test_expert_major_outputs_have_flat_ids_and_group_starts_and_narrow_rows_where_asked():
    out = dispatch_outputs(LAY, 24, "expert", torch.uint8, CPU, cols=144)
    assert (out["x"].shape, out["x"].dtype) == ((24, 144), torch.uint8)
    assert out["idx"].shape == (24,) and out["w"].shape == (24,)
    L = LAY.local_experts
    assert (out["expert_offsets"].shape, out["expert_offsets"].dtype) == ((L + 1,), torch.int64)
    assert out["in_rank"] is None  # not asked


def test_cut_gives_the_first_rows_of_each_output_as_views_of_the_same_memory():
    out = dispatch_outputs(LAY, 40, "rank", torch.float32, CPU, 3)
    g = torch.Generator().manual_seed(5)
    out["x"].copy_(torch.randn(40, 256, generator=g))
    out["idx"].copy_(torch.randint(-1, 32, (40, 8), generator=g))
    out["w"].copy_(torch.rand(40, 8, generator=g))
    block = out["block"]
    for piece in (SRC_RANK, SRC_TOKEN, SRC_SLOT):
        block.piece(piece, 40).copy_(torch.randint(-1, 64, (40,), generator=g, dtype=torch.int32))
    x, idx, w, src_rank, src_token, src_slot = cut(out, 17)
    assert torch.equal(x, out["x"][:17]) and torch.equal(idx, out["idx"][:17]) and torch.equal(w, out["w"][:17])
    for got, piece in ((src_rank, SRC_RANK), (src_token, SRC_TOKEN), (src_slot, SRC_SLOT)):
        assert torch.equal(got, block.piece(piece, 17)) and got.data_ptr() == block.ptr(piece)
    assert x.data_ptr() == out["x"].data_ptr()
    assert cut(out, 40)[0] is out["x"]  # every row: the output itself
    assert cut(out, 0)[0].shape == (0, 256)


def test_cut_refuses_more_rows_than_the_outputs_hold():
    out = dispatch_outputs(LAY, 8, "rank", torch.float32, CPU)
    with pytest.raises(ValueError, match="cut: 9 rows of outputs of 8 rows"):
        cut(out, 9)
