"""What every rank reads off the exchanged counts matrix after the one host wait of a
dispatch (CUDA and NVSHMEM protocols alike), and the results it builds from it.

``counts[s] = (tokens of s, tokens s sends each rank, pairs s sends each expert)``; a rank
whose routing kernel rejected its expert ids publishes tokens = -1 and no kernel moves data.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import validate
from ..errors import CapacityError, InputError
from ..handle import DispatchHandle
from ..layout import BufferLayout
from ..results import RecvResult, fill_tail
from .outputs import SRC_SLOT, cut


def received_rows(lay: BufferLayout, counts: np.ndarray, rank: int, output_layout: str,
                  alignment: int, worst: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(rows each receiver gets, unpadded rows per local expert of ``rank``). Raises
    CapacityError on every rank when any receiver is over capacity, or over ``worst`` rows
    (num_worst_tokens; 0: exact outputs). Few numpy calls on purpose: a dispatch runs this
    after its host wait, while only the data kernel is left to hide it."""
    W, L = lay.world_size, lay.local_experts
    pairs = counts[:, 1 + W:]  # [src, dst * L]
    if output_layout == "rank":
        totals = counts[:, 1:1 + W].sum(0)  # int32 sums to int64
        per_expert = pairs[:, rank * L:(rank + 1) * L].sum(0)
    else:
        per_dst = pairs.sum(0).reshape(W, L)  # [dst, L]
        padded = per_dst if alignment == 1 else (per_dst + alignment - 1) // alignment * alignment
        totals, per_expert = padded.sum(1), per_dst[rank]
    lay.check_capacity(totals.tolist(), output_layout, worst)
    return totals, per_expert.astype(np.int32)


SUMMARY_HEAD = 8  # kernels/route.cuh's kSummaryHead: the words before the per-expert counts


def check_summary_head(module: str, head: int) -> None:
    """Raise when an extension's summary layout (its SUMMARY_HEAD) is not the one read here: a
    stale build would hand the host other words than ``summarized_result`` reads."""
    if head != SUMMARY_HEAD:
        raise RuntimeError(f"{module}: summary head {head} words, counts.py reads {SUMMARY_HEAD}: "
                           "rebuild the extension (symmoe build)")


