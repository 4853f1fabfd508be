"""2-D parallelism: tensor parallelism with DTensor inside a node, FSDP2 (fully_shard) across nodes, on
a 2-D DeviceMesh (dp x tp); bf16 parameters for compute, fp32 gradient reduction.

    emulator torchrun --cluster dgx-h100-ndr --nnodes 8 --nproc-per-node 8 configs/torch/fsdp_tp_gpt.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


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
        # under tensor parallelism qkv holds this rank's heads only: -1 finds how many
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, -1, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--tp", type=int, default=8, help="tensor-parallel size (inside a node)")
    args = p.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = GPT(args.vocab, args.hidden, args.heads, args.layers, args.seq)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {
            "qkv": ColwiseParallel(), "proj": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel(),
        })
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    model.to_empty(device="cuda")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    for _ in range(args.iters):
        tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), device="cuda")
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
