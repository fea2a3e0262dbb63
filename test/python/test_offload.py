"""Host offloading (torch_spmd.memory, partition/offload.h): values kept in host memory between
the forward and the backward. Through torch.autograd.graph.save_on_cpu, through marks saved by
a selective checkpoint policy (MaxText's offloaded remat policies: checkpoint_name and
save_and_offload_only_these_names), and through PyTorch/XLA's place_to_host/place_to_device in
saved-tensor hooks: gradients equal CPU eager's, the offloaded bytes leave device memory (the
host holds them, executed and planned alike), and the copies are priced on the host link."""
import functools

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import torch_spmd
import torch_spmd.distributed.spmd as xs
import torch_spmd.memory as memory
import torch_spmd.plan as plan
from torch_spmd import _C
from torch_spmd.debug import last_step_stats
from torch_spmd.utils.checkpoint import checkpoint_name, save_and_offload_only_these_names
from spmd_diff import ensure_devices, mesh_of

D, TOKENS, LAYERS = 128, 256, 4


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def kinds(stats):
    return [c["kind"] for c in stats["collectives"]]


def mlp_step(device, context=None, policy=None, layers=LAYERS, mesh=None, tokens=TOKENS,
             width=D):
    """A stack of tanh layers, the forward inside `context` (a context manager factory) or
    each layer checkpointed with `policy` (a context_fn). Returns the weights' gradients."""
    torch.manual_seed(0)
    ws = [torch.randn(width, width).div(width ** 0.5).to(device).requires_grad_()
          for _ in range(layers)]
    x = torch.randn(tokens, width).to(device)
    if mesh is not None:
        xs.mark_sharding(x, mesh, ("x", None))

    def layer(h, w):
        return torch.tanh(checkpoint_name(h @ w, "proj"))

    h = x.cumsum(0)  # an activation (the input data itself would stay on the device)
    with (context() if context else torch.enable_grad()):
        for w in ws:
            h = checkpoint(layer, h, w, use_reentrant=False, context_fn=policy) if policy \
                else layer(h, w)
    h.pow(2).mean().backward()
    grads = [w.grad for w in ws]
    if device == "cpu":
        return grads
    torch_spmd.sync()
    return None if _C._planning() else [g.cpu() for g in grads]


def assert_grads_equal(got, expected):
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_save_on_cpu_offloads_saved_activations_and_equals_cpu():
    mesh = mesh_of((8,))
    expected = mlp_step("cpu", torch.autograd.graph.save_on_cpu)
    plain = mlp_step("spmd", None, mesh=mesh)
    kept = last_step_stats()
    got = mlp_step("spmd", torch.autograd.graph.save_on_cpu, mesh=mesh)
    offloaded = last_step_stats()
    assert_grads_equal(got, expected)
    assert_grads_equal(plain, expected)
    # Each layer's matmul output and tanh output (its input is the previous layer's) go to the
    # host once each, whatever number of backward ops save them, and come back once.
    k = kinds(offloaded)
    assert k.count("device-to-host") == k.count("host-to-device") > 0
    assert "device-to-host" not in kinds(kept)
    tile = TOKENS // 8 * D * 4
    assert offloaded["host_peak_bytes_per_device"] >= LAYERS * tile
    assert kept["host_peak_bytes_per_device"] == 0
    # ... and leave device memory: the step's peak drops by about them.
    assert offloaded["peak_bytes_per_device"] < kept["peak_bytes_per_device"] - (LAYERS - 2) * tile


