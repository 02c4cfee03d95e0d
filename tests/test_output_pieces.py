"""A GPU dispatch's small int32 state comes from one allocation (protocol.outputs.Int32Block)."""
from __future__ import annotations

import torch

from symmoe.protocol.outputs import Int32Block


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
