"""The Python-visible behaviour of spmd tensors and modules: saving and loading, data loading,
copying, printing, item(), autograd attributes, the graph dump and the metrics API."""
import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_spmd
from torch_spmd import debug
from torch_spmd.debug import metrics

from helpers import DEV


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def train_steps(model, batches, device):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if device == DEV:
            torch_spmd.sync()
        losses.append(loss.item())
    return losses


def assert_state_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k].cpu(), want[k].cpu(), rtol=0, atol=0, msg=k)


# ---- saving and loading -----------------------------------------------------------------------

def test_state_dict_save_load_roundtrip(tmp_path):
    model = small_model().to(DEV)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 4, generator=gen), torch.randint(0, 2, (6,), generator=gen))
               for _ in range(2)]
    train_steps(model, batches, DEV)
    state = model.state_dict()
    assert all(v.device == DEV for v in state.values())
    path = tmp_path / "model.pt"
    torch.save(state, path)

    # Loaded as saved: on the spmd device, same values.
    loaded = torch.load(path)
    assert all(v.device == DEV for v in loaded.values())
    assert_state_equal(loaded, state)
    # Mapped to the CPU.
    on_cpu = torch.load(path, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu.values())
    assert_state_equal(on_cpu, state)

    # load_state_dict onto a fresh device model (and onto a CPU model): same outputs.
    dev_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(DEV)
    dev_model.load_state_dict(torch.load(path))
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    cpu_model.load_state_dict(on_cpu)
    assert_state_equal(dev_model.state_dict(), state)
    dev_model.eval(), cpu_model.eval()
    x = torch.randn(3, 4)
    torch.testing.assert_close(dev_model(x.to(DEV)).cpu(), cpu_model(x), rtol=0, atol=0)
    # The loaded device model keeps training like a CPU copy of it.
    dev_model.train(), cpu_model.train()
    torch.testing.assert_close(train_steps(dev_model, batches, DEV),
                               train_steps(cpu_model, batches, torch.device("cpu")))


def test_storages_have_addresses_of_their_own():
    # What save_pretrained and safetensors use to find tied and shared tensors: a non-zero
    # storage address per storage, shared by views (offset as on any device) and by tied
    # weights, never by distinct tensors, and stable.
    emb = nn.Embedding(10, 4).to(DEV)
    head = nn.Linear(4, 10, bias=False).to(DEV)
    head.weight = emb.weight
    other = torch.zeros(10, 4, device=DEV)
    computed = emb.weight * 2
    addresses = [t.untyped_storage().data_ptr() for t in (emb.weight, other, computed)]
    assert 0 not in addresses and len(set(addresses)) == 3
    assert head.weight.data_ptr() == emb.weight.data_ptr() == addresses[0]
    row = emb.weight[3]
    assert row.untyped_storage().data_ptr() == addresses[0]
    assert row.data_ptr() == addresses[0] + 3 * 4 * emb.weight.element_size()
    assert emb.weight.data_ptr() == addresses[0]  # stable
    # Ranges do not overlap: a storage ends before the next begins.
    ends = sorted((a, a + t.untyped_storage().nbytes())
                  for a, t in zip(addresses, (emb.weight, other, computed)))
    assert all(e0 <= a1 for (_, e0), (a1, _) in zip(ends, ends[1:]))
    # CPU tensors keep theirs.
    x = torch.zeros(3)
    assert x.data_ptr() == x.untyped_storage().data_ptr() != 0


def test_torch_save_device_tensors_and_parameters():
    t = torch.arange(6.0).view(2, 3).to(DEV) * 2
    p = nn.Parameter(torch.ones(3).to(DEV))
    i = torch.tensor([1, 2, 3]).to(DEV)
    v = t[:, 1]  # a view
    buf = io.BytesIO()
    torch.save({"t": t, "p": p, "i": i, "v": v, "nested": [t.sum()]}, buf)
    buf.seek(0)
    got = torch.load(buf)
    assert got["t"].device == DEV and torch.equal(got["t"].cpu(), t.cpu())
    assert isinstance(got["p"], nn.Parameter) and got["p"].requires_grad and got["p"].device == DEV
    assert got["i"].dtype == torch.int64 and torch.equal(got["i"].cpu(), torch.tensor([1, 2, 3]))
    assert torch.equal(got["v"].cpu(), torch.tensor([2.0, 8.0]))
    assert got["nested"][0].item() == 30.0