def test_a_selective_policy_offloads_named_values_and_recomputes_the_rest():
    mesh = mesh_of((8,))
    policies = {
        "offload": save_and_offload_only_these_names((), ("proj",)),
        "save": save_and_offload_only_these_names(("proj",), ()),
        "recompute": save_and_offload_only_these_names((), ()),
    }
    expected = mlp_step("cpu", policy=policies["recompute"])
    stats = {}
    for name, policy in policies.items():
        assert_grads_equal(mlp_step("spmd", policy=policy, mesh=mesh), expected)
        stats[name] = last_step_stats()
    assert kinds(stats["offload"]).count("device-to-host") == LAYERS
    assert "device-to-host" not in kinds(stats["save"])
    # Offloaded or saved, a named value is not recomputed; recomputed, it is.
    assert stats["offload"]["flops_per_device"] == stats["save"]["flops_per_device"]
    assert stats["recompute"]["flops_per_device"] > stats["save"]["flops_per_device"]
    # Offloaded, it takes no device memory between the passes.
    assert stats["offload"]["peak_bytes_per_device"] < stats["save"]["peak_bytes_per_device"]
    with pytest.raises(ValueError, match="both saved and offloaded"):
        save_and_offload_only_these_names(("a",), ("a", "b"))
    with pytest.raises(TypeError, match="name must be a str"):
        checkpoint_name(torch.ones(2), 3)


def test_offload_marks_and_torch_xla_hooks():
    mesh = mesh_of((8,))
    # PyTorch/XLA's pair in saved-tensor hooks.
    hooks = functools.partial(torch.autograd.graph.saved_tensors_hooks, memory.place_to_host,
                              memory.place_to_device)
    expected = mlp_step("cpu", torch.autograd.graph.save_on_cpu)
    assert_grads_equal(mlp_step("spmd", hooks, mesh=mesh), expected)
    assert "device-to-host" in kinds(last_step_stats())
    # torch_xla's module for them (what `import torch_xla...` gives after torch_spmd.xla.install()).
    from torch_spmd.experimental import stablehlo_custom_call as xla_ops
    assert xla_ops.place_to_host is memory.place_to_host
    from torch_spmd.xla import _target_name
    assert _target_name("torch_xla.experimental.stablehlo_custom_call") == \
        "torch_spmd.experimental.stablehlo_custom_call"
    # A mark off the spmd device is a copy; a non-tensor is refused.
    t = torch.ones(3)
    assert torch.equal(memory.offload(t), t)
    with pytest.raises(TypeError, match="offload expects a tensor"):
        memory.offload([1.0])


def test_the_executed_step_charges_offloaded_bytes_to_the_host():
    mesh = mesh_of((8,))
    mlp_step("spmd", torch.autograd.graph.save_on_cpu, mesh=mesh)
    assert _C._host_memory_info(0)["peak_bytes_used"] >= 8 * LAYERS * TOKENS // 8 * D * 4
    assert _C._host_memory_info(0)["bytes_used"] == 0  # freed with the step's values


def test_plan_equals_executed_and_prices_the_host_link():
    mesh = mesh_of((8,))
    keys = ("peak_bytes_per_device", "host_peak_bytes_per_device", "flops_per_device")
    mlp_step("spmd", torch.autograd.graph.save_on_cpu, mesh=mesh)
    executed = {k: last_step_stats()[k] for k in keys}
    hw = dict(plan.resolve("tpu-v6e"))
    with plan.Plan(num_devices=8, hardware=hw) as p:
        mlp_step("spmd", torch.autograd.graph.save_on_cpu, mesh=xs.Mesh(np.arange(8), (8,), ("x",)))
        planned = {k: last_step_stats()[k] for k in keys}
        report = p.report()
    assert planned == executed
    assert report.host_bytes_per_device == planned["host_peak_bytes_per_device"]
    assert report.host_bytes_per_host == 8 * report.host_bytes_per_device  # 8 chips a host
    # The copies cross the host link at its bandwidth, beside the compute.
    copies = [c for c in report.collectives if c["kind"] in ("device-to-host", "host-to-device")]
    assert copies and all(c["algorithm"] == "host link" for c in copies)
    moved = sum(c["bytes"] * c["count"] for c in copies)
    assert report.host_transfer_seconds == pytest.approx(
        moved / hw["host_bandwidth"] + sum(c["count"] for c in copies) * hw["link_latency"])
    # A host too small for what is offloaded does not fit.
    with plan.Plan(num_devices=8, hardware=dict(hw, host_memory_bytes=1000)) as p:
        mlp_step("spmd", torch.autograd.graph.save_on_cpu, mesh=xs.Mesh(np.arange(8), (8,), ("x",)))
        small = p.report()
    assert not small.fits and "each host holds" in small.out_of_memory
