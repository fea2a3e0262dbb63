"""Parallelism patterns fall out of a few annotations (GSPMD §4.3): the exact collectives of each
step are asserted from last_step_stats(), and every number is compared with the same model
trained eagerly on CPU.

Conventions worth knowing when reading the expectations:
- no partial sum leaves a step (GSPMD): a step's outputs are complete, so a backward step whose
  gradients are outputs all-reduces them over the batch axes there (or reduce-scatters them
  onto a sharded parameter's tiling), and a loss that sums a sharded batch is all-reduced (one
  scalar) in the step that returns it;
- within one step a value resharded once is reused (reshard cache), so a weight gathered for
  the forward pass is not gathered again in a backward pass recorded into the same step.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_spmd
import torch_spmd.distributed.spmd as xs
from spmd_diff import (assert_same, check, collectives, constrain, dev, ensure_devices, mesh_of,
                       poison_padding, step, to_device)


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def kinds(stats):
    return [(c["kind"], tuple(c["axes"])) for c in stats["collectives"]]


def assert_params_close(dev_model, cpu_model, what="param", grads=False):
    for (name, p), q in zip(dev_model.named_parameters(), cpu_model.parameters()):
        assert_same(p.detach().cpu(), q.detach(), f"{what} {name}")
        if grads:
            assert_same(p.grad.cpu(), q.grad, f"grad {name}")


# ---------------------------------------------------------------------------------------------
# Megatron tensor parallelism


class MLPBlock(torch.nn.Module):
    """An embedding (replicated, trained) feeding a Megatron MLP: its input gradient is consumed
    in the same backward step (by the embedding's backward)."""

    def __init__(self, vocab=20, d=16, ff=64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.l1 = torch.nn.Linear(d, ff)
        self.l2 = torch.nn.Linear(ff, d)

    def forward(self, idx):
        return self.l2(F.gelu(self.l1(self.emb(idx))))


def megatron(mesh, seed=0):
    torch.manual_seed(seed)
    cpu = MLPBlock().double()
    model = copy.deepcopy(cpu).to(dev())
    # nn.Linear weights are [out, in]: column-parallel = P('model', None), row-parallel =
    # P(None, 'model').
    xs.mark_sharding(model.l1.weight, mesh, ("model", None))
    xs.mark_sharding(model.l1.bias, mesh, ("model",))
    xs.mark_sharding(model.l2.weight, mesh, (None, "model"))
    return cpu, model


@pytest.mark.parametrize("mesh_shape,idx_spec", [((8,), None), ((4, 2), ("data", None)),
                                                 ((2, 4), ("data", None))])
def test_megatron_mlp_one_all_reduce_forward_one_backward(mesh_shape, idx_spec):
    mesh = mesh_of(mesh_shape, names=("model",) if len(mesh_shape) == 1 else None)
    cpu, model = megatron(mesh)
    idx = torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(1))
    idx_d = to_device(idx, mesh, idx_spec)
    step([])

    out = model(idx_d)
    loss = out.pow(2).mean()
    fwd = step([loss])
    # The row-parallel layer's partial sum over 'model'; with the batch on 'data', the loss (a
    # mean over it) is all-reduced too: one scalar.
    loss_reduction = [] if idx_spec is None else [("all-reduce", ("data",))]
    assert kinds(fwd) == [("all-reduce", ("model",))] + loss_reduction, kinds(fwd)
    assert not fwd["replicated_fallback_ops"]

    loss.backward()
    bwd = step([p.grad for p in model.parameters()])
    # dX = dH @ W1 contracts over the 'model'-sharded hidden dim: the only 'model' collective.
    # With the batch on 'data', every weight gradient is a sum over the batch: all-reduced over
    # 'data' once, in this step (a step output is complete).
    got = kinds(bwd)
    assert got.count(("all-reduce", ("model",))) == 1, got
    data = [k for k in got if k != ("all-reduce", ("model",))]
    if idx_spec is None:
        assert data == [], got
    else:
        assert all(k == ("all-reduce", ("data",)) for k in data), got
        assert len(data) == len(list(model.parameters())), got
    assert not bwd["replicated_fallback_ops"]
    for c in fwd["collectives"] + bwd["collectives"]:
        assert c["kind"] != "all-gather", "a sharded weight was gathered"

    ref = cpu(idx).pow(2).mean()
    ref.backward()
    assert_same(loss.detach().cpu(), ref.detach(), "loss")
    assert_params_close(model, cpu, grads=True)


def test_megatron_training_step_in_one_graph():
    # Forward, backward and SGD in one step on a (data, model) mesh: the two 'model'
    # all-reduces of Megatron plus one 'data' all-reduce per parameter (its data-parallel
    # gradient sync, on the parameter's local shard) and nothing else.
    mesh = mesh_of((4, 2))
    cpu, model = megatron(mesh)
    idx = torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(1))
    idx_d = to_device(idx, mesh, ("data", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    step([])
    for it in range(2):
        opt.zero_grad()
        model(idx_d).pow(2).mean().backward()
        opt.step()
        stats = step(list(model.parameters()))
        opt_cpu.zero_grad()
        cpu(idx).pow(2).mean().backward()
        opt_cpu.step()
        got = kinds(stats)
        assert got.count(("all-reduce", ("model",))) == 2, got
        assert got.count(("all-reduce", ("data",))) == len(list(model.parameters())), got
        assert len(got) == 2 + len(list(model.parameters())), got
        # The sharded weights' gradient syncs move only their local shard.
        by_bytes = sorted(c["bytes"] for c in stats["collectives"] if c["axes"] == ["data"])
        assert max(by_bytes) == 64 * 16 * 8 // 2, by_bytes
    assert_params_close(model, cpu)


class TransformerLayer(torch.nn.Module):
    """Pre-norm attention (q, k, v, o) and MLP (fc1, fc2), as Megatron-LM's layer."""

    def __init__(self, d=32, heads=8):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


@pytest.mark.parametrize("recompute", [False, True])
def test_megatron_layers_all_reduce_four_times_per_layer(recompute):
    # Per layer, Megatron-LM all-reduces over the tensor-parallel group twice in the forward
    # (after o and fc2) and twice in the backward (the input gradients of q, k, v together and
    # of fc1): the three column-parallel projections reading one input have their
    # input-gradient partial sums added before one all-reduce, not one each. With full
    # activation checkpointing the recomputed forward all-reduces after o once more; its fc2
    # all-reduce produces the layer's output, which no gradient reads: dead code, dropped (as
    # XLA drops it; Megatron's eager recomputation runs it): 5 per layer.
    from torch.utils.checkpoint import checkpoint
    mesh = mesh_of((8,), names=("model",))
    torch.manual_seed(0)
    layers = 2
    cpu = torch.nn.Sequential(*(TransformerLayer() for _ in range(layers))).double()
    model = copy.deepcopy(cpu).to(dev())
    for layer in model:
        for m in (layer.q, layer.k, layer.v, layer.fc1):
            xs.mark_sharding(m.weight, mesh, ("model", None))
            xs.mark_sharding(m.bias, mesh, ("model",))
        for m in (layer.o, layer.fc2):
            xs.mark_sharding(m.weight, mesh, (None, "model"))

    def run(net, x):
        for layer in net:
            x = checkpoint(layer, x, use_reentrant=False) if recompute else layer(x)
        return x.pow(2).mean()

    x = torch.randn(4, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    step([])
    loss = run(model, x.to(dev()))
    loss.backward()
    stats = step([loss] + [p.grad for p in model.parameters()])
    got = kinds(stats)
    assert got.count(("all-reduce", ("model",))) == layers * (5 if recompute else 4), got
    assert len(got) == got.count(("all-reduce", ("model",))), got
    ref = run(cpu, x)
    ref.backward()
    assert_same(loss.detach().cpu(), ref.detach(), "loss")
    assert_params_close(model, cpu, grads=True)


def test_megatron_sequence_parallel_output_is_reduce_scattered():
    # Annotating the MLP output sharded over 'model' turns the all-reduce into a reduce-scatter.
    mesh = mesh_of((8,), names=("model",))
    cpu, model = megatron(mesh)
    idx = torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(1))

    def fn(idx):
        out = model(idx) if torch_spmd.is_spmd_tensor(idx) else cpu(idx)
        return constrain(out, ("model", None, None)).tanh()

    r = check(fn, [idx], [None], mesh)
    assert r.fwd == [("reduce-scatter", ("model",))]


class SequenceParallelBlock(torch.nn.Module):
    """A pre-norm residual Megatron MLP block as Megatron-LM's sequence parallelism runs it
    (Korthikanti et al. 2022): the residual stream and the layer norm split over the sequence by
    the tensor-parallel group, the MLP's hidden over its features."""

    def __init__(self, d=16, ff=64):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.l1 = torch.nn.Linear(d, ff)
        self.l2 = torch.nn.Linear(ff, d)
        self.mesh = None  # on the device: the residual stream's sequence over its 'model' axis

    def forward(self, x):
        y = x + self.l2(F.gelu(self.l1(self.norm(x))))
        if self.mesh is not None:
            xs.mark_sharding(y, self.mesh, (None, "model", None))
        return y


def test_megatron_sequence_parallel_block_moves_activations_by_gathers_and_scatters():
    # Where tensor parallelism all-reduces the block's output (and its input gradient),
    # sequence parallelism all-gathers the normed stream before the column-parallel layer and
    # reduce-scatters the row-parallel layer's partial sums back onto sequence shards; only the
    # loss and the gradients of the parameters every shard shares (norm, output bias) are
    # all-reduced. Gradients equal CPU eager's. (The input's sequence sharding alone gives this
    # layout; the constraint on the output, as benchmarks/plan_fidelity.py annotates the stream,
    # keeps it whatever the next block does. A replicated input gives tensor parallelism's
    # all-reduce instead.)
    mesh = mesh_of((8,), names=("model",))
    torch.manual_seed(0)
    cpu = SequenceParallelBlock().double()
    model = copy.deepcopy(cpu).to(dev())
    model.mesh = mesh
    xs.mark_sharding(model.l1.weight, mesh, ("model", None))
    xs.mark_sharding(model.l1.bias, mesh, ("model",))
    xs.mark_sharding(model.l2.weight, mesh, (None, "model"))
    x = torch.randn(2, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_d = to_device(x, mesh, (None, "model", None)).requires_grad_()
    step([])

    loss = model(x_d).pow(2).mean()
    fwd = step([loss])
    assert sorted(kinds(fwd)) == [("all-gather", ("model",)), ("all-reduce", ("model",)),
                                  ("reduce-scatter", ("model",))], kinds(fwd)
    loss_reduce = [c for c in fwd["collectives"] if c["kind"] == "all-reduce"]
    assert loss_reduce[0]["bytes"] == 8, loss_reduce  # the scalar loss, not an activation
    loss.backward()
    bwd = step([x_d.grad] + [p.grad for p in model.parameters()])
    got = kinds(bwd)
    assert ("reduce-scatter", ("model",)) in got and ("all-gather", ("model",)) in got, got
    shared = {p.numel() * 8 for p in (model.norm.weight, model.norm.bias, model.l2.bias)}
    for c in bwd["collectives"]:
        if c["kind"] == "all-reduce":  # a shared parameter's gradient, never an activation
            assert c["bytes"] in shared, c
    assert not fwd["replicated_fallback_ops"] and not bwd["replicated_fallback_ops"]

    x_cpu = x.clone().requires_grad_()
    ref = cpu(x_cpu).pow(2).mean()
    ref.backward()
    assert_same(loss.detach().cpu(), ref.detach(), "loss")
    assert_same(x_d.grad.cpu(), x_cpu.grad, "input grad")
    assert_params_close(model, cpu, grads=True)


# ---------------------------------------------------------------------------------------------
# Data parallelism


def dp_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 8)).double()


@pytest.mark.parametrize("mesh_shape,names,batch_spec", [
    ((8,), ("data",), ("data", None)),
    ((4, 2), ("data", "other"), ("data", None)),         # batch over 4, replicated over 2
    ((4, 2), ("data", "other"), (("data", "other"), None)),  # batch over both axes
])
def test_data_parallel_one_all_reduce_per_gradient(mesh_shape, names, batch_spec):
    mesh = mesh_of(mesh_shape, names=names)
    cpu = dp_model()
    model = copy.deepcopy(cpu).to(dev())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(64, 16, generator=g, dtype=torch.float64), torch.randn(64, 8, generator=g, dtype=torch.float64)
    xd, yd = to_device(x, mesh, batch_spec), to_device(y, mesh, batch_spec)
    batch_axes = batch_spec[0] if isinstance(batch_spec[0], tuple) else (batch_spec[0],)
    step([])
    for it in range(3):
        opt.zero_grad()
        loss = F.mse_loss(model(xd), yd)
        loss.backward()
        opt.step()
        stats = step(list(model.parameters()) + [loss])
        # One all-reduce per gradient, and one of the loss (a float64 scalar), all in the step.
        assert kinds(stats) == [("all-reduce", batch_axes)] * (len(list(model.parameters())) + 1), \
            kinds(stats)
        assert not stats["replicated_fallback_ops"]
        param_bytes = sorted([p.numel() * 8 for p in model.parameters()] + [8])
        assert sorted(c["bytes"] for c in stats["collectives"]) == param_bytes

        opt_cpu.zero_grad()
        ref = F.mse_loss(cpu(x), y)
        ref.backward()
        opt_cpu.step()
        assert_same(loss.detach().cpu(), ref.detach(), f"loss {it}")
    assert_params_close(model, cpu)


def test_data_parallel_cross_entropy_adds_one_total_weight_all_reduce():
    # nll_loss's mean divides by the total weight of the non-ignored targets, which the whole
    # batch contributes to: it is all-reduced (one f32 scalar, 4 bytes) so that every device
    # divides by the same number; the loss itself (another scalar) is all-reduced when the step
    # hands it back. Everything else is as with MSE.
    mesh = mesh_of((8,), names=("data",))
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    model = copy.deepcopy(cpu).to(dev())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 16, generator=g)
    t = torch.randint(0, 5, (64,), generator=g)
    t[::7] = -100  # ignored targets change the total weight
    xd, td = to_device(x, mesh, ("data", None)), to_device(t, mesh, ("data",))
    step([])
    opt.zero_grad()
    loss = F.cross_entropy(model(xd), td)
    loss.backward()
    opt.step()
    stats = step(list(model.parameters()) + [loss])
    got = [(c["kind"], tuple(c["axes"]), c["bytes"]) for c in stats["collectives"]]
    scalars = [c for c in got if c[2] == 4]
    assert scalars == [("all-reduce", ("data",), 4)] * 2, got
    rest = sorted(c[2] for c in got if c[2] != 4)
    assert rest == sorted(p.numel() * 4 for p in model.parameters()), got
    assert all(c[:2] == ("all-reduce", ("data",)) for c in got)

    opt_cpu.zero_grad()
    ref = F.cross_entropy(cpu(x), t)
    ref.backward()
    opt_cpu.step()
    assert_same(loss.detach().cpu(), ref.detach(), "loss", rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert_same(p.detach().cpu(), q.detach(), "param", rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# FSDP (ZeRO-3 style): parameters and batch sharded over one axis


def test_fsdp_gathers_params_and_reduce_scatters_gradients():
    mesh = mesh_of((8,), names=("fsdp",))
    cpu = dp_model()
    model = copy.deepcopy(cpu).to(dev())
    for p in model.parameters():
        xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    # Activations [128, 32] are larger than any weight: the batch keeps its sharding and the
    # weights move.
    x, y = torch.randn(128, 16, generator=g, dtype=torch.float64), torch.randn(128, 8, generator=g, dtype=torch.float64)
    xd, yd = to_device(x, mesh, ("fsdp", None)), to_device(y, mesh, ("fsdp", None))
    params = list(model.parameters())
    local_bytes = {p.numel() * 8 // 8 for p in params}
    step([])
    for it in range(2):
        opt.zero_grad()
        loss = F.mse_loss(model(xd), yd)
        fwd = step([loss])
        # Forward: every parameter all-gathered once (its local shard's bytes), then the loss
        # (a float64 scalar summed over the sharded batch) all-reduced.
        assert kinds(fwd) == [("all-gather", ("fsdp",))] * len(params) + [("all-reduce", ("fsdp",))], \
            kinds(fwd)
        assert sorted(c["bytes"] for c in fwd["collectives"]) == sorted([p.numel() for p in params] + [8])

        loss.backward()
        opt.step()
        bwd = step(params)
        got = kinds(bwd)
        # Backward: the weights needed for input gradients (every Linear but the first, whose
        # input needs none) are gathered again; every gradient is reduce-scattered onto its
        # parameter's shard; no all-reduce at all.
        gathers = [c for c in bwd["collectives"] if c["kind"] == "all-gather"]
        assert sorted(c["bytes"] for c in gathers) == sorted([model[2].weight.numel(), model[4].weight.numel()])
        assert got.count(("reduce-scatter", ("fsdp",))) == len(params), got
        assert len(got) == len(params) + 2, got
        assert all(c["kind"] != "all-reduce" for c in bwd["collectives"])
        for c in bwd["collectives"]:
            if c["kind"] == "reduce-scatter":
                assert c["bytes"] in {p.numel() * 8 for p in params}
        assert local_bytes

        opt_cpu.zero_grad()
        ref = F.mse_loss(cpu(x), y)
        ref.backward()
        opt_cpu.step()
        assert_same(loss.detach().cpu(), ref.detach(), f"loss {it}")
    assert_params_close(model, cpu)
    for p in model.parameters():
        assert torch_spmd._C._get_sharding_spec(p).startswith("{devices=[8"), "parameter lost its sharding"


# ---------------------------------------------------------------------------------------------
# Resharding and padding


@pytest.mark.parametrize("mesh_shape", [(8,), (4, 2), (2, 2, 2)])
def test_transpose_of_sharding_is_one_all_to_all(mesh_shape):
    names = ("model",) if len(mesh_shape) == 1 else ("data", "model") if len(mesh_shape) == 2 else ("a", "model", "c")
    mesh = mesh_of(mesh_shape, names=names)

    def fn(x):
        y = constrain(x * 2, ("model", None))
        return constrain(y + 1, (None, "model"))

    for shape in [(16, 8), (10, 6), (3, 5)]:
        r = check(fn, [torch.randn(*shape, dtype=torch.float64)], [("model", None)], mesh, grad=True)
        assert r.fwd == [("all-to-all", ("model",))], (shape, r.fwd)
        assert r.bwd == [], (shape, r.bwd)  # constraints are not recorded by autograd


@pytest.mark.parametrize("spec", [("data", None), (("data", "model"), None), ("data", "model")])
def test_sum_over_uneven_shards_masks_garbage_padding(spec):
    # 10 rows over 4 (or 8): the padded tail of the last shards is computed from padding. With
    # log of a zero-padded upload it holds -inf; with a poisoned upload, NaN. The sum (and
    # mean, max, a contraction) must still be exact.
    mesh = mesh_of((4, 2))
    x = torch.rand(10, 6, dtype=torch.float64) + 0.5
    for poison in (False, True):
        for fn in [lambda a: a.log().sum(0), lambda a: a.log().sum(), lambda a: a.log().mean(0),
                   lambda a: a.log().amax(0), lambda a: (-a).log1p().nan_to_num(0).sum(0),
                   lambda a: a.log().t() @ a.log()]:
            r = check(fn, [x], [spec], mesh, poison=poison)
            assert torch.isfinite(r.dev_out[0]).all()


def test_padding_really_holds_garbage():
    # The premise of the masking test: log's padding is -inf on the device.
    mesh = mesh_of((4, 2))
    x = to_device(torch.rand(10, 6, dtype=torch.float64) + 0.5, mesh, ("data", None), poison=False)
    y = x.log()
    step([y])
    shards = torch_spmd._C._local_shards(y)
    tails = [s[1][s[3][0]:] for s in shards if s[3][0] < s[1].shape[0]]
    assert tails and all(torch.isinf(t).all() for t in tails)


def test_mark_step_executes_pending_values():
    # Regression: the live-tensor registry lost slots (weak_ptr self-move during compaction),
    # so mark_step did not execute pending values and reads executed them one by one.
    from torch_spmd.debug import metrics
    before = metrics.counter_value("ExecuteGraph") or 0
    xs_ = [torch.ones(3, 3).to(dev()) * i for i in range(5)]
    torch_spmd.sync()
    assert (metrics.counter_value("ExecuteGraph") or 0) == before + 1
    for i, t in enumerate(xs_):
        assert torch.equal(t.cpu(), torch.full((3, 3), float(i)))
    assert (metrics.counter_value("ExecuteGraph") or 0) == before + 1


def test_poison_helper_fills_padding():
    mesh = mesh_of((4, 2))
    t = to_device(torch.zeros(10, 3), mesh, ("data", None), poison=False)
    assert poison_padding(t)
    shards = torch_spmd._C._local_shards(t)
    assert torch.isnan(shards[-1][1][1:]).all()
    assert torch.equal(t.cpu(), torch.zeros(10, 3))


@pytest.mark.parametrize("batch", [8, 6])  # even, and uneven over 4 devices (padding)
def test_data_parallel_batch_norm_is_synchronized_without_gathers(batch):
    # Training-mode batch norm over a batch-sharded activation: the statistics are global
    # (synchronized batch norm), computed from local sums with all-reduces of per-channel
    # vectors; the activations themselves never move. Two all-reduces forward per batch norm
    # (mean, then variance), one backward (sum g and sum g*xhat stacked).
    mesh = mesh_of((4, 2))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, padding=1),
                              torch.nn.BatchNorm2d(4))
    cpu, d = copy.deepcopy(net), copy.deepcopy(net).to(dev())
    x = torch.randn(batch, 3, 6, 6)
    xd = to_device(x, mesh, ("data", None, None, None))
    step([])
    out = d(xd)
    fwd = step([out, d[1].running_mean, d[1].running_var, d[4].running_mean, d[4].running_var])
    ref = cpu(x)
    assert_same(out.cpu(), ref.detach(), "output")
    for name in ("1.running_mean", "1.running_var", "4.running_mean", "4.running_var"):
        assert_same(d.state_dict()[name].cpu(), cpu.state_dict()[name], name)
    channel_bytes = {8 * 4, 4 * 4}
    assert kinds(fwd) == [("all-reduce", ("data",))] * 4, fwd
    assert all(c["bytes"] in channel_bytes for c in fwd["collectives"]), fwd

    g = torch.randn(ref.shape)
    (ref * g).sum().backward()
    (out * g.to(dev())).sum().backward()
    grads = [p.grad for p in d.parameters()]
    bwd = step(grads)
    assert_params_close(d, cpu, grads=True)
    # Stacked [sum g, sum g*xhat] per batch norm (which give the batch norm's own gradients),
    # and the conv weight and bias gradients, sums over the batch: all-reduced in the step.
    assert kinds(bwd) == [("all-reduce", ("data",))] * 6, bwd
    conv_bytes = [p.numel() * 4 for m in (d[0], d[3]) for p in m.parameters()]
    stacked = [2 * b for b in channel_bytes]
    assert sorted(c["bytes"] for c in bwd["collectives"]) == sorted(conv_bytes + stacked), bwd
    assert not fwd["replicated_fallback_ops"] and not bwd["replicated_fallback_ops"]