def test_pickle_then_map_location_cpu():
    buf = io.BytesIO()
    torch.save(torch.full((2,), 7.0).to(DEV), buf)
    buf.seek(0)
    t = torch.load(buf, map_location="cpu")
    assert t.device.type == "cpu" and torch.equal(t, torch.full((2,), 7.0))


def test_torch_2x_device_api_as_users_write_it(tmp_path):
    # torch.device("spmd") and what torch 2.x generates for a renamed PrivateUse1 backend.
    assert torch.device("spmd").type == "spmd" and torch.device("spmd", 0) == torch_spmd.device()
    assert str(torch.randn(2, device="spmd").device) == "spmd:0"
    t = torch.arange(6.0).view(2, 3)
    for moved in (t.to("spmd"), t.spmd(), t.to(torch.device("spmd"))):
        assert moved.is_spmd and not t.is_spmd and torch.equal(moved.cpu(), t)
    m = nn.Linear(3, 2)
    assert m.spmd().weight.device == DEV
    assert torch.spmd.is_available() and torch.spmd.device_count() == 1
    torch.manual_seed(5)
    a = torch.randn(4, device="spmd").cpu()
    torch.manual_seed(5)
    assert torch.equal(torch.randn(4, device="spmd").cpu(), a)


def test_torch_load_weights_only_and_map_location_spmd(tmp_path):
    cpu_state = small_model().state_dict()
    path = tmp_path / "cpu.pt"
    torch.save(cpu_state, path)
    # A CPU checkpoint mapped onto the device (torch 2.x loads with weights_only=True).
    on_dev = torch.load(path, map_location="spmd")
    assert all(v.device == DEV for v in on_dev.values())
    assert_state_equal(on_dev, cpu_state)
    # A device checkpoint: plain tensor records, so weights_only loading accepts it.
    dev_path = tmp_path / "dev.pt"
    torch.save({k: v.to(DEV) for k, v in cpu_state.items()}, dev_path)
    again = torch.load(dev_path, weights_only=True)
    assert all(v.device == DEV for v in again.values())
    assert_state_equal(again, cpu_state)
    on_cpu = torch.load(dev_path, weights_only=True, map_location=torch.device("cpu"))
    assert all(v.device.type == "cpu" for v in on_cpu.values())
    assert_state_equal(on_cpu, cpu_state)


# ---- data loading, copying ---------------------------------------------------------------------

def test_dataloader_batches_to_device_train_like_cpu():
    gen = torch.Generator().manual_seed(2)
    ds = torch.utils.data.TensorDataset(torch.randn(24, 4, generator=gen),
                                        torch.randint(0, 2, (24,), generator=gen))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False, drop_last=True)
    cpu_model = small_model()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    batches = list(loader)
    assert len(batches) == 3
    moved = [(x.to(DEV), y.to(DEV)) for x, y in loader]
    assert all(x.device == DEV and y.dtype == torch.int64 for x, y in moved)
    torch.testing.assert_close(train_steps(dev_model, moved, DEV),
                               train_steps(cpu_model, batches, torch.device("cpu")),
                               rtol=1e-5, atol=1e-6)
    for a, b in zip(dev_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)


def test_deepcopy_of_device_model_is_independent():
    model = small_model().to(DEV)
    x = torch.randn(5, 4).to(DEV)
    F.cross_entropy(model(x), torch.tensor([0, 1, 0, 1, 1]).to(DEV)).backward()
    clone = copy.deepcopy(model)
    for (n, a), b in zip(model.named_parameters(), clone.parameters()):
        assert b.device == DEV and isinstance(b, nn.Parameter) and b.requires_grad, n
        assert torch.equal(a.cpu(), b.cpu()), n
        assert b.grad is None, n  # Parameter.__deepcopy__ does not copy .grad (CPU neither)
    t = model[0].weight.detach() * 1
    t.requires_grad_()
    t.grad = torch.ones_like(t)
    t2 = copy.deepcopy(t)               # a plain tensor's deepcopy carries its grad
    assert t2.device == DEV and t2.requires_grad and torch.equal(t2.grad.cpu(), t.grad.cpu())
    assert_state_equal(clone.state_dict(), model.state_dict())
    with torch.no_grad():
        clone[0].weight.add_(1.0)
        clone[1].running_mean.fill_(5.0)
    assert not torch.equal(clone[0].weight.cpu(), model[0].weight.cpu())
    assert torch.equal(model[1].running_mean.cpu(), copy.deepcopy(model)[1].running_mean.cpu())
    assert model[1].running_mean.cpu().ne(5.0).all()


