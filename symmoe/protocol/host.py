"""push and pull in plain torch over the host backend's shared memory.

This is the same flow the CUDA kernels run, step for step, so the offsets and the
signalling are exercised on machines without a GPU:

dispatch
  1. each rank stores its counts row (T, tokens per rank, pairs per expert) into row
     ``rank`` of every peer's ``counts`` matrix; pull also publishes x/topk in ``input``
  2. barrier "dispatch.counts" -- now every rank holds the whole matrix, so every rank
     can check every receiver's capacity and all raise together if one overflows
  3. push: senders store rows, topk and ``recv_src`` into the receivers' ``recv`` pools at
     offsets that are prefix sums of the matrix; barrier "dispatch.data"
     pull: receivers read each source's published ``topk_idx`` and copy the rows meant
     for them; barrier "dispatch.done" (sources may then overwrite ``input``)
combine
  4. receivers store each row into its source's ``combine`` region at slot
     ``recv_src = t * S + slot``; barrier "combine.data"
  5. sources reduce their slots in fixed order in fp32; barrier "combine.done"
"""
from __future__ import annotations

import torch

from .. import reference
from ..handle import DispatchHandle
from ..reference import DispatchLayout, RecvResult
from .base import Protocol


class _HostProtocol(Protocol):
    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> DispatchLayout:
        return reference.get_dispatch_layout(topk_idx, self.layout.num_experts, self.layout.world_size)

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

    def _plan(self, counts: torch.Tensor, output_layout: str, alignment: int) -> dict:
        """Row offsets every rank derives identically from the counts matrix."""
        lay = self.layout
        W, L = lay.world_size, lay.local_experts
        per_rank = counts[:, 1:1 + W].long()  # [src, dst]
        per_expert = counts[:, 1 + W:].long().view(W, W, L)  # [src, dst, local expert]
        if output_layout == "rank":
            totals = per_rank.sum(0)  # rows each receiver gets
            start = per_rank.cumsum(0) - per_rank  # [src, dst] first row of src at dst
            plan = {"totals": totals, "start": start}
        else:
            group = per_expert.sum(0)  # [dst, L]
            padded = (group + alignment - 1) // alignment * alignment
            group_start = padded.cumsum(1) - padded  # [dst, L]
            start = group_start.unsqueeze(0) + (per_expert.cumsum(0) - per_expert)  # [src, dst, L]
            plan = {"totals": padded.sum(1), "start": start, "group": group, "group_start": group_start}
        lay.check_capacity(plan["totals"].tolist(), output_layout)
        return plan

    def _send_list(self, topk_idx: torch.Tensor, dst: int, output_layout: str) -> list[tuple]:
        """What this rank (as a source) sends to ``dst``, in receiver order.

        rank-major: one entry (tokens, slot=None); expert-major: one (tokens, slots) per local expert."""
        L = self.layout.local_experts
        idx = topk_idx.long()
        if output_layout == "rank":
            tokens = ((idx >= 0) & (idx // L == dst)).any(1).nonzero().flatten()
            return [(tokens, None)]
        out = []
        for j in range(L):
            t, k = (idx == dst * L + j).nonzero(as_tuple=True)
            out.append((t, k))
        return out

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, output_layout, alignment):
        lay, me = self.layout, self.mem.rank
        routing = self.get_dispatch_layout(topk_idx)
        self._exchange_counts(topk_idx, routing)
        if self.name == "pull":
            self._publish(x, topk_idx, topk_weights)
        self._barrier("dispatch.counts")
        counts = self._read_counts()
        plan = self._plan(counts, output_layout, alignment)
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
                sx = self._region("in_x", x.dtype, (T, lay.hidden), rank=src)
                si = self._region("in_idx", torch.int32, (T, K), rank=src)
                sw = self._region("in_w", torch.float32, (T, K), rank=src)
                self._move(sx, si, sw, src=src, dst=me, plan=plan, output_layout=output_layout, target=me)
            self._barrier("dispatch.done")
        return self._collect(x.dtype, routing, counts, plan, topk_idx, topk_weights, output_layout, alignment)

    def _publish(self, x, topk_idx, topk_weights) -> None:
        T, K = topk_idx.shape
        self._region("in_x", x.dtype, tuple(x.shape)).copy_(x)
        self._region("in_idx", torch.int32, (T, K)).copy_(topk_idx)
        self._region("in_w", torch.float32, (T, K)).copy_(topk_weights)

    def _move(self, x, topk_idx, topk_weights, *, src, dst, plan, output_layout, target) -> None:
        """Copy source ``src``'s rows for ``dst`` into ``dst``'s pool; ``target`` is the rank
        whose memory this rank writes (``dst`` for push; itself for pull)."""
        lay = self.layout
        R, H, K, L, S = lay.recv_rows, lay.hidden, lay.topk, lay.local_experts, lay.combine_slots
        rx = self._region("recv_x", x.dtype, (R, H), rank=target)
        ri = self._region("recv_idx", torch.int32, (R, K), rank=target)
        rw = self._region("recv_w", torch.float32, (R, K), rank=target)
        rs = self._region("recv_src", torch.int32, (R,), rank=target)
        idx = topk_idx.long()
        for j, (tokens, slots) in enumerate(self._send_list(topk_idx, dst, output_layout)):
            n = tokens.numel()
            if n == 0:
                continue
            if output_layout == "rank":
                base = int(plan["start"][src, dst])
                local = idx[tokens]
                mine = (local >= 0) & (local // L == dst)
                ri[base:base + n] = torch.where(mine, local - dst * L, -1).to(torch.int32)
                rw[base:base + n] = torch.where(mine, topk_weights[tokens].float(), 0.0)
                rs[base:base + n] = (tokens * S + dst).to(torch.int32)
            else:
                base = int(plan["start"][src, dst, j])
                ri[base:base + n, 0] = j
                rw[base:base + n, 0] = topk_weights[tokens, slots].float()
                rs[base:base + n] = (tokens * S + slots).to(torch.int32)
            rx[base:base + n] = x[tokens]

    def _collect(self, dtype, routing, counts, plan, topk_idx, topk_weights, output_layout, alignment):
        """Copy this rank's pool into fresh output tensors (the pool is reused next call)."""
        lay, me = self.layout, self.mem.rank
        W, H, K, L, S = lay.world_size, lay.hidden, lay.topk, lay.local_experts, lay.combine_slots
        rows = int(plan["totals"][me])
        rx = self._region("recv_x", dtype, (lay.recv_rows, H))
        ri = self._region("recv_idx", torch.int32, (lay.recv_rows, K))
        rw = self._region("recv_w", torch.float32, (lay.recv_rows, K))
        rs = self._region("recv_src", torch.int32, (lay.recv_rows,))
        src_rank = torch.full((rows,), -1, dtype=torch.int32)
        if output_layout == "rank":
            per_src = counts[:, 1 + me].long()
            src_rank = torch.repeat_interleave(torch.arange(W, dtype=torch.int32), per_src)
            out_x = rx[:rows].clone()
            out_idx = ri[:rows].long()
            out_w = rw[:rows].clone()
            src = rs[:rows].clone()
            per_expert = torch.bincount(out_idx[out_idx >= 0], minlength=L).to(torch.int32)
            offsets = None
        else:
            group, gstart = plan["group"][me], plan["group_start"][me]
            valid = torch.zeros(rows, dtype=torch.bool)
            for j in range(L):
                a = int(gstart[j])
                valid[a:a + int(group[j])] = True
                for s in range(W):
                    b = int(plan["start"][s, me, j])
                    src_rank[b:b + int(counts[s, 1 + W + me * L + j])] = s
            out_x = torch.where(valid.unsqueeze(1), rx[:rows], torch.zeros((), dtype=dtype))
            out_idx = torch.where(valid, ri[:rows, 0].long(), -1)
            out_w = torch.where(valid, rw[:rows, 0], 0.0)
            src = torch.where(valid, rs[:rows], -1)
            per_expert = group.to(torch.int32)
            offsets = torch.cat([gstart, gstart.new_tensor([rows])]).long()
        src_token = torch.where(src >= 0, src // S, -1).to(torch.int32)
        src_slot = torch.where(src >= 0, src % S, -1).to(torch.int32)
        recv = RecvResult(out_x, out_idx, out_w, per_expert, src_rank, src_token, offsets)
        handle = DispatchHandle(
            output_layout=output_layout, num_tokens=topk_idx.shape[0], topk_idx=topk_idx.long(),
            topk_weights=topk_weights.float(), is_token_in_rank=routing.is_token_in_rank, counts=counts,
            num_recv_rows=rows, recv_src_rank=src_rank, recv_src_token=src_token, recv_src_slot=src_slot,
            expert_offsets=offsets, buffer_id=self.buffer_id)
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
