"""What dispatch hands to combine."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DispatchHandle:
    """Everything combine needs to send rows back to where dispatch took them from.

    Source side (this rank as a sender): ``topk_idx``/``topk_weights``/``is_token_in_rank``
    of the tokens it dispatched. Receiver side (this rank as a receiver): for each row it
    received, the source rank, the source token and the combine slot on the source
    (the destination rank for rank-major, the top-k position for expert-major).

    ``dispatch(x, handle=...)`` (a cached dispatch: the backward of combine, or a second
    tensor on the same routing) moves new rows along this routing without routing again;
    ``cache`` holds what the protocol kept on the device for it.
    """

    output_layout: str  # "rank" | "expert"
    num_tokens: int  # tokens this rank dispatched
    topk_idx: torch.Tensor  # [T, K] int64, as given to dispatch
    topk_weights: torch.Tensor  # [T, K] float32, as given to dispatch
    is_token_in_rank: torch.Tensor  # [T, W] bool
    counts: torch.Tensor  # [W, 1 + W + E] int32, the matrix every rank published (host copy)
    num_recv_rows: int  # rows received (padded rows included, expert-major); num_worst_tokens when set
    recv_src_rank: torch.Tensor  # [rows] int32, -1 on padding
    recv_src_token: torch.Tensor  # [rows] int32, -1 on padding
    recv_src_slot: torch.Tensor  # [rows] int32, -1 on padding
    expert_offsets: torch.Tensor | None  # [L + 1] int64 padded group starts (expert-major)
    buffer_id: int  # id() of the Buffer that made it: a handle is only valid there
    alignment: int = 1  # expert_alignment of the dispatch (expert-major group padding)
    cache: Any = None  # protocol-private device state of the routing, for cached dispatch
    # num_worst_tokens of the dispatch (0: exact outputs). Set: the handle covers that many rows,
    # sources -1 past the received ones, and combine takes that many rows.
    num_worst_tokens: int = 0
    # (the most rows any rank received, this rank's rows, its unpadded rows per local expert) as
    # the dispatch read them off its counts on the host (None where it did not wait for them):
    # a cached dispatch along this handle then reduces nothing on the host. The tensor is the
    # protocol's RecvResult's own (Buffer hands users a list); cached dispatches get clones.
    recv_counts: "tuple[int, int, torch.Tensor] | None" = None

    @property
    def num_recv_tokens(self) -> int:
        return self.num_recv_rows