def test_copy_between_host_and_device():
    d = torch.arange(6.0).view(2, 3).to(DEV)
    host = torch.zeros(2, 3)
    host.copy_(d)                       # device -> host tensor
    assert torch.equal(host, torch.arange(6.0).view(2, 3))
    d2 = torch.zeros(2, 3).to(DEV)
    d2.copy_(torch.ones(2, 3))          # host -> device tensor
    d2[1].copy_(torch.tensor([7, 8, 9]))  # into a view, with a dtype cast
    assert torch.equal(d2.cpu(), torch.tensor([[1.0, 1, 1], [7, 8, 9]]))
    host_view = torch.zeros(3, 3)
    host_view[1:].copy_(d)              # device -> a host view
    assert torch.equal(host_view[1:], torch.arange(6.0).view(2, 3)) and host_view[0].eq(0).all()


def test_tensors_of_other_devices_travel_through_the_host():
    # cuda <-> spmd goes through the host (checked on a GPU by scripts/gpu_check.sh); "meta" is
    # the other device every torch has: a copy to it keeps shape and dtype, a copy from it
    # fails in torch's own words (it holds no data), as .cpu() would.
    d = torch.arange(6.0).view(2, 3).to(DEV)
    m = d.to("meta", torch.float16)
    assert m.device.type == "meta" and m.shape == (2, 3) and m.dtype == torch.float16
    with pytest.raises(NotImplementedError, match="meta"):
        torch.empty(2, 3, device="meta").to(DEV)
    with pytest.raises(NotImplementedError, match="meta"):
        torch.zeros(2, 3).to(DEV).copy_(torch.empty(2, 3, device="meta"))


# ---- printing, item(), autograd attributes ----------------------------------------------------

@pytest.mark.parametrize("make,expected", [
    (lambda: torch.tensor([1.0, 2.5]), "tensor([1.0000, 2.5000], device='spmd:0')"),
    (lambda: torch.tensor([1, 2]), "tensor([1, 2], device='spmd:0')"),
    (lambda: torch.tensor([1.0, 2.0], dtype=torch.float64),
     "tensor([1., 2.], device='spmd:0', dtype=torch.float64)"),
    (lambda: torch.tensor(3.5), "tensor(3.5000, device='spmd:0')"),
    (lambda: torch.zeros(0, 3), "tensor([], device='spmd:0', size=(0, 3))"),
    (lambda: torch.ones(2, 2, dtype=torch.int32),
     "tensor([[1, 1],\n        [1, 1]], device='spmd:0', dtype=torch.int32)"),
    (lambda: torch.tensor([True, False]), "tensor([ True, False], device='spmd:0')"),
])
def test_repr_like_other_devices(make, expected):
    t = make().to(DEV)
    assert repr(t) == expected
    assert str(t) == expected
    # Same digits as the CPU tensor's repr.
    assert repr(make()).split("]")[0].split(")")[0] in expected


def test_repr_autograd_suffixes_and_views():
    w = torch.tensor([1.0, 2.0]).to(DEV).requires_grad_()
    assert repr(w) == "tensor([1., 2.], device='spmd:0', requires_grad=True)"
    assert repr(w * 2) == "tensor([2., 4.], device='spmd:0', grad_fn=<MulBackward0>)"
    p = nn.Parameter(torch.zeros(2).to(DEV))
    assert repr(p) == "Parameter containing:\ntensor([0., 0.], device='spmd:0', requires_grad=True)"
    b = torch.arange(6.0).view(2, 3).to(DEV)
    v = b[:, 1]
    b.mul_(10)                          # printing a view of a mutated base
    assert repr(v) == "tensor([10., 40.], device='spmd:0')"
    assert f"{b.sum():.1f}" == "150.0"  # __format__ of a 0-dim tensor


