"""Per-rank checks of the framework adapters (``symmoe.adapters``), shared by the host tests
and the GPU tests.

Each check runs inside one rank, draws every rank's inputs from the seed (the routings of
``GRAD_ROUTINGS``: masked slots and tokens, ranks that receive nothing, skew; one rank with no
tokens), runs the adapter, and compares its outputs and gradients bit for bit with what one
process computes in plain torch from every rank's inputs: each value is either a copy or an
fp32 sum in an order the adapter's contract fixes, so nothing may differ.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..config import Config, from_dict
from ..layout import DTYPES
from .checks import _case_inputs, assert_bitwise
from .training import GRAD_ROUTINGS, _randn


def _routing_map(idx: torch.Tensor, w: torch.Tensor, E: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron's router outputs for a top-k routing: a [T, E] multi-hot map and the probs
    (the slot's weight where routed, 0 elsewhere)."""
    T = idx.shape[0]
    live = idx >= 0
    t, k = live.nonzero(as_tuple=True)
    rmap = torch.zeros((T, E), dtype=torch.bool)
    probs = torch.zeros((T, E), dtype=torch.float32)
    rmap[t, idx[t, k]] = True
    probs[t, idx[t, k]] = w[t, k].float()
    return rmap, probs


def _megatron_plain(rmaps, xs, W: int, L: int, r: int):
    """Rank r's received rows in plain torch: [(s, t)] by source then token, those with an
    expert on r; and the permuted pairs [(i, e)] by local expert, then received row."""
    recv = [(s, t) for s in range(W) for t in range(xs[s].shape[0]) if bool(rmaps[s][t, r * L:(r + 1) * L].any())]
    pairs = [(i, e) for e in range(L) for i, (s, t) in enumerate(recv) if bool(rmaps[s][t, r * L + e])]
    return recv, pairs


def _fp32_sums(groups: list[list[torch.Tensor]], H: int, dtype: torch.dtype) -> torch.Tensor:
    """One row per group: its rows added in order in fp32, one cast (0 for an empty group)."""
    out = torch.zeros((len(groups), H), dtype=torch.float32)
    for j, rows in enumerate(groups):
        acc = torch.zeros(H, dtype=torch.float32)
        for row in rows:
            acc = acc + row.float()
        out[j] = acc
    return out.to(dtype)


