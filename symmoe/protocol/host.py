"""push and pull in plain torch over the host backend's shared memory.

This is the same flow the CUDA kernels run, step for step, so the offsets and the
signalling are exercised on machines without a GPU:

dispatch
  1. each rank stores its counts row (T, tokens per rank, pairs per expert) into row
     ``rank`` of every peer's ``counts`` matrix; pull also publishes x/topk in ``input``
  2. barrier "dispatch.counts" -- now every rank holds the whole matrix, so every rank
     can check every receiver's capacity and all raise together if one overflows
  3. push: senders store rows, per-slot metadata and ``recv_src`` into the receivers' ``recv``
     pools at offsets that are prefix sums of the matrix, one row per (token, destination
     rank) in both layouts; barrier "dispatch.data"; receivers copy their pool into the
     outputs (expert-major: once per slot, to the output row the slot carries)
     pull: receivers read each source's published ``topk_idx`` and copy the rows meant
     for them; barrier "dispatch.done" (sources may then overwrite ``input``)
combine
  4. receivers store each row into its source's ``combine`` region at slot
     ``recv_src = t * S + slot``; barrier "combine.data"
  5. sources reduce their slots in fixed order in fp32; barrier "combine.done"
"""
from __future__ import annotations

import torch

from ..handle import DispatchHandle
from ..results import DispatchLayout, RecvResult, get_dispatch_layout, pad_recv
from .base import Protocol


