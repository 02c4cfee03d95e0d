"""A GPU dispatch's small int32 tensors come from one allocation (protocol.base.int32_pieces)."""
from __future__ import annotations

import torch

from symmoe.protocol.base import int32_pieces


def test_pieces_have_their_sizes_start_128_byte_aligned_and_never_overlap():
    sizes = (5, 32, 1, 70, 33)
    pieces = int32_pieces(torch.device("cpu"), sizes)
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
    w, counts = int32_pieces(torch.device("cpu"), (8, 2 * 259))
    assert w.view(torch.float32).data_ptr() == w.data_ptr()
    assert counts.view(2, 259).shape == (2, 259)