def summary_of(counts: np.ndarray, rank: int, alignment: int, local_experts: int) -> np.ndarray:
    """What the CUDA protocols' routing kernel leaves for the host beside the counts matrix
    (kernels/route.cuh's CountsSummary), from the matrix: [0] 1 when some rank's ids were bad,
    [1] / [2] this rank's rows and the most any receiver gets, rank-major, [3] / [4] the same
    expert-major (groups padded to ``alignment``), zeros up to SUMMARY_HEAD, then this rank's
    unpadded rows per local expert. int32."""
    W, L = counts.shape[0], local_experts
    rank_rows = counts[:, 1:1 + W].sum(0)
    per_dst = counts[:, 1 + W:].sum(0).reshape(W, L)
    expert_rows = ((per_dst + alignment - 1) // alignment * alignment).sum(1)
    head = [int((counts[:, 0] < 0).any()), rank_rows[rank], rank_rows.max(), expert_rows[rank], expert_rows.max()]
    return np.array(head + [0] * (SUMMARY_HEAD - len(head)) + per_dst[rank].tolist(), dtype=np.int32)


class Guess:
    """An exact-size dispatch's result built before its counts wait, for the rows it is likely
    to receive. At world size 1 those rows are known up to masked pairs (rank-major: the
    tokens; expert-major with alignment 1: the pairs), and the host's work after the wait, not
    the kernel, bounded the call: 21-58 µs of views and handle on a GPU machine's host (GPU
    idle) against the ~21 µs the kernel has left once its counts are out.
    The wait itself (host_wait.h's CountsWait, given ``target``) checks the summary and, where
    the received rows are the guessed ones, copies the counts and the per-expert counts into
    this result's tensors. Where the guess is wrong (masked pairs) it cost only host time
    before the wait."""

    def __init__(self, lay: BufferLayout, rows: int, output_layout: str, alignment: int,
                 out: dict[str, Any], topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 in_rank: torch.Tensor, buffer_id: int, cache: Any):
        self.rows = rows
        counts = torch.empty((lay.world_size, 1 + lay.world_size + lay.num_experts), dtype=torch.int32)
        per_expert = torch.empty(lay.local_experts, dtype=torch.int32)  # both filled by the wait
        self.recv = recv_views(out, rows, per_expert)
        self.handle = make_handle(output_layout, topk_idx, topk_weights, in_rank, counts, out, self.recv, buffer_id,
                                  alignment, cache, 0, (rows, rows, per_expert))
        # CountsWait.wait's (rows, expert_major, counts_dst, per_expert_dst)
        self.target = (rows, output_layout == "expert", counts.data_ptr(), per_expert.data_ptr())

    @staticmethod
    def of(lay: BufferLayout, output_layout: str, alignment: int, out: dict[str, Any],
           topk_idx: torch.Tensor, topk_weights: torch.Tensor, in_rank: torch.Tensor, buffer_id: int,
           cache: Any) -> "Guess | None":
        """The guess where the rows are known up to masked pairs (world size 1) and fit the
        outputs, else None (more rows than the outputs hold would be over capacity: no result)."""
        if lay.world_size != 1 or (output_layout == "expert" and alignment != 1):
            return None
        rows = topk_idx.shape[0] * (topk_idx.shape[1] if output_layout == "expert" else 1)
        if rows > out["x"].shape[0]:
            return None
        return Guess(lay, rows, output_layout, alignment, out, topk_idx, topk_weights, in_rank, buffer_id, cache)


NO_GUESS = (0, False, 0, 0)  # CountsWait.wait's target without a guess: it only waits


def summarized_result(lay: BufferLayout, summary: np.ndarray, counts: np.ndarray, rank: int, output_layout: str,
                      alignment: int, bad_info: Callable[[], Sequence[int]], out: dict[str, Any],
                      topk_idx: torch.Tensor, topk_weights: torch.Tensor, in_rank: torch.Tensor, buffer_id: int,
                      cache: Any = None) -> tuple[RecvResult, DispatchHandle]:
    """``dispatch_result`` (exact outputs) from the routing kernel's ``summary`` (``summary_of``):
    five words and this rank's per-expert counts instead of reducing the matrix on the host,
    which is left to do only when something must be raised (bad ids, a receiver over
    capacity). The host does this after its wait, while only the data kernel hides it,
    unless the wait filled a ``Guess``."""
    bad, rank_rows, rank_most, expert_rows, expert_most = summary[:5].tolist()
    rows, most = (rank_rows, rank_most) if output_layout == "rank" else (expert_rows, expert_most)
    if bad or not lay.fits(most):  # the matrix names the bad rank or the receiver over
        return dispatch_result(lay, counts, rank, output_layout, alignment, bad_info, out, topk_idx, topk_weights,
                               in_rank, buffer_id, cache)
    per_expert = torch.from_numpy(summary[SUMMARY_HEAD:SUMMARY_HEAD + lay.local_experts].copy())
    recv = recv_views(out, rows, per_expert)
    return recv, make_handle(output_layout, topk_idx, topk_weights, in_rank, torch.from_numpy(counts.copy()), out,
                             recv, buffer_id, alignment, cache, 0, (most, rows, per_expert))


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


def dispatch_result(lay: BufferLayout, counts: np.ndarray, rank: int, output_layout: str, alignment: int,
                    bad_info: Callable[[], Sequence[int]], out: dict[str, Any], topk_idx: torch.Tensor,
                    topk_weights: torch.Tensor, in_rank: torch.Tensor,
                    buffer_id: int, cache: Any = None, worst: int = 0) -> tuple[RecvResult, DispatchHandle]:
    """The end of a GPU dispatch, after its one host wait: the matrix read once, the errors
    every rank raises together, and views of this rank's ``rows`` rows of the worst-case
    outputs ``out`` (x, idx, w, src_rank, src_token, src_slot, expert_offsets), or of
    ``worst`` rows (``num_worst_tokens``; ``out`` has that many); ``cache`` goes into the
    handle for cached dispatch."""
    counts = counts.copy()  # the mapped memory changes with the next dispatch
    if counts[:, 0].min() < 0:
        raise bad_input_error(lay, counts, rank, bad_info())
    totals, per_expert = received_rows(lay, counts, rank, output_layout, alignment, worst)
    rows, per_expert = int(totals[rank]), torch.from_numpy(per_expert)
    recv = recv_views(out, rows, per_expert, worst)
    return recv, make_handle(output_layout, topk_idx, topk_weights, in_rank, torch.from_numpy(counts), out, recv,
                             buffer_id, alignment, cache, worst, (int(totals.max()), rows, per_expert))


def make_handle(output_layout: str, topk_idx: torch.Tensor, topk_weights: torch.Tensor, in_rank: torch.Tensor,
                counts: torch.Tensor, out: dict[str, Any], recv: RecvResult, buffer_id: int,
                alignment: int, cache: Any, worst: int,
                recv_counts: "tuple[int, int, torch.Tensor] | None" = None) -> DispatchHandle:
    """A GPU dispatch's handle over the rows of ``recv`` (views of its outputs ``out``; all
    ``worst`` of them with num_worst_tokens, whose sources past the received rows are -1):
    recv's own source views, and the slot column from ``out``; ``recv_counts`` as
    ``DispatchHandle.recv_counts`` (where the host read the counts)."""
    rows = recv.src_rank.shape[0]
    slot = out.get("src_slot")  # recv_views cut it with the others
    if slot is None or slot.shape[0] != rows:
        slot = out["block"].piece(SRC_SLOT, rows)
    return DispatchHandle(
        output_layout=output_layout, num_tokens=topk_idx.shape[0], topk_idx=topk_idx.long(),
        topk_weights=topk_weights, is_token_in_rank=in_rank, counts=counts, num_recv_rows=rows,
        recv_src_rank=recv.src_rank, recv_src_token=recv.src_token, recv_src_slot=slot,
        expert_offsets=out["expert_offsets"], buffer_id=buffer_id, alignment=alignment, cache=cache,
        num_worst_tokens=worst, recv_counts=recv_counts)


def recv_views(out: dict[str, Any], rows: int, per_expert: torch.Tensor, worst: int = 0) -> RecvResult:
    """The first ``rows`` rows of the data kernels' outputs (``outputs.dispatch_outputs``), or
    ``worst`` rows when that is more (the rows past ``rows`` filled as ``results.pad_recv``
    defines, on the stream); ``per_expert`` a host tensor (reading it costs no sync)."""
    n = max(rows, worst)
    x, idx, w, src_rank, src_token, out["src_slot"] = cut(out, n)  # the slot column: the handle's (make_handle)
    recv = RecvResult(x=x, topk_idx=idx, topk_weights=w, num_recv_tokens_per_expert=per_expert, src_rank=src_rank,
                      src_token=src_token, expert_offsets=out["expert_offsets"])
    if n > rows:
        fill_tail(recv, rows)
        out["src_slot"][rows:].fill_(-1)  # the handle's third source column
    return recv


def cached_rows(lay: BufferLayout, handle: DispatchHandle, rank: int,
                worst: int = 0) -> tuple[int, int, torch.Tensor]:
    """(the most rows any rank received, the rows ``rank`` received, its
    num_recv_tokens_per_expert) in the dispatch that made ``handle``, from its counts: host
    arithmetic, as a cached dispatch never waits for the device. Raises on every rank when
    ``worst`` (num_worst_tokens) is less than some rank's rows. Read off ``handle.recv_counts``
    where the dispatch kept them (the matrix is reduced again only to name who is over)."""
    if handle.recv_counts is not None:
        most, rows, per_expert = handle.recv_counts
        if lay.fits(most, worst):
            return most, rows, per_expert.clone()  # the caller's own: results do not share it
    totals, per_expert = received_rows(lay, handle.counts.numpy(), rank, handle.output_layout, handle.alignment,
                                       worst)
    return int(totals.max()), int(totals[rank]), torch.from_numpy(per_expert)


def deferred_error(lay: BufferLayout, record: Sequence[int], rank: int, kinds: dict[str, int],
                   bad_info: Callable[[], Sequence[int]]) -> InputError:
    """The error a dispatch that did not wait on the host (num_worst_tokens on the CUDA
    protocols) left for a later call: ``record`` is the device's DeferredError (kind, epoch,
    rank, rows, worst, expert_major; ``kinds`` the kind codes). Every rank's tail kernel
    derived it from the same matrix, so every rank raises it."""
    kind, epoch, who, rows, worst, expert_major = (int(v) for v in record[:6])
    when = f"an earlier dispatch with num_worst_tokens={worst} (epoch {epoch}), whose outputs are not valid"
    if kind == kinds["bad_ids"]:
        marks = np.zeros((lay.world_size, 1), dtype=np.int64)
        marks[who, 0] = -1  # the first rank whose ids were rejected
        info = bad_info() if rank == who else (0, 0, 0, 0)  # this rank's own record, read only if it is the bad one
        return InputError(f"{when}: {bad_input_error(lay, marks, rank, info)}")
    if kind == kinds["capacity"]:
        totals = [0] * lay.world_size
        totals[who] = rows
        try:
            lay.check_capacity(totals, "expert" if expert_major else "rank", worst)
        except CapacityError as e:
            return CapacityError(f"{when}: {e}")
    raise AssertionError(f"deferred error record {list(record)} names no error")
