"""torch.compile on spmd tensors (torch_spmd/_torch_patches/dynamo.py): dynamo fakifies them, the
`openxla` backend runs each captured graph's outputs at the call, `spmd` leaves them to the
step; both train equal to CPU eager under sharding. dynamo_mark_sharding and
MarkShardingFunction (through AOTAutograd) annotate inside compiled regions as outside."""
import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C
from conftest import ensure_devices

DEV = torch_spmd.device()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _pending(t):
    return "aten::" in _C._graph_text([t])


def _train_beside_cpu(step_dev, model_dev, opt_dev, model_cpu, opt_cpu, mesh, steps, features):
    """`steps` training steps on the device (its forward `step_dev`, the batch sharded over
    'data') and the same steps on CPU."""
    for step in range(steps):
        x = torch.randn(16, features, generator=torch.Generator().manual_seed(step))
        xd = x.to(DEV)
        xs.mark_sharding(xd, mesh, ("data", None))
        step_dev(xd).pow(2).mean().backward()
        opt_dev()
        model_dev.zero_grad()
        xm.mark_step()
        model_cpu(x).pow(2).mean().backward()
        opt_cpu.step()
        opt_cpu.zero_grad()


@pytest.fixture
def mesh():
    ensure_devices(8)
    torch._dynamo.reset()
    yield xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["openxla", "spmd"])
@pytest.mark.parametrize("layout", ["data", "fsdp", "2d"])
def test_compiled_training_equals_cpu(mesh, backend, layout):
    torch.manual_seed(0)
    cpu, dev = MLP(), MLP()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(DEV)
    if layout == "fsdp":
        for p in dev.parameters():
            xs.mark_sharding(p, mesh, (("data", "model"),) + (None,) * (p.dim() - 1))
    elif layout == "2d":
        xs.mark_sharding(dev.fc1.weight, mesh, ("model", "data"))
        xs.mark_sharding(dev.fc2.weight, mesh, ("data", "model"))
    opt_cpu = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.Adam(dev.parameters(), lr=1e-2)
    compiled = torch.compile(dev, backend=backend)
    torch._dynamo.utils.counters.clear()
    for step in range(5):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
        xd = x.to(DEV)
        xs.mark_sharding(xd, mesh, ("data", None))
        out = compiled(xd)
        assert _pending(out) == (backend == "spmd")  # openxla ran the graph at the call
        out.pow(2).mean().backward()
        # openxla ran the backward graph at the call too: the gradients are data, which the
        # optimizer's program reads (not the backward's ops again)
        assert all(_pending(p.grad) == (backend == "spmd") for p in dev.parameters())
        opt_dev.step()
        opt_dev.zero_grad()
        xm.mark_step()
        cpu(x).pow(2).mean().backward()
        opt_cpu.step()
        opt_cpu.zero_grad()
    # Dynamo captured the forward once: the same shapes and layouts pass its guards.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5)


def test_dynamo_mark_sharding_in_a_compiled_region_gives_the_collectives_of_eager(mesh):
    device_ids, shape, names = list(range(8)), [4, 2], "('data', 'model')"

    def fn(a, b):
        h = a @ b
        torch.ops.xla.dynamo_mark_sharding(h, device_ids, shape, names, "('data', 'model')")
        return (h * 2).sum(0)

    torch.manual_seed(0)
    a, b = torch.randn(16, 8), torch.randn(8, 32)
    results, kinds = [], []
    for f in (fn, torch.compile(fn, backend="spmd")):
        out = f(a.to(DEV), b.to(DEV))
        xm.mark_step()
        results.append(out.cpu())
        kinds.append(sorted((c["kind"], c["bytes"])
                            for c in torch_spmd.debug.last_step_stats()["collectives"]))
    torch.testing.assert_close(results[0], (a @ b * 2).sum(0))
    torch.testing.assert_close(results[1], results[0])
    assert kinds[0] and kinds[1] == kinds[0]


def test_mark_sharding_function_is_kept_by_aot_autograd(mesh):
    from functorch.compile import aot_function, make_boxed_func
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    line = xs.Mesh(np.arange(8), (8,), ("x",))
    fn = aot_function(lambda x: xs.MarkShardingFunction.apply(torch.sin(x), line, ("x",)) + 1,
                      keep)
    x = torch.randn(8).to(DEV).requires_grad_(True)
    y = fn(x)
    y.sum().backward()
    xm.mark_step()
    assert "devices=[8]" in _C._get_sharding_spec(y)
    assert "devices=[8]" in _C._get_sharding_spec(x.grad)
    assert all("aot_mark_sharding" in gm.code for gm in graphs) and len(graphs) == 2
    torch.testing.assert_close(x.grad.cpu(), torch.cos(x.detach().cpu()))


