"""Models for the plan-mode studies (benchmarks/plan.py), written out here so the benchmark
needs nothing beyond torch: a Hugging Face-layout GPT-2 (Conv1D weights stored [in, out], tied
input/output embeddings), a Llama-style decoder (RMSNorm, grouped-query attention, SwiGLU; with
`experts`, Mixtral-style top-k mixture-of-experts SwiGLU), and ResNet-50 (torchvision's layout:
bottleneck blocks [3, 4, 6, 3], batch norm)."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


def causal_attention(q, k, v):
    """[b, h, s, hd] each; explicit matmuls so every op has a sharding rule."""
    s, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-1, -2)) * hd ** -0.5
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


# ---------------------------------------------------------------------------------------------
# GPT-2, Hugging Face layout


class Conv1D(nn.Module):
    """transformers' Conv1D: a linear layer whose weight is stored [in, out]."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


@dataclass
class GPT2Config:
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    n_positions: int = 1024
    vocab_size: int = 50257
    batch: int = 8
    seq: int = 1024


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(4 * d, d)
        self.mlp_proj = Conv1D(d, 4 * d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied lm_head

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------
# Llama


@dataclass
class LlamaConfig:
    layers: int = 80
    dim: int = 8192
    heads: int = 64
    kv_heads: int = 8
    ffn: int = 28672
    vocab: int = 32000
    batch: int = 256
    seq: int = 4096
    experts: int = 0  # > 0: each block's SwiGLU is a mixture of this many experts (Mixtral)
    top_k: int = 2
    sdpa: bool = False  # attention by F.scaled_dot_product_attention (fused) instead of matmuls


class MoE(nn.Module):
    """Top-k mixture of SwiGLU experts with a capacity, as GShard and MaxText's dropping
    implementation write it: tokens in groups of `group`; each expert takes at most `cap` of a
    group's tokens (the rest are dropped); dispatch and combine are dense one-hot einsums, so
    every op is a matmul or elementwise (expert weights [experts, in, out])."""

    def __init__(self, d: int, f: int, experts: int, top_k: int, group: int = 1024,
                 capacity_factor: float = 1.25):
        super().__init__()
        self.experts, self.top_k, self.group = experts, top_k, group
        self.cap = int(group * top_k / experts * capacity_factor)
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, f) * d ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, d, f) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, f, d) * f ** -0.5)

    def forward(self, x):
        b, s, d = x.shape
        g = x.reshape(-1, min(self.group, b * s), d)                       # [G, S, D]
        probs = self.router(g).float().softmax(-1)                          # [G, S, E]
        idx = probs.topk(self.top_k, dim=-1).indices                        # [G, S, k]
        experts = torch.arange(self.experts, device=x.device)
        chosen = (idx.unsqueeze(-1) == experts).to(probs.dtype).sum(2)      # [G, S, E] 0/1
        slot = (chosen.cumsum(1) - 1) * chosen              # the token's place in its expert
        kept = chosen * (slot < self.cap).to(chosen.dtype)
        places = torch.arange(self.cap, device=x.device)
        dispatch = (slot.unsqueeze(-1) == places).to(x.dtype) * kept.unsqueeze(-1).to(x.dtype)
        combine = dispatch * (probs * kept).unsqueeze(-1).to(x.dtype)      # [G, S, E, C]
        xin = torch.einsum("gsec,gsd->egcd", dispatch, g)
        h = F.silu(torch.einsum("egcd,edf->egcf", xin, self.w1)) * \
            torch.einsum("egcd,edf->egcf", xin, self.w3)
        out = torch.einsum("egcf,efd->egcd", h, self.w2)
        return torch.einsum("gsec,egcd->gsd", combine, out).reshape(b, s, d)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        hd = cfg.dim // cfg.heads
        self.heads, self.kv_heads, self.hd = cfg.heads, cfg.kv_heads, hd
        self.sdpa = cfg.sdpa
        self.attention_norm = RMSNorm(cfg.dim)
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim)
        if cfg.experts:
            self.moe = MoE(cfg.dim, cfg.ffn, cfg.experts, cfg.top_k)
        else:
            self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
            self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
            self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads

        def kv(t):  # [b, kvh, s, hd] -> [b, h, s, hd], each kv head serving `rep` q heads
            t = t.view(b, s, self.kv_heads, 1, self.hd).expand(b, s, self.kv_heads, rep, self.hd)
            return t.reshape(b, s, self.heads, self.hd).transpose(1, 2)

        if self.sdpa:  # grouped-query attention in the kernel: the kv heads stay few
            k = self.wk(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
            v = self.wv(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = causal_attention(q, kv(self.wk(h)), kv(self.wv(h)))
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        if hasattr(self, "moe"):
            return x + self.moe(h)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx):
        x = self.tok_embeddings(idx)
        if isinstance(self.layers, nn.ModuleList):
            for layer in self.layers:
                x = layer(x)
        else:  # one module running every block (torch_spmd.distributed.pipeline.Pipeline)
            x = self.layers(x)
        return self.output(self.norm(x))


# ---------------------------------------------------------------------------------------------
# ResNet-50


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + idt)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, inplanes = [], 64
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
