"""``MoELayer``: a router, this rank's experts and the communication of a ``symmoe.Buffer``.

Each rank holds ``num_experts / world_size`` experts (global ids ``rank * L ... rank * L +
L - 1``, as the Buffer places them); the router, the shared expert and everything outside the
layer are replicated. The layer's output on each rank is, for each of its tokens,
``shared(x) + sum_k w[t, k] * expert_{idx[t, k]}(x[t])``, with the communication and its
gradients from ``symmoe.autograd`` (exact-size outputs) or ``symmoe.ops`` (worst-case sizes,
which ``torch.compile(fullgraph=True)`` traces). ``forward_low_latency`` is the inference
forward over the low-latency mode, which a CUDA graph can capture.
"""
from __future__ import annotations

import os
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from . import autograd, ops
from .buffer import Buffer
from .errors import InputError


class MoELayer(nn.Module):
    """A top-k MoE layer over ``buffer`` (whose config gives hidden, num_experts, topk, dtype
    and output_layout).

    * ``score_func``: 'softmax' or 'sigmoid' router scores; sigmoid weights are normalised
      over the chosen k (DeepSeek-V3). ``route_scale`` multiplies the weights.
    * ``num_groups`` / ``topk_groups`` (both or neither): group-limited routing as in
      DeepSeek-V3: experts in ``num_groups`` groups, each token picks its experts among its
      ``topk_groups`` best groups (a group's score: the sum of its two best scores with
      sigmoid, its best with softmax).
    * experts: SwiGLU, ``ffn_hidden`` wide, as one grouped GEMM (``torch._grouped_mm``) on a
      CUDA GPU that has it for bfloat16, else a loop over the local experts.
    * ``shared_ffn_hidden`` > 0: a shared SwiGLU expert every token goes through.
    * ``num_worst_tokens``: 0 for outputs of exactly the received rows (``symmoe.autograd``),
      N > 0 or 'auto' (the most rows a rank can receive) for worst-case sizes through the
      ``symmoe`` custom ops (static shapes: ``torch.compile`` without graph breaks).
    * ``seed``: the parameters are drawn from it, each expert from its global id, so the
      same seed gives the same model at every world size.
    """

    def __init__(self, buffer: Buffer, ffn_hidden: int, *, score_func: Literal["softmax", "sigmoid"] = "softmax",
                 num_groups: int = 0, topk_groups: int = 0, route_scale: float = 1.0, shared_ffn_hidden: int = 0,
                 num_worst_tokens: int | Literal["auto"] = 0, output_layout: str | None = None, seed: int = 0):
        super().__init__()
        b = buffer.config.buffer
        self.buffer = buffer
        self.hidden, self.num_experts, self.topk = b.hidden, b.num_experts, b.topk
        self.local_experts = buffer.layout.local_experts
        self.first_expert = buffer.rank * self.local_experts
        self.output_layout = output_layout or b.output_layout
        if self.output_layout not in ("rank", "expert"):
            raise InputError(f"output_layout={self.output_layout!r}; allowed: 'rank', 'expert'")
        if score_func not in ("softmax", "sigmoid"):
            raise InputError(f"score_func={score_func!r}; allowed: 'softmax', 'sigmoid'")
        if bool(num_groups) != bool(topk_groups):
            raise InputError(f"num_groups={num_groups}, topk_groups={topk_groups}: give both (group-limited "
                             "routing) or neither")
        if num_groups and (self.num_experts % num_groups or not 0 < topk_groups <= num_groups
                           or topk_groups * (self.num_experts // num_groups) < self.topk):
            raise InputError(f"num_groups={num_groups}, topk_groups={topk_groups}: need num_experts="
                             f"{self.num_experts} divisible by num_groups, 0 < topk_groups <= num_groups, and "
                             f"topk_groups groups holding at least topk={self.topk} experts")
        if isinstance(ffn_hidden, bool) or not isinstance(ffn_hidden, int) or ffn_hidden < 1:
            raise InputError(f"ffn_hidden={ffn_hidden!r}; allowed: an integer >= 1")
        self.score_func, self.num_groups, self.topk_groups = score_func, num_groups, topk_groups
        self.route_scale, self.ffn_hidden = route_scale, ffn_hidden
        self.num_worst_tokens = self._worst(num_worst_tokens)
        dtype, H, Fh, L = buffer.dtype, self.hidden, ffn_hidden, self.local_experts

        def draw(shape: tuple[int, ...], fan_in: int, key: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(seed * 1000003 + key)
            return (torch.randn(shape, generator=g) / fan_in ** 0.5).to(dtype)

        self.gate = nn.Parameter(draw((self.num_experts, H), H, 1 << 20).float())  # the router runs in fp32
        # Expert e's weights from its global id: the model does not depend on the world size.
        experts = range(self.first_expert, self.first_expert + L)
        self.w13 = nn.Parameter(torch.stack([draw((H, 2 * Fh), H, 2 * e) for e in experts]))  # [L, H, 2F]
        self.w2 = nn.Parameter(torch.stack([draw((Fh, H), Fh, 2 * e + 1) for e in experts]))  # [L, F, H]
        if shared_ffn_hidden:
            self.shared_w13 = nn.Parameter(draw((H, 2 * shared_ffn_hidden), H, (1 << 20) + 1))
            self.shared_w2 = nn.Parameter(draw((shared_ffn_hidden, H), shared_ffn_hidden, (1 << 20) + 2))
        else:
            self.shared_w13 = self.shared_w2 = None
        ops.register(buffer)  # outside any compiled region

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, ffn_hidden: int, group=None, **kwargs) -> "MoELayer":
        """A layer over a new Buffer of the config at ``path`` (collective over ``group``)."""
        return cls(Buffer.from_yaml(path, group), ffn_hidden, **kwargs)

    def _worst(self, n: int | str) -> int:
        if n == "auto":
            lay = self.buffer.layout
            return min(lay.recv_rows, lay.worst_case_rows(self.output_layout))
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"num_worst_tokens={n!r}; allowed: an integer >= 0 or 'auto'")
        return n

    def expert_parameters(self) -> list[nn.Parameter]:
        """This rank's own parameters (its experts): not replicated, so not averaged across ranks."""
        return [self.w13, self.w2]

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x, *self.route(x))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_idx [T, K] int64, topk_weights [T, K] fp32) of the tokens ``x`` [T, hidden]."""
        return route_tokens(x, self.gate, topk=self.topk, score_func=self.score_func, num_groups=self.num_groups,
                            topk_groups=self.topk_groups, route_scale=self.route_scale)

    def moe(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The layer for a given routing (ids in ``[-1, num_experts)``; -1: no expert)."""
        buf, expert = self.buffer, self.output_layout == "expert"
        if self.num_worst_tokens:
            rx, ri, rw, _, h = ops.dispatch(buf, x, topk_idx, topk_weights, num_worst_tokens=self.num_worst_tokens,
                                            output_layout=self.output_layout)
            y = self.experts(rx, ri, None if expert else rw)
            out = ops.combine(buf, y, h, topk_weights if expert else None)
        else:
            rx, ri, rw, _, h = autograd.dispatch(buf, x, topk_idx, topk_weights, output_layout=self.output_layout)
            y = self.experts(rx, ri, None if expert else rw)
            out = autograd.combine(buf, y, h, topk_weights if expert else None)
        if self.shared_w13 is not None:
            out = out + _swiglu(x, self.shared_w13, self.shared_w2)
        return out

    @torch.no_grad()
    def forward_low_latency(self, x: torch.Tensor, num_max_dispatch_tokens_per_rank: int) -> torch.Tensor:
        """Inference forward through the buffer's low-latency mode (``Buffer.low_latency_dispatch``):
        no host wait and fixed shapes, so a CUDA graph can capture it once an eager call with the
        same ``num_max_dispatch_tokens_per_rank`` (T_max, at least this rank's token count) has
        allocated the mode's buffer. Every rank calls it with the same T_max. The experts run as
        one batched GEMM over the masked ``[L, W * T_max, hidden]`` rows (rows past each expert's
        count are computed and never read). No gradients: training uses ``forward``."""
        buf = self.buffer
        if buf.dtype != torch.bfloat16:
            raise InputError(f"forward_low_latency: the buffer's dtype is {buf.dtype}; the low-latency mode moves "
                             "bfloat16 rows (set buffer.dtype: bfloat16)")
        topk_idx, topk_weights = self.route(x)
        recv_x, _, handle, _, _ = buf.low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank,
                                                           self.num_experts)
        out, _, _ = buf.low_latency_combine(_swiglu(recv_x, self.w13, self.w2), topk_idx, topk_weights, handle)
        if self.shared_w13 is not None:
            out = out + _swiglu(x, self.shared_w13, self.shared_w2)
        return out

    def experts(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None) -> torch.Tensor:
        """This rank's experts on its received rows. Rank-major (``topk_idx``/``topk_weights``
        [N, K], local ids, -1 elsewhere): each row's weighted sum over its local slots, in fp32
        by ascending expert, one cast. Expert-major (``topk_idx`` [N], ``topk_weights`` None:
        combine weights them): each row through its expert, padding rows 0."""
        if topk_weights is None:
            slots, coef = topk_idx.unsqueeze(1), (topk_idx >= 0).float().unsqueeze(1)
        else:
            slots, coef = topk_idx, topk_weights
        if _grouped_mm_ok(x, self.ffn_hidden):
            return self._grouped(x, slots, coef)
        acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(self.local_experts):
            c = torch.where(slots == e, coef, 0.0).sum(1)  # at most one slot per row holds expert e
            acc = acc + c.unsqueeze(1) * _swiglu(x, self.w13[e], self.w2[e]).float()
        return acc.to(x.dtype)

    def _grouped(self, x: torch.Tensor, slots: torch.Tensor, coef: torch.Tensor,
                 gmm: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        """One grouped GEMM per projection (``gmm``: ``torch._grouped_mm``): (row, slot) pairs
        sorted by expert (masked pairs last, past the last group), then back to their pairs and
        summed over the slots in fp32. Pairs are a permutation of the expanded rows, so no
        gradient is accumulated by atomics. Only bfloat16 tensors of all pairs are kept
        (``_SlotSum``): fp32 ones of [rows x topk, hidden] took several GB per rank."""
        gmm = gmm or torch._grouped_mm
        P, S = slots.shape
        L, Fh = self.local_experts, self.ffn_hidden
        key = torch.where(slots < 0, L, slots).reshape(-1)
        perm = torch.argsort(key, stable=True)
        offs = torch.bincount(key, minlength=L + 1)[:L].cumsum(0).to(torch.int32)
        live = (key[perm] < L).unsqueeze(1)
        # The grouped GEMM leaves the rows past the last group unwritten, in its outputs and in
        # its input gradients: every where() below keeps that garbage (NaN at times) out of both.
        xs = torch.where(live, x.unsqueeze(1).expand(P, S, x.shape[1]).reshape(P * S, -1)[perm], 0)
        h = torch.where(live, gmm(xs, self.w13, offs=offs), 0)
        o = torch.where(live, gmm((F.silu(h[:, :Fh]) * h[:, Fh:]).contiguous(), self.w2, offs=offs), 0)
        pairs = torch.zeros_like(o).index_copy(0, perm, o).view(P, S, -1)
        return _SlotSum.apply(pairs, torch.where(slots < 0, 0.0, coef.float())).to(x.dtype)


class _SlotSum(torch.autograd.Function):
    """``sum_s coef[p, s] * rows[p, s]`` in fp32, slots in ascending order, keeping ``rows`` in
    its own dtype for the backward (autograd would keep the fp32 products, [P, S, H])."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        acc_dtype = torch.promote_types(rows.dtype, coef.dtype)
        acc = rows[:, 0].to(acc_dtype) * coef[:, :1]
        for s in range(1, rows.shape[1]):
            acc = acc + rows[:, s].to(acc_dtype) * coef[:, s:s + 1]
        ctx.save_for_backward(rows, coef)
        return acc

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        rows, coef = ctx.saved_tensors
        g_rows = g_coef = None
        if ctx.needs_input_grad[0]:
            g_rows = torch.stack([(grad * coef[:, s:s + 1]).to(rows.dtype) for s in range(rows.shape[1])], 1)
        if ctx.needs_input_grad[1]:
            g_coef = torch.stack([(grad * rows[:, s].to(grad.dtype)).sum(1) for s in range(rows.shape[1])], 1)
        return g_rows, g_coef


def route_tokens(x: torch.Tensor, gate: torch.Tensor, *, topk: int, score_func: str = "softmax",
                 num_groups: int = 0, topk_groups: int = 0, route_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The router of ``MoELayer``: scores of ``x @ gate.T`` in fp32 (softmax or sigmoid), the
    ``topk`` best experts (among the ``topk_groups`` best of ``num_groups`` groups, if given)
    and their scores as weights (sigmoid: normalised over the k), times ``route_scale``."""
    logits = F.linear(x.float(), gate)
    scores = logits.softmax(-1) if score_func == "softmax" else logits.sigmoid()
    choose = scores.detach()
    if num_groups:
        T, E = scores.shape
        grouped = choose.view(T, num_groups, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(-1) if score_func == "sigmoid" else grouped.amax(-1)
        keep = torch.zeros((T, num_groups), dtype=torch.bool, device=x.device)
        keep.scatter_(1, group_score.topk(topk_groups, dim=-1).indices, True)
        choose = choose.masked_fill(~keep.repeat_interleave(E // num_groups, dim=1), float("-inf"))
    idx = choose.topk(topk, dim=-1).indices
    w = scores.gather(1, idx)
    if score_func == "sigmoid":
        w = w / w.sum(-1, keepdim=True)
    return idx, w * route_scale


def _swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU of rows ``x`` [N, H] (or, batched over experts, [L, N, H] with w13 [L, H, 2F])."""
    h = x @ w13
    f = w2.shape[-2]
    return (F.silu(h[..., :f]) * h[..., f:]) @ w2


def _grouped_mm_ok(x: torch.Tensor, ffn_hidden: int) -> bool:
    """torch._grouped_mm's bfloat16 kernel: a CUDA GPU of compute capability 9.0 or more, and
    rows of 16-byte multiples."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (9, 0)
            and x.shape[1] % 8 == 0 and ffn_hidden % 8 == 0)
