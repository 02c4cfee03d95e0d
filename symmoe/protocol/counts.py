"""What every rank reads off the exchanged counts matrix after the one host wait of a
dispatch (CUDA and NVSHMEM protocols alike).

``counts[s] = (tokens of s, tokens s sends each rank, pairs s sends each expert)``; a rank
whose routing kernel rejected its expert ids publishes tokens = -1 and no kernel moves data.
"""
from __future__ import annotations

import numpy as np

from .. import validate
from ..errors import InputError
from ..layout import BufferLayout


def received_rows(lay: BufferLayout, counts: np.ndarray, rank: int, output_layout: str,
                  alignment: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows each receiver gets, unpadded rows per local expert of ``rank``). Raises
    CapacityError on every rank when any receiver is over capacity."""
    W, L = lay.world_size, lay.local_experts
    per_expert = counts[:, 1 + W:].astype(np.int64).reshape(W, W, L).sum(0)  # [dst, L]
    if output_layout == "rank":
        totals = counts[:, 1:1 + W].astype(np.int64).sum(0)
    else:
        totals = ((per_expert + alignment - 1) // alignment * alignment).sum(1)
    lay.check_capacity(totals.tolist(), output_layout)
    return totals, per_expert[rank].astype(np.int32)


def bad_input_error(lay: BufferLayout, counts: np.ndarray, rank: int, info: "tuple[int, int, int, int]") -> InputError:
    """The error every rank raises when some rank's routing kernel found a bad expert id;
    ``info`` is (kind, token, slot, value) of this rank's first bad pair (kind 1: out of
    range, 2: duplicate), read only when this rank is one of the bad ones."""
    bad = [int(r) for r in np.nonzero(counts[:, 0] < 0)[0]]
    if rank in bad:
        kind, token, _slot, value = (int(v) for v in info)
        msg = (validate.bad_expert_id(value, token, lay.num_experts) if kind == 1
               else validate.duplicate_expert(value, token))
    else:
        msg = f"rank {bad[0]} passed an invalid topk_idx (see its error)"
    return InputError(f"{msg}; this dispatch moved nothing on any rank (ranks with bad input: {bad})")
