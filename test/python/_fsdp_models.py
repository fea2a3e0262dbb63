"""Tiny models and data shared by the FSDP tests (imported by the spawned replicas too)."""
import math

import torch
import torch.nn as nn

WORLD = 4          # replica processes per test
BATCH = 8          # global batch: 2 rows per replica
SEQ, D_IN, D_OUT = 4, 8, 4


class Block(nn.Module):
    """A pre-norm transformer block: self-attention and a GELU MLP, both residual."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        # No bias: the key bias is a null direction of attention (softmax ignores a constant
        # shift), whose ~0 gradient Adam would amplify into noise-driven updates.
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    """Input projection, `layers` blocks, output head; a scaling buffer on the input."""

    def __init__(self, d=16, heads=2, layers=2):
        super().__init__()
        self.register_buffer("in_scale", torch.linspace(0.5, 1.5, D_IN))
        self.inp = nn.Linear(D_IN, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, D_OUT)

    def forward(self, x):
        return self.head(self.blocks(self.inp(x * self.in_scale)))


def transformer(seed=0, **kwargs):
    torch.manual_seed(seed)
    return TinyTransformer(**kwargs)


def mlp(width, layers, seed=0):
    """`layers` x (Linear(width, width), Tanh): parameter-heavy, tiny activations."""
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods)


def batches(steps, batch=BATCH, seq=SEQ):
    """`steps` (x, y) full batches, the same in every process."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, seq, D_IN, generator=g),
             torch.randn(batch, seq, D_OUT, generator=g)) for _ in range(steps)]


def local(t, rank, world=WORLD):
    """Replica `rank`'s rows of a full batch."""
    per = t.shape[0] // world
    return t[rank * per:(rank + 1) * per]
