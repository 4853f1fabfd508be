"""Pipeline parallelism with torch.distributed.pipelining: the GPT's blocks split into stages (one per
rank of a pipeline), the 1F1B schedule over microbatches, data parallel across pipelines (a gradient
all-reduce among the ranks of the same stage); bf16 autocast.

    emulator torchrun --cluster dgx-h100-ndr --nnodes 8 --nproc-per-node 8 configs/torch/pp_gpt.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class StagePart(nn.Module):
    """This rank's share of the GPT: the embedding on the first stage, its blocks, the head on the last."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq: int, first: bool, last: bool):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden) if first else None
        self.pos = nn.Embedding(seq, hidden) if first else None
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden) if last else None
        self.head = nn.Linear(hidden, vocab, bias=False) if last else None

    def forward(self, x):
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for block in self.blocks:
                x = block(x)
        if self.head is not None:
            x = self.head(self.ln(x)).float()
        return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--pp", type=int, default=8, help="pipeline stages")
    args = p.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // args.pp
    # pipelines are consecutive blocks of ranks in separate nodes' GPUs: rank = stage * replicas + replica
    stage, replica = rank // replicas, rank % replicas
    pp_group = None
    for r in range(replicas):
        g = dist.new_group([s * replicas + r for s in range(args.pp)])
        if r == replica:
            pp_group = g
    dp_group = None
    for s in range(args.pp):
        g = dist.new_group([s * replicas + r for r in range(replicas)])
        if s == stage:
            dp_group = g

    part = StagePart(args.vocab, args.hidden, args.heads, args.layers // args.pp, args.seq,
                     stage == 0, stage == args.pp - 1).to(device)
    # the shapes each stage receives and sends, given up front (torch infers them otherwise by
    # exchanging Python objects between stages before the first step)
    first, last = stage == 0, stage == args.pp - 1
    shape = (args.micro_batch, args.seq)
    inputs = torch.empty(shape, dtype=torch.long, device="meta") if first else torch.empty(
        (*shape, args.hidden), device="meta")
    outputs = torch.empty((*shape, args.vocab), device="meta") if last else torch.empty(
        (*shape, args.hidden), device="meta")
    grads_in = None if first else (torch.empty_like(inputs),)  # what this stage sends back
    grads_out = None if last else (torch.empty_like(outputs),)  # what it receives from the next
    pipe = PipelineStage(part, stage, args.pp, device, input_args=(inputs,), output_args=(outputs,),
                         input_grads=grads_in, output_grads=grads_out, group=pp_group)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.view(-1, args.vocab), target.reshape(-1))

    schedule = Schedule1F1B(pipe, n_microbatches=args.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(part.parameters(), lr=3e-4)
    batch = args.micro_batch * args.microbatches
    for _ in range(args.iters):
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), device=device)
        if stage == 0:
            schedule.step(tokens[:, :-1])
        elif stage == args.pp - 1:
            schedule.step(target=tokens[:, 1:])
        else:
            schedule.step()
        if replicas > 1:
            for param in part.parameters():
                dist.all_reduce(param.grad, group=dp_group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