class BNNet(torch.nn.Module):
    def __init__(self, checkpointed):
        super().__init__()
        self.fc1, self.bn, self.fc2 = (torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                       torch.nn.Linear(32, 4))
        self.checkpointed = checkpointed

    def inner(self, x):
        return self.fc2(torch.relu_(self.bn(self.fc1(x))))

    def forward(self, x):
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_batch_norm_buffers_update_inside_replayed_graphs(mesh, checkpointed):
    """BatchNorm's running stats: AOTAutograd keeps their update in the forward graph (copy_
    into the buffers), which each replay writes again. Parameters and buffers equal CPU's
    (with activation checkpointing, compiled torch updates the stats once where eager's
    recomputation updates them twice, on CPU too: parameters only, there). It used to raise
    torch's version-counter error under checkpointing."""
    torch.manual_seed(0)
    cpu, dev = BNNet(checkpointed), BNNet(checkpointed)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(DEV)
    compiled = torch.compile(dev, backend="spmd")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    replays = _C._counter_value("GraphTemplateReplays")
    _train_beside_cpu(compiled, dev, opt_dev.step, cpu, opt_cpu, mesh, 4, 16)
    assert _C._counter_value("GraphTemplateReplays") - replays == 6  # forward and backward
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    if not checkpointed:
        for a, b in zip(cpu.buffers(), dev.buffers()):
            torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)


def test_a_compiled_optimizer_step_writes_the_parameters_at_each_replay(mesh):
    """torch.compile(opt.step): an inference graph that only writes its inputs (parameters and
    Adam's state; `capturable=True` keeps its step counters on the device) and returns
    nothing. Replayed at every later step, equal to CPU's Adam."""
    torch.manual_seed(0)
    cpu, dev = MLP(), MLP()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(DEV)
    opt_cpu = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.Adam(dev.parameters(), lr=1e-2, capturable=True)
    step = torch.compile(opt_dev.step, backend="spmd")
    replays = _C._counter_value("GraphTemplateReplays")
    _train_beside_cpu(dev, dev, step, cpu, opt_cpu, mesh, 4, 32)
    assert _C._counter_value("GraphTemplateReplays") - replays == 3
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
def test_a_compiled_default_optimizer_step_is_capturable_and_replayed(mesh, optimizer):
    """As dynamo does for CUDA parameters, a compiled step of an optimizer with the option runs
    the capturable algorithm on spmd parameters: its step counts live on the device (a CPU
    count is a graph input a template cannot take, and the step's ops ran at every call)."""
    torch.manual_seed(0)
    cpu, dev = MLP(), MLP()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(DEV)
    opt_cpu, opt_dev = optimizer(cpu.parameters(), lr=1e-2), optimizer(dev.parameters(), lr=1e-2)
    step = torch.compile(opt_dev.step, backend="spmd")
    replays = _C._counter_value("GraphTemplateReplays")
    _train_beside_cpu(dev, dev, step, cpu, opt_cpu, mesh, 4, 32)
    assert _C._counter_value("GraphTemplateReplays") - replays == 3
    assert opt_dev.param_groups[0]["capturable"] and not opt_cpu.param_groups[0]["capturable"]
    assert all(s["step"].device.type == "spmd" for s in opt_dev.state.values())
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-5, atol=1e-6)


def test_lean_calls_keep_autograd_semantics(mesh):
    """From the second step on, a training graph is called through torch_spmd's lean autograd
    function (activations kept as IR values): an integer output stays non-differentiable, an
    unused output's gradient is not needed, retain_graph lets the backward run twice (the kept
    activations read again), and the gradients equal CPU eager's."""
    from torch_spmd._torch_patches import dynamo as _dynamo_support

    def f(model, x):
        y = model(x)
        return y.pow(2).mean(), y.argmax(-1), y.sum()

    import gc
    before = {id(o) for o in gc.get_objects() if type(o) is _dynamo_support._Region}
    torch.manual_seed(0)
    cpu, dev = MLP(), MLP()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(DEV)
    compiled = torch.compile(f, backend="spmd")
    for step in range(3):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
        xd = x.to(DEV)
        xs.mark_sharding(xd, mesh, ("data", None))
        loss, idx, _ = compiled(dev, xd)
        assert not idx.requires_grad and idx.dtype == torch.int64
        loss.backward(retain_graph=True)
        loss.backward()
        ref, ref_idx, _ = f(cpu, x)
        ref.backward(retain_graph=True)
        ref.backward()
        for out in (ref, loss):  # (the graph was freed by the last backward)
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                out.backward()
        torch.testing.assert_close(idx.cpu(), ref_idx)
        for a, b in zip(cpu.parameters(), dev.parameters()):
            torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
        cpu.zero_grad()
        dev.zero_grad()
        xm.mark_step()
    regions = [o for o in gc.get_objects()
               if type(o) is _dynamo_support._Region and id(o) not in before]
    assert regions and all(r.lean for r in regions)  # (steps 2 and 3 went through it)