def check_megatron(rank: int, world_size: int, config: dict[str, Any], seed: int, through: str = "manager",
                   device: str = "cpu") -> int:
    """``SymmoeManager`` (``through='manager'``: called directly; ``'megatron'``: inside
    Megatron-Core's ``MoEFlexTokenDispatcher``, built after ``install``) against plain torch:

    * forward: received rows, permuted rows (by local expert, then received row) and their
      probs, tokens per expert, and ``combine(restore(y))`` for random expert rows ``y``: the
      fp32 sum over a row's experts by ascending expert (one cast), then over ranks (one cast);
    * backward, for random upstream gradients: ``grad_x[t]`` = over ranks ascending, the cast
      fp32 sum of its permuted rows' gradients; ``grad_probs[t, e]`` = the gradient of the
      permuted prob of (t, e); ``grad_y`` = the output gradient of the row's token.

    Returns the number of cases checked."""
    from ..adapters import megatron as sm
    from ..buffer import Buffer

    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype, dev, E, H = DTYPES[b.dtype], torch.device(device), b.num_experts, b.hidden
    L = E // world_size
    group = dist.group.WORLD if dist.is_initialized() else None
    if through == "megatron":
        disp = _megatron_dispatcher(rank, world_size, cfg, group, L)
        mgr = disp._comm_manager
        if not isinstance(mgr, sm.SymmoeManager):
            raise AssertionError(f"rank {rank}: Megatron built {type(mgr).__name__}, not SymmoeManager")
        buf = mgr.buffer
    else:
        buf = Buffer(group, cfg)
        mgr = sm.SymmoeManager(group, L, b.topk, E, buffer=buf)
    checked = 0
    try:
        for i, routing in enumerate(GRAD_ROUTINGS):
            s_ = seed + 7919 * i
            ctx = f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} megatron via {through} routing={routing.kind} seed={s_}"
            inputs = _case_inputs(routing, world_size, cfg, s_)
            xs = [inp.x for inp in inputs]
            maps = [_routing_map(inp.topk_idx, inp.topk_weights, E) for inp in inputs]
            rmaps, probss = [m[0] for m in maps], [m[1] for m in maps]
            recvs = [_megatron_plain(rmaps, xs, world_size, L, r) for r in range(world_size)]
            npairs = [len(p) for _, p in recvs]
            g_rows = [_randn((npairs[r], H), s_ * 7 + r, dtype) for r in range(world_size)]
            g_probs = [_randn((npairs[r],), s_ * 11 + r) for r in range(world_size)]
            ys = [_randn((npairs[r], H), s_ * 13 + r, dtype) for r in range(world_size)]
            g_out = [_randn((xs[r].shape[0], H), s_ * 17 + r, dtype) for r in range(world_size)]

            x = xs[rank].to(dev).requires_grad_(True)
            probs = probss[rank].to(dev).requires_grad_(True)
            rmap = rmaps[rank].to(dev)
            if through == "megatron":
                h, p = disp.dispatch_preprocess(x, rmap, probs)
                h, p = disp.token_dispatch(h, p)
                recv_x = h
                rows, per_expert, pprobs = disp.dispatch_postprocess(h, p)
            else:
                mgr.setup_metadata(rmap.view(-1, world_size, L), probs.view(-1, world_size, L))
                recv_x = mgr.dispatch(x)
                rows, pprobs = mgr.get_permuted_hidden_states_by_experts(recv_x)
                per_expert = mgr.get_number_of_tokens_per_expert()
            y = ys[rank].to(dev).requires_grad_(True)
            if through == "megatron":
                out = disp.combine_postprocess(disp.token_combine(disp.combine_preprocess(y)))
            else:
                out = mgr.combine(mgr.get_restored_hidden_states_by_experts(y))

            recv, pairs = recvs[rank]
            want_recv = torch.stack([xs[s][t] for s, t in recv]) if recv else torch.zeros((0, H), dtype=dtype)
            assert_bitwise("received rows", recv_x, want_recv, ctx)
            want_rows = torch.stack([want_recv[j] for j, _ in pairs]) if pairs else torch.zeros((0, H), dtype=dtype)
            assert_bitwise("permuted rows", rows, want_rows, ctx)
            want_p = torch.tensor([float(probss[recv[j][0]][recv[j][1], rank * L + e]) for j, e in pairs],
                                  dtype=torch.float32)
            assert_bitwise("permuted probs", pprobs, want_p, ctx)
            counts = [sum(1 for _, e in pairs if e == le) for le in range(L)]
            if per_expert.tolist() != counts:
                raise AssertionError(f"{ctx}: tokens per expert {per_expert.tolist()} != {counts}")
            # Combined: per rank, each received row's restored sum; then over ranks.
            restored = []
            for r in range(world_size):
                rr, pp = recvs[r]
                restored.append(_fp32_sums([[ys[r][n] for n, (j, _) in enumerate(pp) if j == i] for i in range(len(rr))],
                                           H, dtype))
            T = xs[rank].shape[0]
            parts: list[list[torch.Tensor]] = [[] for _ in range(T)]
            for r in range(world_size):
                for i2, (s, t) in enumerate(recvs[r][0]):
                    if s == rank:
                        parts[t].append(restored[r][i2])
            assert_bitwise("combined", out, _fp32_sums(parts, H, dtype), ctx)

            gx, gp, gy = torch.autograd.grad((rows, pprobs, out), (x, probs, y),
                                             (g_rows[rank].to(dev), g_probs[rank].to(dev), g_out[rank].to(dev)))
            grad_rows_per_rank = []
            for r in range(world_size):
                rr, pp = recvs[r]
                grad_rows_per_rank.append(_fp32_sums([[g_rows[r][n] for n, (j, _) in enumerate(pp) if j == i]
                                                      for i in range(len(rr))], H, dtype))
            parts = [[] for _ in range(T)]
            want_gp = torch.zeros((T, E), dtype=torch.float32)
            for r in range(world_size):
                rr, pp = recvs[r]
                for i2, (s, t) in enumerate(rr):
                    if s == rank:
                        parts[t].append(grad_rows_per_rank[r][i2])
                for n, (j, e) in enumerate(pp):
                    if rr[j][0] == rank:
                        want_gp[rr[j][1], r * L + e] = g_probs[r][n]
            assert_bitwise("grad hidden_states", gx, _fp32_sums(parts, H, dtype), ctx)
            assert_bitwise("grad probs", gp, want_gp, ctx)
            want_gy = torch.stack([g_out[recv[j][0]][recv[j][1]] for j, _ in pairs]) if pairs else \
                torch.zeros((0, H), dtype=dtype)
            assert_bitwise("grad expert rows", gy, want_gy, ctx)
            checked += 1
    finally:
        buf.close()
    return checked


