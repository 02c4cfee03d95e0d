"""Train a small MoE transformer with expert parallelism over symmoe, on synthetic data.

    torchrun --standalone --nproc_per_node 2 examples/train_moe.py --config configs/train_host.yaml --steps 20

``--config`` picks the backend (and the protocol; ``--set protocol=pull`` overrides a key).
Each rank holds ``num_experts / world_size`` experts of every MoE layer; everything else is
replicated, and its gradients are summed over the ranks in rank order (all-gather, then a
fixed-order sum), so nothing in a step depends on timing. Every step's loss (the mean over
ranks) is printed with its exact bits; at the end rank 0 prints a SHA-256 digest of every
weight of the model (every rank's experts included) and, with ``--out``, writes both as JSON.

The claim this makes checkable: the loss curve and the final weights are bitwise identical
across backends, protocols and reruns at a given world size (deterministic expert
parallelism). tests/test_train_example.py runs it at W = 2 on the host backend.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from symmoe import Buffer
from symmoe.config import load, parse_key_value
from symmoe.launch import local_gpu, torchrun_group
from symmoe.nn import MoELayer


class Block(nn.Module):
    def __init__(self, buf: Buffer, args: argparse.Namespace, index: int):
        super().__init__()
        H = buf.config.buffer.hidden
        g = torch.Generator().manual_seed(args.seed * 7919 + index)
        self.qkv = nn.Parameter(torch.randn(H, 3 * H, generator=g) / math.sqrt(H))
        self.proj = nn.Parameter(torch.randn(H, H, generator=g) / math.sqrt(H))
        self.norm1, self.norm2 = nn.RMSNorm(H), nn.RMSNorm(H)
        self.moe = MoELayer(buf, args.ffn_hidden, score_func=args.score_func, shared_ffn_hidden=args.ffn_hidden,
                            num_worst_tokens="auto" if args.worst else 0, seed=args.seed * 31 + index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        q, k, v = (self.norm1(x) @ self.qkv).split(H, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True) @ self.proj
        h = self.moe(self.norm2(x).reshape(B * S, H).to(self.moe.buffer.dtype).contiguous())
        return x + h.to(x.dtype).view(B, S, H)


class Model(nn.Module):
    def __init__(self, buf: Buffer, args: argparse.Namespace):
        super().__init__()
        H = buf.config.buffer.hidden
        g = torch.Generator().manual_seed(args.seed)
        self.embed = nn.Parameter(torch.randn(args.vocab, H, generator=g) / math.sqrt(H))
        self.blocks = nn.ModuleList(Block(buf, args, i) for i in range(args.layers))
        self.norm = nn.RMSNorm(H)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed[tokens]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.T  # tied head

    def expert_parameters(self) -> set[int]:
        return {id(p) for b in self.blocks for p in b.moe.expert_parameters()}


def batch(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic sequences each rank draws for itself: every token is ``3 * previous + 1``
    modulo the vocabulary, with one token in eight random (a pattern the model can learn)."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + step * 1009 + rank)
    seq = torch.empty(args.batch, args.seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(args.vocab, (args.batch,), generator=g)
    for i in range(1, args.seq_len + 1):
        seq[:, i] = (3 * seq[:, i - 1] + 1) % args.vocab
    noise = torch.rand(seq.shape, generator=g) < 0.125
    seq = torch.where(noise, torch.randint(args.vocab, seq.shape, generator=g), seq)
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def rank_order_sum(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """The sum over ranks of ``t``, added in rank order: the same bits on every rank and run."""
    if world_size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    acc = parts[0].clone()
    for p in parts[1:]:
        acc += p
    return acc


def weights_digest(model: Model, world_size: int) -> str:
    """SHA-256 of every replicated weight, then every rank's expert weights in rank order."""
    h = hashlib.sha256()
    experts = model.expert_parameters()
    for name, p in model.named_parameters():
        if id(p) not in experts:
            h.update(name.encode() + p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    for name, p in model.named_parameters():
        if id(p) in experts:
            shards: list = [None] * world_size
            data = p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            if world_size > 1:
                dist.all_gather_object(shards, data)
            else:
                shards = [data]
            for r, s in enumerate(shards):
                h.update(f"{name}@{r}".encode() + s)
    return h.hexdigest()


def train(args: argparse.Namespace, rank: int, world_size: int) -> dict:
    cfg = load(args.config)
    if args.set:
        cfg = cfg.replace(**dict(args.set))
    torch.manual_seed(args.seed)
    device = torch.device("cpu") if cfg.backend == "host" else local_gpu(rank)
    tokens = args.batch * args.seq_len
    if tokens > cfg.buffer.max_tokens_per_rank:
        sys.exit(f"--batch {args.batch} x --seq-len {args.seq_len} = {tokens} tokens per rank; the config holds "
                 f"max_tokens_per_rank={cfg.buffer.max_tokens_per_rank}")
    losses = []
    with Buffer(None, cfg) as buf:
        model = Model(buf, args).to(device)
        experts = model.expert_parameters()
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, foreach=False)
        step_fn = torch.compile(model, fullgraph=True, backend=args.compile) if args.compile else model
        for step in range(args.steps):
            inputs, targets = batch(args, step, rank, device)
            logits = step_fn(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p in model.parameters():  # experts are this rank's own; the rest is replicated
                if id(p) not in experts and p.grad is not None:
                    p.grad = rank_order_sum(p.grad, world_size) / world_size
            opt.step()
            mean = rank_order_sum(loss.detach().float().cpu(), world_size) / world_size
            losses.append(mean.item())
            if rank == 0:
                print(f"step {step:4d} loss {mean.item():.6f} ({mean.item().hex()})", flush=True)
        digest = weights_digest(model, world_size)
        result = {"backend": cfg.backend, "protocol": buf.protocol, "world_size": world_size,
                  "losses": [v.hex() for v in losses], "weights_sha256": digest}
    if rank == 0:
        print(f"final weights sha256 {digest} ({cfg.backend}/{result['protocol']}, W={world_size})", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    if world_size > 1:
        dist.barrier()  # leave together: a rank exiting while gloo still serves a peer aborts
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/train_host.yaml", help="symmoe config: backend, protocol, sizes")
    p.add_argument("--set", action="append", type=parse_key_value, default=[], metavar="KEY=VALUE",
                   help="change one config key, e.g. --set protocol=pull (repeatable)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ffn-hidden", type=int, default=32)
    p.add_argument("--score-func", choices=("softmax", "sigmoid"), default="softmax")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worst", action="store_true", help="worst-case sizes through the symmoe custom ops")
    p.add_argument("--compile", metavar="BACKEND", help="torch.compile the model (fullgraph; implies --worst), "
                                                        "e.g. aot_eager or inductor")
    p.add_argument("--out", help="write the losses (exact, as hex floats) and the weights' digest here (rank 0)")
    args = p.parse_args(argv)
    args.worst = args.worst or bool(args.compile)
    return args


def main() -> None:
    args = parse_args()
    with torchrun_group() as (rank, world_size):
        train(args, rank, world_size)
    # Every result is written and the group destroyed. A library thread still joinable at
    # interpreter teardown aborted a compiled (aot_eager) run now and then ("terminate called
    # without an active exception"), failing a run that had finished: leave without teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