class _HostProtocol(Protocol):
    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        return get_dispatch_layout(topk_idx, self.layout.num_experts, self.layout.world_size)

    # -- shared steps ----------------------------------------------------------------------
    def _region(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], rank: int | None = None) -> torch.Tensor:
        return self.mem.view(self.layout.offsets()[name], dtype, shape, rank)

    def _barrier(self, stage: str) -> None:
        self.mem.barrier(stage, flags_offset=self.layout.offsets()["barrier"])

    def _exchange_counts(self, topk_idx: torch.Tensor, routing: DispatchLayout) -> torch.Tensor:
        lay, me = self.layout, self.mem.rank
        W, E = lay.world_size, lay.num_experts
        row = torch.cat([torch.tensor([topk_idx.shape[0]], dtype=torch.int32),
                         routing.num_tokens_per_rank.to(torch.int32),
                         routing.num_tokens_per_expert.to(torch.int32)])
        for p in range(W):
            self._region("counts", torch.int32, (W, 1 + W + E), rank=p)[me] = row
        return row

    def _read_counts(self) -> torch.Tensor:
        lay = self.layout
        return self._region("counts", torch.int32, (lay.world_size, 1 + lay.world_size + lay.num_experts)).clone()

    def _plan(self, counts: torch.Tensor, output_layout: str, alignment: int, worst: int = 0) -> dict:
        """Row offsets every rank derives identically from the counts matrix; raises on every
        rank when a receiver is over capacity or over ``worst`` (num_worst_tokens) rows."""
        lay = self.layout
        W, L = lay.world_size, lay.local_experts
        per_rank = counts[:, 1:1 + W].long()  # [src, dst]
        # The pool is rank-major in both layouts: src's first row at dst.
        plan = {"pool_start": per_rank.cumsum(0) - per_rank, "pool_rows": per_rank.sum(0)}
        if output_layout == "rank":
            plan["totals"] = plan["pool_rows"]
        else:
            per_expert = counts[:, 1 + W:].long().view(W, W, L)  # [src, dst, local expert]
            group = per_expert.sum(0)  # [dst, L]
            padded = (group + alignment - 1) // alignment * alignment
            group_start = padded.cumsum(1) - padded  # [dst, L]
            start = group_start.unsqueeze(0) + (per_expert.cumsum(0) - per_expert)  # [src, dst, L]
            plan.update(totals=padded.sum(1), start=start, group=group, group_start=group_start)
        lay.check_capacity(plan["totals"].tolist(), output_layout, worst)
        return plan

    def _slot_rows(self, local: torch.Tensor, mine: torch.Tensor, start: torch.Tensor, dst: int) -> torch.Tensor:
        """Expert-major output row at ``dst`` of each slot in ``mine`` (-1 elsewhere): its
        expert's ``start`` plus the pairs of that expert in earlier tokens of this source."""
        L = self.layout.local_experts
        ti, k = mine.nonzero(as_tuple=True)  # token order, then slot
        j = local[ti, k] - dst * L
        order = torch.argsort(j * local.shape[0] + ti, stable=True)  # by expert, then token
        per_j = torch.bincount(j, minlength=L)
        pos = torch.empty_like(ti)
        pos[order] = torch.arange(ti.numel()) - (per_j.cumsum(0) - per_j)[j[order]]
        rows = torch.full(local.shape, -1, dtype=torch.long)
        rows[ti, k] = start[j] + pos
        return rows

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, output_layout, alignment, worst=0, split=None):
        lay, me = self.layout, self.mem.rank
        routing = self.get_dispatch_layout(topk_idx)
        self._exchange_counts(topk_idx, routing)
        if self.name == "pull":
            self._publish(x, topk_idx, topk_weights)
        self._barrier("dispatch.counts")
        counts = self._read_counts()
        plan = self._plan(counts, output_layout, alignment, worst)
        if self.name == "push":
            for dst in range(lay.world_size):
                self._move(x, topk_idx, topk_weights, src=me, dst=dst, plan=plan, output_layout=output_layout,
                           target=dst)
            self._barrier("dispatch.data")
        else:
            T_of = counts[:, 0].tolist()
            for src in range(lay.world_size):
                T = T_of[src]
                K = lay.topk
                sx = self._region("in_x", x.dtype, (T, x.shape[1]), rank=src)
                si = self._region("in_idx", torch.int32, (T, K), rank=src)
                sw = self._region("in_w", torch.float32, (T, K), rank=src)
                self._move(sx, si, sw, src=src, dst=me, plan=plan, output_layout=output_layout, target=me)
            self._barrier("dispatch.done")
        recv, handle = self._collect(x.dtype, x.shape[1], routing, counts, plan, topk_idx, topk_weights, output_layout, alignment,
                                     worst)
        return pad_recv(recv, worst), handle

    def _publish(self, x, topk_idx, topk_weights) -> None:
        T, K = topk_idx.shape
        if not self._in_input_region(x):
            self.input_view(T, x.dtype, x.shape[1]).copy_(x)
        self._region("in_idx", torch.int32, (T, K)).copy_(topk_idx)
        self._region("in_w", torch.float32, (T, K)).copy_(topk_weights)

    def _move(self, x, topk_idx, topk_weights, *, src, dst, plan, output_layout, target) -> None:
        """Copy source ``src``'s rows for ``dst`` into ``dst``'s pool, one per token that has a
        slot there, by token; ``target`` is the rank whose memory this rank writes (``dst``
        for push; itself for pull). Per slot the row carries the local expert id (rank-major)
        or the slot's output row (expert-major), and the weight; -1 / 0 for other ranks' slots."""
        lay = self.layout
        R, K, L, S = lay.pool_rows, lay.topk, lay.local_experts, lay.combine_slots
        idx = topk_idx.long()
        tokens = ((idx >= 0) & (idx // L == dst)).any(1).nonzero().flatten()
        n = tokens.numel()
        if n == 0:
            return
        base = int(plan["pool_start"][src, dst])
        local = idx[tokens]
        mine = (local >= 0) & (local // L == dst)
        if output_layout == "rank":
            meta = local - dst * L
        else:
            meta = self._slot_rows(local, mine, plan["start"][src, dst], dst)
        ri = self._region("recv_idx", torch.int32, (R, K), rank=target)
        ri[base:base + n] = torch.where(mine, meta, -1).to(torch.int32)
        self._region("recv_w", torch.float32, (R, K), rank=target)[base:base + n] = torch.where(
            mine, topk_weights[tokens].float(), 0.0)
        self._region("recv_src", torch.int32, (R,), rank=target)[base:base + n] = (tokens * S + dst).to(torch.int32)
        self._region("recv_x", x.dtype, (R, x.shape[1]), rank=target)[base:base + n] = x[tokens]

    def _collect(self, dtype, cols, routing, counts, plan, topk_idx, topk_weights, output_layout, alignment, worst):
        """Copy this rank's pool (rows of ``cols`` elements of ``dtype``, as x's: an FP8
        dispatch's byte rows are narrower) into fresh output tensors (the pool is reused next
        call); expert-major, each pool row once per slot, to the row the slot carries. The
        handle covers ``worst`` rows when that is more (sources -1 past the received rows)."""
        lay, me = self.layout, self.mem.rank
        W, K, L, S = lay.world_size, lay.topk, lay.local_experts, lay.combine_slots
        rows, pool = int(plan["totals"][me]), int(plan["pool_rows"][me])
        rx = self._region("recv_x", dtype, (lay.pool_rows, cols))[:pool]
        ri = self._region("recv_idx", torch.int32, (lay.pool_rows, K))[:pool].long()
        rw = self._region("recv_w", torch.float32, (lay.pool_rows, K))[:pool]
        rs = self._region("recv_src", torch.int32, (lay.pool_rows,))[:pool].long()
        pool_rank = torch.repeat_interleave(torch.arange(W, dtype=torch.int32), counts[:, 1 + me].long())
        if output_layout == "rank":
            out_x, out_idx, out_w = rx.clone(), ri, rw.clone()
            src_rank, src_token, src_slot = pool_rank, (rs // S).to(torch.int32), (rs % S).to(torch.int32)
            per_expert = torch.bincount(out_idx[out_idx >= 0], minlength=L).to(torch.int32)
            offsets = None
        else:
            group, gstart = plan["group"][me], plan["group_start"][me]
            prow, k = (ri >= 0).nonzero(as_tuple=True)
            dest = ri[prow, k]
            out_x = torch.zeros((rows, cols), dtype=dtype)
            out_x[dest] = rx[prow]
            out_idx = torch.full((rows,), -1, dtype=torch.long)
            out_idx[dest] = torch.searchsorted(gstart, dest, right=True) - 1
            out_w = torch.zeros(rows, dtype=torch.float32)
            out_w[dest] = rw[prow, k]
            src_rank, src_token, src_slot = (torch.full((rows,), -1, dtype=torch.int32) for _ in range(3))
            src_rank[dest] = pool_rank[prow]
            src_token[dest] = (rs[prow] // S).to(torch.int32)
            src_slot[dest] = k.to(torch.int32)
            per_expert = group.to(torch.int32)
            offsets = torch.cat([gstart, gstart.new_tensor([rows])]).long()
        recv = RecvResult(out_x, out_idx, out_w, per_expert, src_rank, src_token, offsets)
        n = max(rows, worst)
        src = [torch.cat([t, t.new_full((n - rows,), -1)]) for t in (src_rank, src_token, src_slot)]
        handle = DispatchHandle(
            output_layout=output_layout, num_tokens=topk_idx.shape[0], topk_idx=topk_idx.long(),
            topk_weights=topk_weights.float(), is_token_in_rank=routing.is_token_in_rank, counts=counts,
            num_recv_rows=n, recv_src_rank=src[0], recv_src_token=src[1], recv_src_slot=src[2],
            expert_offsets=offsets, buffer_id=self.buffer_id, alignment=alignment, num_worst_tokens=worst)
        return recv, handle

    # -- combine ---------------------------------------------------------------------------
    def combine(self, y, handle, recv_topk_weights):
        lay = self.layout
        W, T, H, K, S = lay.world_size, lay.max_tokens, lay.hidden, lay.topk, lay.combine_slots
        valid = handle.recv_src_rank >= 0
        slot_of = (handle.recv_src_token.long() * S + handle.recv_src_slot.long())
        for src in range(W):
            rows = (valid & (handle.recv_src_rank == src)).nonzero().flatten()
            if rows.numel() == 0:
                continue
            cx = self._region("combine_x", y.dtype, (T * S, H), rank=src)
            cx[slot_of[rows]] = y[rows]
            if recv_topk_weights is not None:
                cw = self._region("combine_w", torch.float32, (T * S, K), rank=src)
                cw[slot_of[rows]] = recv_topk_weights[rows].float()
        self._barrier("combine.data")
        out, out_w = self._reduce(y.dtype, handle, recv_topk_weights is not None)
        self._barrier("combine.done")
        return out, out_w

    def _reduce(self, dtype, handle, with_weights):
        lay = self.layout
        Tn, H, K, S = handle.num_tokens, lay.hidden, lay.topk, lay.combine_slots
        cx = self._region("combine_x", dtype, (Tn, S, H))  # first Tn tokens' slots
        acc = torch.zeros((Tn, H), dtype=torch.float32)
        acc_w = None
        if handle.output_layout == "rank":
            if with_weights:
                cw = self._region("combine_w", torch.float32, (Tn, S, K))
                acc_w = torch.zeros((Tn, K), dtype=torch.float32)
            for r in range(lay.world_size):
                t = handle.is_token_in_rank[:, r].nonzero().flatten()
                acc[t] = acc[t] + cx[t, r].float()
                if acc_w is not None:
                    acc_w[t] = acc_w[t] + cw[t, r]
        else:
            for k in range(K):
                t = (handle.topk_idx[:, k] >= 0).nonzero().flatten()
                prod = handle.topk_weights[t, k].unsqueeze(1) * cx[t, k].float()
                acc[t] = acc[t] + prod
        return acc.to(dtype), acc_w


class HostPush(_HostProtocol):
    name = "push"


class HostPull(_HostProtocol):
    name = "pull"