def _megatron_dispatcher(rank: int, world_size: int, cfg: Config, group: Any, L: int):
    """Megatron-Core's flex dispatcher (DeepEP backend, EP = world size, TP = 1) after
    ``symmoe.adapters.megatron.install(cfg)``: it builds a SymmoeManager."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher
    from megatron.core.transformer.transformer_config import TransformerConfig

    from ..adapters import megatron as sm

    b = cfg.buffer
    tcfg = TransformerConfig(num_layers=1, hidden_size=b.hidden, num_attention_heads=4, num_moe_experts=b.num_experts,
                             moe_router_topk=b.topk, moe_token_dispatcher_type="flex",
                             moe_flex_dispatcher_backend="deepep", moe_router_dtype="fp32",
                             use_cpu_initialization=True)
    solo = None
    for r in range(world_size):  # every rank creates every one-rank group, in the same order
        g = dist.new_group([r])
        if r == rank:
            solo = g
    pgs = ProcessGroupCollection(ep=group, expt_tp=solo, tp_ep=group)
    sm.install(cfg)
    try:
        return MoEFlexTokenDispatcher(L, list(range(rank * L, rank * L + L)), tcfg, pg_collection=pgs)
    finally:
        sm.uninstall()


def check_torchtitan(rank: int, world_size: int, config: dict[str, Any], seed: int, device: str = "cpu") -> int:
    """``SymmoeTokenDispatcher`` (built from its Config, wired with the world group) against
    plain torch:

    * ``dispatch``: rows grouped by local expert, in a group by source rank then token, each
      group zero-padded to ``buffer.expert_alignment``; the padded group sizes;
    * ``combine`` of random rows: ``sum_k fp32(score[t, k]) * fp32(row(t, k))`` by ascending k,
      one cast;
    * gradients for random upstream ones (random on padding rows too, which must not count):
      ``grad_x[t]`` = fp32 sum of its rows' gradients by ascending k, one cast;
      ``grad_scores[t, k]`` = fp32 dot product of the output gradient and row(t, k), as the owner
      forms it over all its rows on the device;
      ``grad_rows[row(t, k)]`` = ``score[t, k] * grad_out[t]`` in fp32, one cast (0 on padding).

    Returns the number of cases checked."""
    from ..adapters.torchtitan import SymmoeTokenDispatcher

    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype, dev, E, H, K, A = DTYPES[b.dtype], torch.device(device), b.num_experts, b.hidden, b.topk, b.expert_alignment
    L = E // world_size
    if dist.is_initialized():
        disp = SymmoeTokenDispatcher.Config(num_experts=E, top_k=K, symmoe_config=cfg).build()
        disp.wire_meshes(ep_mesh=dist.group.WORLD)
    else:  # one process without torch.distributed: a Buffer of this process alone
        from ..buffer import Buffer
        disp = SymmoeTokenDispatcher.from_buffer(Buffer(None, cfg))
    checked = 0
    try:
        for i, routing in enumerate(GRAD_ROUTINGS):
            s_ = seed + 104729 * i
            ctx = f"rank {rank}/{world_size} {cfg.backend}/{disp.buffer.protocol} torchtitan routing={routing.kind} seed={s_}"
            inputs = _case_inputs(routing, world_size, cfg, s_)
            xs = [inp.x for inp in inputs]
            idxs = [inp.topk_idx.long() for inp in inputs]
            ws = [_randn(inp.topk_weights.shape, s_ * 3 + r) for r, inp in enumerate(inputs)]  # any sign, unnormalised
            # Plain torch: each rank's rows [(s, t, k)] by local expert, source, token; padded groups.
            layouts = []
            for r in range(world_size):
                groups = [[(s, t, k) for s in range(world_size) for t in range(xs[s].shape[0]) for k in range(K)
                           if int(idxs[s][t, k]) == r * L + e] for e in range(L)]
                sizes = [-(-len(g) // A) * A for g in groups]
                where: dict[tuple[int, int, int], int] = {}
                start = 0
                for g, n in zip(groups, sizes):
                    for j, key in enumerate(g):
                        where[key] = start + j
                    start += n
                layouts.append((sizes, where, start))
            sizes, where, R = layouts[rank]
            g_routed = [_randn((layouts[r][2], H), s_ * 7 + r, dtype) for r in range(world_size)]
            ys = [_randn((layouts[r][2], H), s_ * 13 + r, dtype) for r in range(world_size)]
            g_out = [_randn((xs[r].shape[0], H), s_ * 17 + r, dtype) for r in range(world_size)]

            x = xs[rank].to(dev).requires_grad_(True)
            scores = ws[rank].to(dev).requires_grad_(True)
            ids = idxs[rank].to(dev)
            counts_in = torch.bincount(ids[ids >= 0], minlength=E)
            routed, per_expert, meta = disp.dispatch(x, scores, ids, counts_in)
            y = ys[rank].to(dev).requires_grad_(True)
            out = disp.combine(y, meta, x)

            want = torch.zeros((R, H), dtype=dtype)
            for (s, t, k), row in where.items():
                want[row] = xs[s][t]
            assert_bitwise("routed rows", routed, want, ctx)
            if per_expert.tolist() != sizes or per_expert.dtype != torch.int64 or per_expert.device != x.device:
                raise AssertionError(f"{ctx}: tokens per local expert {per_expert} != int64 {sizes} on {x.device}")
            T = xs[rank].shape[0]
            mine = idxs[rank]
            owner = [[int(mine[t, k]) // L if int(mine[t, k]) >= 0 else -1 for k in range(K)] for t in range(T)]
            want_out = torch.zeros((T, H), dtype=torch.float32)
            for t in range(T):
                acc = torch.zeros(H, dtype=torch.float32)
                for k in range(K):
                    if owner[t][k] >= 0:
                        acc = acc + ws[rank][t, k] * ys[owner[t][k]][layouts[owner[t][k]][1][(rank, t, k)]].float()
                want_out[t] = acc
            assert_bitwise("combined", out, want_out.to(dtype), ctx)

            gx, gs, gy = torch.autograd.grad((routed, out), (x, scores, y), (g_routed[rank].to(dev), g_out[rank].to(dev)))
            want_gx = _fp32_sums([[g_routed[owner[t][k]][layouts[owner[t][k]][1][(rank, t, k)]] for k in range(K)
                                   if owner[t][k] >= 0] for t in range(T)], H, dtype)
            assert_bitwise("grad x", gx, want_gx, ctx)
            # The dot products as each owner forms them: over all its rows at once, on the device
            # (a CUDA sum over H adds in another order than the CPU's).
            dots = []
            for o in range(world_size):
                g_rows = torch.zeros((layouts[o][2], H), dtype=dtype)
                for (s, t, k), row in layouts[o][1].items():
                    g_rows[row] = g_out[s][t]
                dots.append((g_rows.to(dev).float() * ys[o].to(dev).float()).sum(-1).cpu())
            want_gs = torch.zeros((T, K), dtype=torch.float32)
            for t in range(T):
                for k in range(K):
                    if owner[t][k] >= 0:
                        want_gs[t, k] = dots[owner[t][k]][layouts[owner[t][k]][1][(rank, t, k)]]
            assert_bitwise("grad topk_scores", gs, want_gs, ctx)
            want_gy = torch.zeros((R, H), dtype=dtype)
            for (s, t, k), row in where.items():
                want_gy[row] = (ws[s][t, k] * g_out[s][t].float()).to(dtype)
            assert_bitwise("grad routed rows", gy, want_gy, ctx)
            checked += 1
    finally:
        disp.close()
    return checked
