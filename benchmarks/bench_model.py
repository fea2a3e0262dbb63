"""A small GPT for the benchmarks, and its sharding plans.

The fused qkv projection is laid out per head ([heads, 3, head_dim] on its output features), as
in Megatron-LM, so that sharding heads keeps each head's q, k and v on the same device.
Attention uses the usual [batch, heads, seq, head_dim] layout: torch.matmul of two 4-D tensors
is recorded as one op whose batch dims keep their own shardings.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    layers: int = 2
    dim: int = 64
    heads: int = 2
    seq: int = 32
    vocab: int = 64
    batch: int = 16


class Block(torch.nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.dim
        self.heads = cfg.heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        qkv = self.qkv(self.ln1(x)).view(b, s, h, 3, d // h)
        q, k, v = (qkv.select(3, i).transpose(1, 2) for i in range(3))  # [b, h, s, hd]
        att = (q @ k.transpose(-1, -2)) * (d // h) ** -0.5
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = torch.nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = torch.nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = torch.nn.LayerNorm(cfg.dim)
        self.head = torch.nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        if isinstance(self.blocks, torch.nn.ModuleList):
            for block in self.blocks:
                x = block(x)
        else:  # one module running every block (torch_spmd.distributed.pipeline.Pipeline)
            x = self.blocks(x)
        return self.head(self.ln(x))

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @staticmethod
    def used_in_backward(name: str) -> bool:
        """Whether the backward pass reads this parameter: linear weights (for the input
        gradient) and layer-norm weights and biases (native_layer_norm_backward takes both);
        not embeddings (their backward only scatters gradients) nor linear biases."""
        module = name.rsplit(".", 1)[0].split(".")[-1]
        if module in ("tok", "pos"):
            return False
        if module.startswith("ln"):
            return True
        return name.endswith("weight")


COLUMN = ("qkv", "fc1")   # output features sharded (Megatron column parallel)
ROW = ("proj", "fc2")     # input features sharded (row parallel)


def sharding_plan(strategy: str, model: GPT) -> dict:
    """Partition spec per parameter name (missing: replicated)."""
    plan = {}
    for name, p in model.named_parameters():
        layer = name.split(".")[-2] if name.count(".") >= 2 else name.split(".")[0]
        is_weight = name.endswith("weight")
        if strategy == "dp":
            continue
        if strategy == "fsdp":
            plan[name] = ("fsdp",) + (None,) * (p.dim() - 1)
        elif strategy == "megatron":
            if layer in COLUMN:
                plan[name] = ("model", None) if is_weight else ("model",)
            elif layer in ROW and is_weight:
                plan[name] = (None, "model")
        elif strategy == "2d":
            if layer in COLUMN:
                plan[name] = ("model", "fsdp") if is_weight else ("model",)
            elif layer in ROW:
                plan[name] = ("fsdp", "model") if is_weight else ("fsdp",)
            else:
                plan[name] = ("fsdp",) + (None,) * (p.dim() - 1)
    return plan


def spmd_train_step(model: GPT, opt, tokens: torch.Tensor, mesh, batch_axis) -> torch.Tensor:
    """One language-model training step on the spmd device: next-token targets from the host
    `tokens` ([batch, seq + 1]), the batch sharded over `batch_axis` (None: replicated), one
    optimizer step, then the step runs (mark_step). Returns the loss."""
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    dev = torch_spmd.device()
    x, y = tokens[:, :-1].to(dev), tokens[:, 1:].to(dev)
    if batch_axis:
        xs.mark_sharding(x, mesh, (batch_axis, None))
        xs.mark_sharding(y, mesh, (batch_axis, None))
    loss = model.loss(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    xm.mark_step()
    return loss