def test_a_lean_backward_frees_the_forwards_values(mesh):
    """After a compiled step's backward (no retain_graph), the loss it leaves behind holds no
    device memory: the activations kept for the backward, and through them the step's inputs
    and the parameters' buffers before the optimizer's update, are released as autograd frees
    saved tensors, not when the next step replaces the loss."""
    torch.manual_seed(0)
    model = MLP().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    compiled = torch.compile(lambda x: model(x).pow(2).mean(), backend="spmd")
    for step in range(3):
        xd = torch.randn(16, 32, generator=torch.Generator().manual_seed(step)).to(DEV)
        xs.mark_sharding(xd, mesh, ("data", None))
        loss = compiled(xd)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xm.mark_step()
    with_loss = xm.get_memory_info(0)["bytes_used"]
    own = loss.element_size()  # (the loss's own value, a replicated scalar)
    del loss
    assert xm.get_memory_info(0)["bytes_used"] == with_loss - own


def test_an_openxla_lean_backward_reads_the_forwards_results(mesh):
    """backend='openxla' runs each graph at its call. The lean forward's kept activations must
    then be the computed data: kept as the nodes computing them, the backward's program would
    compute the forward again (its flops the forward's more than the first step's backward,
    which AOTAutograd's runtime ran)."""
    torch.manual_seed(0)
    model = MLP().to(DEV)
    compiled = torch.compile(lambda x: model(x).pow(2).mean(), backend="openxla")
    flops = []
    for step in range(3):
        xd = torch.randn(16, 32, generator=torch.Generator().manual_seed(step)).to(DEV)
        xs.mark_sharding(xd, mesh, ("data", None))
        loss = compiled(xd)
        loss.backward()  # (openxla: the backward's program runs here)
        flops.append(_C._last_step_stats()["flops_per_device"])
        model.zero_grad()
        xm.mark_step()
    assert flops[0] > 0 and flops[2] == flops[0], flops


def test_a_graph_with_device_tensor_constants_is_replayed(mesh):
    """A literal made on the device inside the compiled function becomes a tensor constant of
    AOTAutograd's graph (get_attr), made before the call: the template takes it as an input
    (HF Llama's forward has four). Replayed, with eager's values."""
    def fn(x):
        return x * torch.tensor([1., 2., 3., 4.], device=x.device) + torch.arange(4, device=x.device)

    compiled = torch.compile(fn, backend="spmd")
    replays = _C._counter_value("GraphTemplateReplays")
    for step in range(3):
        x = torch.randn(4, generator=torch.Generator().manual_seed(step))
        assert torch.equal(compiled(x.to(DEV)).cpu(), fn(x))
    assert _C._counter_value("GraphTemplateReplays") - replays == 2


def test_inductor_on_spmd_tensors_names_the_backends_that_run_them():
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r'inductor.*no code for the spmd device.*"openxla"'):
        torch.compile(lambda x: x.sin() + 1)(torch.randn(4).to(DEV))
    torch._dynamo.reset()


def test_unknown_backend_names_still_fail_as_in_torch():
    with pytest.raises(Exception, match="not_a_backend"):
        torch.compile(MLP(), backend="not_a_backend")(torch.randn(2, 32))


@pytest.mark.parametrize("backend", ["spmd", "openxla"])
def test_benchmark_gpt_compiled_trains_equal_to_lazy(mesh, backend):
    """The benchmark GPT (4-D attention matmuls, which the device records as one op with its
    own autograd: fake tensors take the composite path) compiled, data parallel: 5 Adam steps
    give the lazy run's losses and parameters. After the first step the forward and backward
    graphs are replayed from their templates, not run op by op."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from bench_model import GPT, GPTConfig
    cfg = GPTConfig()
    line = xs.Mesh(np.arange(8), (8,), ("data",))
    tokens = torch.randint(0, cfg.vocab, (5, cfg.batch, cfg.seq + 1),
                           generator=torch.Generator().manual_seed(0))
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg).to(DEV)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.compile(model.loss, backend=backend) if compiled else model.loss
        captures, replays = (_C._counter_value(c) for c in ("GraphTemplateCaptures",
                                                             "GraphTemplateReplays"))
        losses = []
        for tok in tokens:
            x = tok.to(DEV)
            xs.mark_sharding(x, line, ("data", None))
            loss = loss_fn(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            xm.mark_step()
            losses.append(loss.item())
        runs.append((losses, [p.cpu() for p in model.parameters()]))
        if compiled:  # forward and backward: captured once, replayed at the 4 later steps
            assert _C._counter_value("GraphTemplateCaptures") - captures == 2
            assert _C._counter_value("GraphTemplateReplays") - replays == 8
    if backend == "spmd":  # one program per step, as lazy: the same numbers
        assert runs[1][0] == runs[0][0]
        for a, b in zip(runs[0][1], runs[1][1]):
            assert torch.equal(b, a)
    else:  # forward and backward are two programs, as on PyTorch/XLA: their reductions are
        # laid out apart and sum in another order (measured: 9e-6 apart after 5 steps)
        assert runs[1][0] == pytest.approx(runs[0][0], rel=1e-5)
        for a, b in zip(runs[0][1], runs[1][1]):
            torch.testing.assert_close(b, a, rtol=1e-3, atol=5e-5)
