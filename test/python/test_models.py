"""End-to-end training on the spmd device against CPU eager: the same model (identical initial
weights), the same batches and the same optimizer, step by step. Every step's loss and the final
weights must agree, and after warm-up every step must hit the compile cache (a steady-state
training step recompiles nothing)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_spmd
from torch_spmd.debug import metrics

from helpers import DEV

RTOL = 1e-4
ATOL = 1e-5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                                 nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=1, padding=1, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


class TinyLM(nn.Module):
    def __init__(self, vocab=17, d=16, heads=2, layers=2, seq=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.1)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, heads, dim_feedforward=32, dropout=0.0, batch_first=True)
            for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        s = tokens.shape[1]
        causal = torch.triu(torch.full((s, s), float("-inf"), device=tokens.device), diagonal=1)
        h = self.embed(tokens) + self.pos[:s]
        for layer in self.layers:
            h = layer(h, src_mask=causal)
        return self.head(self.norm(h))


def lm_loss(logits, tokens):
    # next-token prediction
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def make_batches(kind, steps, gen):
    if kind == "mlp":
        return [(torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen))
                for _ in range(steps)]
    if kind == "cnn":
        return [(torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 10, (8,), generator=gen))
                for _ in range(steps)]
    tokens = [torch.randint(0, 17, (4, 8), generator=gen) for _ in range(steps)]
    return [(t, t) for t in tokens]


MODELS = {"mlp": MLP, "cnn": CNN, "lm": TinyLM}


def compute_loss(kind, model, x, y):
    out = model(x)
    return lm_loss(out, y) if kind == "lm" else F.cross_entropy(out, y)


def train(kind, model, make_opt, batches, device):
    """Trains `model` in place on `device`; returns the per-step losses and, on the spmd device,
    the (UncachedCompile, CachedCompile) counters after each step. Attention takes the same
    implementation on both (the fused CPU kernel: csrc/aten/attention.cc), so the attention key
    bias, whose gradient is zero in exact arithmetic, gets the same rounding noise on both (Adam
    turns any difference into +-lr steps)."""
    opt = make_opt(model.parameters())
    losses, compiles = [], []
    model.train()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = compute_loss(kind, model, x, y)
        loss.backward()
        opt.step()
        if device == DEV:
            torch_spmd.sync()
            compiles.append((metrics.counter_value("UncachedCompile") or 0,
                             metrics.counter_value("CachedCompile") or 0))
        losses.append(loss.item())
    return losses, compiles


def assert_models_match(dev_model, cpu_model):
    dev_state, cpu_state = dev_model.state_dict(), cpu_model.state_dict()
    assert dev_state.keys() == cpu_state.keys()
    for name, ref in cpu_state.items():
        got = dev_state[name]
        assert got.device == DEV, name
        torch.testing.assert_close(got.cpu(), ref, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def run_differential(kind, make_opt, steps, seed=0):
    torch.manual_seed(seed)
    cpu_model = MODELS[kind]()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    batches = make_batches(kind, steps, torch.Generator().manual_seed(seed + 1))
    cpu_losses, _ = train(kind, cpu_model, make_opt, batches, torch.device("cpu"))
    dev_losses, compiles = train(kind, dev_model, make_opt, batches, DEV)
    for step, (d, c) in enumerate(zip(dev_losses, cpu_losses)):
        assert d == pytest.approx(c, rel=RTOL, abs=ATOL), f"step {step}: loss {d} != {c}"
    assert_models_match(dev_model, cpu_model)
    return cpu_losses, compiles


@pytest.mark.parametrize("kind", ["mlp", "cnn", "lm"])
def test_train_adam_matches_cpu_and_stops_compiling(kind):
    steps = 20
    losses, compiles = run_differential(kind, lambda p: torch.optim.Adam(p, lr=1e-2), steps)
    assert losses[-1] < losses[0], f"did not learn: {losses[0]} -> {losses[-1]}"
    # Steady state: the last steps compile nothing new and hit the cache every time.
    tail = compiles[-10:]
    uncached = [u for u, _ in tail]
    cached = [c for _, c in tail]
    assert len(set(uncached)) == 1, f"still compiling in the last 10 steps: {compiles}"
    assert all(b > a for a, b in zip(cached, cached[1:])), f"cache not hit every step: {compiles}"
    assert uncached[0] - (compiles[0][0] - 1) <= 4, f"too many distinct graphs: {compiles}"


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_train_other_optimizers(opt):
    make = {
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                  weight_decay=1e-3),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    }[opt]
    run_differential("mlp", make, steps=5)
    run_differential("cnn", make, steps=3)


def test_batchnorm_running_stats_and_eval_mode():
    torch.manual_seed(3)
    cpu_model = CNN()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    gen = torch.Generator().manual_seed(4)
    for x, y in make_batches("cnn", 3, gen):
        for m, d in ((cpu_model, "cpu"), (dev_model, DEV)):
            compute_loss("cnn", m, x.to(d), y.to(d)).backward()
    torch_spmd.sync()
    assert_models_match(dev_model, cpu_model)   # running_mean/var, num_batches_tracked
    assert int(dev_model.bn1.num_batches_tracked.item()) == 3
    x = torch.randn(4, 3, 8, 8, generator=gen)
    cpu_model.eval()
    dev_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(dev_model(x.to(DEV)).cpu(), cpu_model(x), rtol=RTOL, atol=ATOL)


def test_grad_clipping_and_accumulation():
    """clip_grad_norm_ (in-place through detach) and gradient accumulation over micro-batches."""
    torch.manual_seed(5)
    cpu_model = MLP()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    batches = make_batches("mlp", 4, torch.Generator().manual_seed(6))
    for m, d in ((cpu_model, torch.device("cpu")), (dev_model, DEV)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(0, 4, 2):
            opt.zero_grad(set_to_none=False)
            for x, y in batches[i:i + 2]:
                (compute_loss("mlp", m, x.to(d), y.to(d)) / 2).backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
            if d == DEV:
                torch_spmd.sync()
        assert float(norm) > 0
    assert_models_match(dev_model, cpu_model)


def test_lr_schedule_changes_values_not_graphs():
    """Python float hyper-parameters (the learning rate from a scheduler) are run-time scalars:
    a new value each step reuses the compiled graph."""
    def make(params):
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.5)
        make.sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + 0.37 * step))
        return opt

    torch.manual_seed(7)
    cpu_model = MLP()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    batches = make_batches("mlp", 8, torch.Generator().manual_seed(8))
    results = {}
    for model, device in ((cpu_model, torch.device("cpu")), (dev_model, DEV)):
        opt = make(model.parameters())
        losses, compiles = [], []
        for x, y in batches:
            opt.zero_grad()
            loss = compute_loss("mlp", model, x.to(device), y.to(device))
            loss.backward()
            opt.step()
            make.sched.step()
            if device == DEV:
                torch_spmd.sync()
                compiles.append(metrics.counter_value("UncachedCompile"))
            losses.append(loss.item())
        results[device.type] = (losses, compiles)
    torch.testing.assert_close(results[DEV.type][0], results["cpu"][0], rtol=RTOL, atol=ATOL)
    assert_models_match(dev_model, cpu_model)
    compiles = results[DEV.type][1]
    assert compiles[-1] == compiles[2], f"the changing learning rate recompiled: {compiles}"


@pytest.mark.parametrize("kind", ["mlp", "cnn", "lm"])
def test_training_memory_is_steady_and_released(kind):
    """Device memory stays flat across steps (no buffer is pinned by a pending functionalization
    update or by the compile cache) and is all released when the model goes away."""
    import gc
    from torch_spmd import _C
    gc.collect()
    torch_spmd.sync()
    base_bytes = _C._memory_info(0)["bytes_used"]
    base_live = _C._live_tensor_count()
    torch.manual_seed(0)
    model = MODELS[kind]().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    usage = []
    for x, y in make_batches(kind, 6, torch.Generator().manual_seed(1)):
        opt.zero_grad()
        compute_loss(kind, model, x.to(DEV), y.to(DEV)).backward()
        opt.step()
        torch_spmd.sync()
        usage.append((_C._memory_info(0)["bytes_used"], _C._live_tensor_count()))
    assert len(set(usage[2:])) == 1, f"device memory grows: {usage}"
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(t.numel() * t.element_size() for s in opt.state.values()
                       for t in s.values() if torch.is_tensor(t) and t.device == DEV)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert usage[-1][0] - base_bytes <= state_bytes + grad_bytes, (usage, state_bytes, grad_bytes)
    del model, opt
    gc.collect()
    torch_spmd.sync()
    assert _C._memory_info(0)["bytes_used"] == base_bytes
    assert _C._live_tensor_count() == base_live