def test_item_types_and_values():
    d = torch.tensor([1.5, -2.0]).to(DEV)
    assert d.sum().item() == -0.5 and isinstance(d.sum().item(), float)
    n = torch.tensor([3, 4]).to(DEV).sum()
    assert n.item() == 7 and isinstance(n.item(), int)
    b = (d > 0).any()
    assert b.item() is True
    assert int(n) == 7 and float(d[0]) == 1.5 and bool(d[1] < 0)
    assert d.tolist() == [1.5, -2.0]
    with pytest.raises(Exception) as cpu_error:
        d.cpu().item()
    with pytest.raises(cpu_error.type, match="cannot be converted to Scalar"):
        d.item()  # more than one element: the same error as on CPU


def test_requires_grad_and_grad_on_parameters():
    torch.manual_seed(0)
    cpu = nn.Linear(3, 2)
    dev = copy.deepcopy(cpu).to(DEV)
    x = torch.randn(4, 3)
    for m, d in ((cpu, "cpu"), (dev, DEV)):
        for _ in range(2):  # gradients accumulate
            m(x.to(d)).pow(2).sum().backward()
    for a, b in zip(dev.parameters(), cpu.parameters()):
        assert a.is_leaf and a.requires_grad and isinstance(a, nn.Parameter)
        assert a.grad is not None and a.grad.device == DEV and not a.grad.requires_grad
        torch.testing.assert_close(a.grad.cpu(), b.grad)
    dev.zero_grad(set_to_none=False)
    assert all(p.grad.cpu().eq(0).all() for p in dev.parameters())
    with torch.no_grad():
        y = dev(x.to(DEV))
    assert not y.requires_grad and y.grad_fn is None
    dev.weight.requires_grad_(False)
    dev(x.to(DEV)).sum().backward()
    assert dev.bias.grad.cpu().eq(4.0).all()


def test_module_to_and_back():
    m = small_model()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to(DEV)
    assert all(p.device == DEV for p in m.parameters()) and all(b.device == DEV for b in m.buffers())
    m.to("cpu")
    assert_state_equal(m.state_dict(), ref)
    m.to(DEV).double()
    assert all(p.dtype == torch.float64 and p.device == DEV for p in m.parameters())


def test_out_variants_and_resize():
    a = torch.randn(3, 4)
    b = torch.randn(4, 2)
    o = torch.empty(3, 2).to(DEV)
    torch.mm(a.to(DEV), b.to(DEV), out=o)
    torch.testing.assert_close(o.cpu(), a @ b, rtol=0, atol=0)
    e = torch.empty(0).to(DEV)
    torch.add(a.to(DEV), 1, out=e)      # out= resizes an empty tensor
    assert e.shape == (3, 4)
    torch.testing.assert_close(e.cpu(), a + 1, rtol=0, atol=0)


# ---- graph dump and metrics ---------------------------------------------------------------

def test_graph_text_shows_pending_ops_without_executing():
    x = torch.randn(3, 4).to(DEV)
    y = (x.t() @ x).relu().sum(0)
    before = metrics.counter_value("ExecuteGraph") or 0
    text = debug.graph_text(y)
    assert (metrics.counter_value("ExecuteGraph") or 0) == before
    for op in ("spmd::device_data", "aten::t_copy", "aten::mm", "aten::relu", "aten::sum.dim_IntList"):
        assert op in text, text
    assert "outputs:" in text and "f32[4]" in text
    assert debug.graph_text([y, x]) .count("outputs:") == 1
    torch_spmd.sync()
    assert debug.graph_text(y).splitlines()[0].startswith("%0 = spmd::device_data()")


