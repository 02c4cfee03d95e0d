"""The nvshmem push protocol's host arithmetic (offsets, send lists, output positions, self
rows), replayed on the CPU by a row-by-row model of what csrc/nvshmem/nvshmem_ext.cu does,
must give the reference's results bitwise. Catches offset bugs without a GPU."""
import pytest
import torch

from symmoe import reference
from symmoe.config import Config
from symmoe.handle import DispatchHandle
from symmoe.protocol.nvshmem import (geometry, out_positions, padding_rows, routing_counts, self_rows,
                                     send_entries)
from symmoe.testing import CHECK_ROUTINGS, _tokens_per_rank, assert_bitwise
from symmoe.workload import make_inputs



def _model(W: int, layout: str, routing, seed: int, align: int = 4):
    cfg = Config().replace(**{"buffer.hidden": 16, "buffer.max_tokens_per_rank": 24, "buffer.topk": 4,
                              "buffer.num_experts": 16, "buffer.expert_alignment": align})
    lay = cfg.layout(W)
    H, K, L, S, E = lay.hidden, lay.topk, lay.local_experts, lay.combine_slots, lay.num_experts
    counts_t = _tokens_per_rank(W, lay.max_tokens, seed)
    inputs = make_inputs(routing, num_tokens=counts_t, hidden=H, topk=K, num_experts=E, world_size=W,
                         dtype=torch.bfloat16, seed=seed)
    ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                             E, layout, align)
    routings = [routing_counts(lay, i.topk_idx) for i in inputs]
    counts = torch.stack([torch.cat([torch.tensor([i.x.shape[0]], dtype=torch.int32), r.num_tokens_per_rank,
                                     r.num_tokens_per_expert]) for i, r in zip(inputs, routings)])
    geo = [geometry(lay, r, counts, layout, align) for r in range(W)]
    rows = [int(geo[r]["totals"][r]) for r in range(W)]
    pos = [out_positions(geo[r]) if layout == "expert" else None for r in range(W)]
    outs = []
    for r in range(W):
        n = rows[r]
        outs.append(dict(x=torch.zeros(n, H, dtype=torch.bfloat16),
                         idx=torch.full((n, K) if layout == "rank" else (n,), -1, dtype=torch.int64),
                         w=torch.zeros((n, K) if layout == "rank" else (n,)),
                         rank=torch.full((n,), -1, dtype=torch.int32), tok=torch.full((n,), -1, dtype=torch.int32),
                         slot=torch.full((n,), -1, dtype=torch.int32)))
    pool = [dict() for _ in range(W)]

    def meta(inp, t, slot, d):
        if layout == "rank":
            e = inp.topk_idx[t].long()
            loc = torch.where((e >= 0) & (e // L == d), e - d * L, -1)
            return loc, torch.where(loc >= 0, inp.topk_weights[t], 0.0)
        return int(inp.topk_idx[t, slot]) - d * L, float(inp.topk_weights[t, slot])

    def place(d, s, q, row, m, ent):
        o = int(pos[d][q]) if pos[d] is not None else q
        out = outs[d]
        out["x"][o], (out["idx"][o], out["w"][o]) = row, (torch.as_tensor(m[0]), torch.as_tensor(m[1]))
        out["rank"][o], out["tok"][o], out["slot"][o] = s, ent // S, ent % S

    # senders: rows into the receivers' pools (own rows straight to the output)
    for s in range(W):
        g = geo[s]
        ents = send_entries(lay, routings[s], inputs[s].topk_idx, layout)
        for d in range(W):
            for i in range(int(g["send_cnt"][d])):
                ent = int(ents[int(g["send_off"][d]) + i])
                t, slot = ent // S, ent % S
                q = int(g["dst_base"][d]) + i
                m = meta(inputs[s], t, slot, d)
                if d == s:
                    place(d, s, q, inputs[s].x[t], m, ent)
                else:
                    pool[d][q] = (inputs[s].x[t], m, ent)
    # receivers: pool -> output
    for d in range(W):
        g = geo[d]
        for s in range(W):
            if s == d:
                continue
            for i in range(int(g["recv_cnt"][s])):
                q = int(g["recv_base"][s]) + i
                row, m, ent = pool[d][q]
                place(d, s, q, row, m, ent)
        if layout == "expert":
            assert padding_rows(g, rows[d]).tolist() == (outs[d]["rank"] < 0).nonzero().flatten().tolist()
    for r in range(W):
        ctx = f"W={W} {layout} {routing.kind} rank {r}"
        want = ref.recv[r]
        assert_bitwise("x", outs[r]["x"], want.x, ctx)
        assert_bitwise("idx", outs[r]["idx"], want.topk_idx, ctx)
        assert_bitwise("w", outs[r]["w"], want.topk_weights, ctx)
        assert_bitwise("rank", outs[r]["rank"], want.src_rank, ctx)
        assert_bitwise("tok", outs[r]["tok"], want.src_token, ctx)

    # combine: push back into the sources' slots, reduce there in the fixed order
    ys = [torch.randn(rows[r], H, generator=torch.Generator().manual_seed(seed + r)).to(torch.bfloat16)
          for r in range(W)]
    want = reference.combine(ys, ref, [i.topk_idx for i in inputs], [i.topk_weights for i in inputs], E, layout)
    handles = []
    for r in range(W):
        offs = torch.tensor([*geo[r]["gstart"].tolist(), rows[r]]) if layout == "expert" else None
        handles.append(DispatchHandle(layout, inputs[r].x.shape[0], inputs[r].topk_idx.long(),
                                      inputs[r].topk_weights, routings[r].is_token_in_rank, counts, rows[r],
                                      outs[r]["rank"], outs[r]["tok"], outs[r]["slot"], offs, 0))
    slots = [dict() for _ in range(W)]
    for me in range(W):
        h = handles[me]
        g = geometry(lay, me, counts, layout, None, h.expert_offsets[:-1] if layout == "expert" else None)
        p = out_positions(g) if layout == "expert" else None
        for s in range(W):
            if s == me:
                continue
            for i in range(int(g["recv_cnt"][s])):
                q = int(g["recv_base"][s]) + i
                row = int(p[q]) if p is not None else q
                slots[s][int(h.recv_src_token[row]) * S + int(h.recv_src_slot[row])] = ys[me][row]
    for s in range(W):
        h = handles[s]
        own = self_rows(h, s, S)
        T = h.num_tokens
        acc = torch.zeros(T, H)
        for t in range(T):
            e = h.topk_idx[t]
            if layout == "rank":
                for r in sorted({int(v) // L for v in e if v >= 0}):
                    v = ys[s][int(own[t * S + r])] if r == s else slots[s][t * S + r]
                    acc[t] = acc[t] + v.float()
            else:
                for k in range(K):
                    if e[k] < 0:
                        continue
                    r = int(e[k]) // L
                    v = ys[s][int(own[t * S + k])] if r == s else slots[s][t * S + k]
                    acc[t] = acc[t] + h.topk_weights[t, k] * v.float()
        assert_bitwise("combined_x", acc.to(torch.bfloat16), want[s][0], f"W={W} {layout} {routing.kind} src {s}")


@pytest.mark.parametrize("layout", ["rank", "expert"])
@pytest.mark.parametrize("W", [1, 2, 4])
def test_push_offsets_replay_the_reference(W, layout):
    for i, routing in enumerate(CHECK_ROUTINGS):
        if routing.kind == "empty_ranks" and W < 4:
            continue
        _model(W, layout, routing, seed=100 + 17 * i + W)