def test_metrics_api():
    metrics.clear_all()
    assert metrics.counter_names() == [] and metrics.counter_value("MarkStep") is None
    x = torch.randn(8, 8).to(DEV)

    def step():
        y = (x @ x).tanh().sum()
        torch_spmd.sync()
        return y.item()

    step()
    assert metrics.counter_value("MarkStep") == 1
    assert metrics.counter_value("UncachedCompile") == 1
    assert metrics.counter_value("CachedCompile") is None
    step()
    step()
    assert metrics.counter_value("MarkStep") == 3
    assert metrics.counter_value("UncachedCompile") == 1      # same graph: compiled once
    assert metrics.counter_value("CachedCompile") == 2
    assert metrics.counter_value("ExecuteGraph") == 3
    assert metrics.counter_value("TransferFromDevice") >= 3

    for name in ("CompileTime", "ExecuteTime"):
        assert name in metrics.metric_names()
        count, total, samples = metrics.metric_data(name)
        assert count == (1 if name == "CompileTime" else 3) and total > 0 and len(samples) == count
    assert metrics.metric_data("NoSuchMetric") is None

    # An op with a data-dependent output shape runs eagerly and is counted by name.
    assert metrics.counter_value("EagerFallback") is None
    nz = (x > 0).nonzero()
    m = x[x > 0.5]
    assert nz.shape[1] == 2 and m.dim() == 1
    assert metrics.counter_value("EagerFallback") >= 2
    assert metrics.counter_value("aten::nonzero") >= 1
    assert metrics.counter_value("aten::index.Tensor") >= 1  # boolean-mask indexing
    assert {"aten::nonzero", "aten::index.Tensor"} <= set(metrics.executed_fallback_ops())

    report = metrics.metrics_report()
    for name in ("MarkStep", "UncachedCompile", "CachedCompile", "ExecuteGraph", "EagerFallback",
                 "aten::nonzero", "CompileTime", "ExecuteTime"):
        assert name in report, name
    short = metrics.short_metrics_report()
    assert "CachedCompile" in short and "CompileTime" in short
    metrics.clear_all()
    assert metrics.counter_names() == [] and metrics.metric_names() == []
    assert "MarkStep" not in metrics.metrics_report()


def test_xla_model_api():
    import torch_spmd.core.xla_model as xm
    assert xm.xla_device() == DEV == torch_spmd.device()
    seen = []
    t = torch.ones(3).to(DEV) * 2
    xm.add_step_closure(lambda v: seen.append(v.sum().item()), (t,))
    assert seen == []
    xm.mark_step()
    assert seen == [6.0]
    info = xm.get_memory_info()
    assert info["bytes_limit"] > 0 and info["bytes_used"] >= 12
    assert torch_spmd.is_spmd_tensor(t) and not torch_spmd.is_spmd_tensor(torch.ones(1))


# ---- randomness ---------------------------------------------------------------------------

def test_dropout_training_mask_is_consistent():
    x = (torch.rand(2000) + 0.5).to(DEV).requires_grad_()
    y = F.dropout(x, 0.3, training=True)
    y.sum().backward()
    ratio = (y / x).detach().cpu()
    kept = ratio != 0
    torch.testing.assert_close(ratio[kept], torch.full((int(kept.sum()),), 1 / 0.7))
    assert 0.6 < kept.float().mean().item() < 0.8
    # The backward uses the very mask of the forward, although they are synced separately.
    torch.testing.assert_close(x.grad.cpu(), kept.float() / 0.7)


def test_random_values_are_stable_and_reproducible():
    # A random value and values computed from it agree even when read in separate graphs.
    a = torch.rand(5, device=DEV)
    b = a * 2
    assert torch.equal(a.cpu() * 2, b.cpu())
    # torch.manual_seed makes device randomness reproducible.
    torch.manual_seed(123)
    r1 = torch.randn(4, device=DEV), torch.randint(0, 10, (4,), device=DEV)
    torch.manual_seed(123)
    r2 = torch.randn(4, device=DEV), torch.randint(0, 10, (4,), device=DEV)
    for u, v in zip(r1, r2):
        assert torch.equal(u.cpu(), v.cpu())
    assert not torch.equal(r1[0].cpu(), torch.randn(4, device=DEV).cpu())
    g = torch.Generator().manual_seed(7)
    u = torch.rand(3, generator=g, device=DEV)
    g.manual_seed(7)
    assert torch.equal(u.cpu(), torch.rand(3, generator=g, device=DEV).cpu())


def test_device_execution_does_not_disturb_host_rng():
    torch.manual_seed(0)
    torch.rand(3, device=DEV)
    expected = torch.rand(3)
    torch.manual_seed(0)
    d = torch.rand(3, device=DEV)
    d.cpu()                              # executes the random op on the host's kernels
    assert torch.equal(torch.rand(3), expected)


def test_random_ops_do_not_recompile():
    def step():
        y = (torch.rand(4, 4, device=DEV) * 2).sum() + F.dropout(torch.ones(8, device=DEV), 0.5).sum()
        torch_spmd.sync()
        return y.item()

    step()
    before = metrics.counter_value("UncachedCompile")
    values = {step() for _ in range(3)}
    assert metrics.counter_value("UncachedCompile") == before
    assert len(values) == 3  # and each step draws new numbers


def test_init_and_in_place_parameter_edits():
    lin = nn.Linear(4, 3).to(DEV)
    nn.init.zeros_(lin.bias)
    nn.init.constant_(lin.weight, 0.5)
    with torch.no_grad():
        lin.weight[:, 0] = 0            # in-place through a view of a leaf parameter
        lin.weight[1].mul_(2)
    expected = torch.full((3, 4), 0.5)
    expected[:, 0] = 0
    expected[1] *= 2
    assert torch.equal(lin.weight.cpu(), expected) and lin.bias.cpu().eq(0).all()
    assert lin.weight.is_leaf and lin.weight.requires_grad
    lin.bias.data = torch.ones(3).to(DEV)   # .data assignment
    assert torch.equal(lin(torch.zeros(1, 4).to(DEV)).cpu(), torch.ones(1, 3))
    torch.manual_seed(11)
    nn.init.kaiming_uniform_(lin.weight)
    first = lin.weight.cpu()
    torch.manual_seed(11)
    nn.init.kaiming_uniform_(lin.weight)
    assert torch.equal(lin.weight.cpu(), first)     # seeded device init is reproducible
    bound = 1 / 2                                    # kaiming_uniform_(a=0): sqrt(6 / fan_in)
    assert first.abs().max().item() <= (6 / 4) ** 0.5 and first.std().item() > bound / 4
    lin(torch.randn(2, 4).to(DEV)).sum().backward()
    assert lin.weight.grad.shape == (3, 4)


def test_to_device_keeps_tied_weights():
    # As with .cuda(): one parameter object shared by two modules stays one object, and the
    # optimizer updates it once.
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    cpu = Tied()
    dev = copy.deepcopy(cpu).to(DEV)
    assert dev.head.weight is dev.emb.weight and len(list(dev.parameters())) == 1
    for model, device in ((cpu, "cpu"), (dev, DEV)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        idx = torch.tensor([1, 2, 3]).to(device)
        model.head(model.emb(idx)).pow(2).mean().backward()
        opt.step()
    assert torch.equal(dev.head.weight.cpu(), dev.emb.weight.cpu())
    torch.testing.assert_close(dev.emb.weight.cpu(), cpu.emb.weight)


def test_outbound_and_inbound_data_metrics_count_transferred_bytes():
    # PyTorch/XLA's OutboundData / InboundData: bytes sent to and read from the devices, the
    # global tensor's bytes once per transfer, sharded or not.
    import numpy as np
    import torch_spmd.distributed.spmd as xs
    from torch_spmd.debug import metrics as met
    # A moved tensor is held on the host until used or annotated (PyTorch/XLA's virtual
    # device): it is transferred then, once.
    n = torch_spmd.runtime.global_runtime_device_count()
    met.clear_metrics()
    x = torch.randn(n * 2, 8)
    t = x.to(torch_spmd.device())
    assert met.metric_data("OutboundData") is None
    assert "TransferToDeviceTime" not in met.metric_names()
    assert torch.equal(t.cpu(), x)  # read while held: nothing moves
    assert met.metric_data("InboundData") is None
    u = t * 1  # its first use uploads it (replicated)
    assert met.metric_data("OutboundData")[0] == 1
    assert met.metric_data("OutboundData")[2][-1] == x.nelement() * x.element_size()
    assert "TransferToDeviceTime" in met.metric_names()
    s = torch.randn(n, 4)
    xs.mark_sharding(s.to(torch_spmd.device()), xs.Mesh(np.arange(n), (n,)), (0, None))
    assert met.metric_data("OutboundData")[0] == 2  # sharded at once: one transfer, not two
    assert met.metric_data("OutboundData")[2][-1] == s.nelement() * s.element_size()
    assert torch.equal(u.cpu(), x)
    assert met.metric_data("InboundData")[2][-1] == x.nelement() * x.element_size()
