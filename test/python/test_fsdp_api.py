"""FSDP API details in a single process (world size 1: the collectives are identities):
constructor signature, sharded parameter layout and names, metadata, divide factors, wrap
policies, checkpoint_module, state dict consolidation with buffers, data swapping."""
import functools
import inspect

import pytest
import torch
import torch.nn as nn

import torch_spmd
import torch_spmd.core.xla_model as xm
from torch_spmd import _C
from torch_spmd.distributed.fsdp import (XlaFullyShardedDataParallel as FSDP, checkpoint_module,
                                         consolidate_sharded_state_dicts)
from torch_spmd.distributed.fsdp import wrap
from torch_spmd.distributed.fsdp.xla_fully_sharded_data_parallel import FLOAT_DTYPES

from _fsdp_models import Block, transformer

DEV = torch_spmd.device()

REFERENCE_SIGNATURE = [
    ("module", inspect.Parameter.empty), ("reshard_after_forward", True),
    ("flatten_parameters", False), ("execute_sharding_on_init", True),
    ("optimization_barrier_in_forward", True), ("optimization_barrier_in_backward", True),
    ("sync_on_finalization", False), ("disable_reshard_on_root", True),
    ("compute_dtype", None), ("buffer_dtype", None), ("fp32_reduce_scatter", False),
    ("sharding_groups", None), ("sharding_rank", None), ("sharding_world_size", None),
    ("shard_param_on_dim_0", False), ("pin_layout_in_collective_ops", True),
    ("reduce_scatter_bucket_size_mb", 0), ("coalesce_all_gather_ops", False),
    ("auto_wrap_policy", None), ("auto_wrapper_callable", None), ("param_init_fn", None),
    ("_shard_size_multiple", 128), ("_use_xla_patched_linear", True),
    ("_debug_dummy_forward_pass", False), ("_debug_msg", "xla_fsdp"), ("_debug_print", False),
    ("_debug_dummy_all_gather_op", False), ("_debug_dummy_all_reduce_op", False),
    ("_debug_dummy_reduce_scatter_op", False), ("_debug_dummy_optimization_barrier_op", False)]


def test_constructor_signature_is_pytorch_xla_s():
    params = inspect.signature(FSDP.__init__).parameters
    assert [(n, p.default) for n, p in params.items() if n != "self"] == REFERENCE_SIGNATURE
    assert FLOAT_DTYPES == [torch.float32, torch.float16, torch.bfloat16]
    with pytest.raises(TypeError):
        FSDP(nn.Linear(2, 2), mark_step_on_finalization=True)  # renamed upstream


def _small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))


def test_sharded_parameters_names_padding_and_metadata():
    model = FSDP(_small())
    sep = "_FSDP_SHARD_SEPARATOR_"
    names = {n: tuple(p.shape) for n, p in model.named_parameters()}
    prefix = f"_fsdp_shard{sep}_fsdp_wrapped_module{sep}_fpw_module{sep}"
    # Flattened and zero-padded to a multiple of world_size * 128 (world size 1 here).
    assert names == {prefix + f"0{sep}weight": (128,), prefix + f"0{sep}bias": (128,),
                     prefix + f"2{sep}weight": (128,), prefix + f"2{sep}bias": (128,)}
    w = model.module.module[0].weight  # the full parameter: freed (a placeholder) until forward
    assert w.shape == (1,) and not w._has_full_param
    meta = model.get_shard_metadata()
    assert set(meta) == {"shard_info", "flatten_info", "buffer_info", "world_size", "rank"}
    assert meta["shard_info"][""][prefix + f"0{sep}weight"] == {
        "_orig_size": torch.Size([5, 3]), "_orig_name": "_fsdp_wrapped_module._fpw_module.0.weight"}
    assert (meta["world_size"], meta["rank"], meta["flatten_info"]) == (1, 0, {})
    assert [n for n, _ in model.get_original_names_and_sharded_parameters()] == [
        "0.weight", "0.bias", "2.weight", "2.bias"]
    shard = model.state_dict()[prefix + f"0{sep}weight"].cpu()
    assert torch.equal(shard[:15], _small()[0].weight.detach().flatten())
    assert torch.equal(shard[15:], torch.zeros(113))  # the padding
    rows = FSDP(nn.Linear(3, 5), shard_param_on_dim_0=True)
    assert sorted(tuple(p.shape) for p in rows.parameters()) == [(5,), (5, 3)]  # multiple 1


def test_gradient_divide_factors():
    factor = FSDP._get_gradient_predivide_factor
    assert [factor(w) for w in (1, 2, 4, 8, 16, 64)] == [1.0, 2.0, 2.0, 4.0, 4.0, 8.0]
    model = FSDP(nn.Sequential(FSDP(nn.Linear(2, 2)), nn.Linear(2, 2)))
    assert (model.gradient_predivide_factor, model.gradient_postdivide_factor) == (1.0, 1.0)
    model.set_gradient_divide_factors(1, 1, recursive=True)
    inner = model.module.module[0]
    assert inner.reduce_scatter_op.scale == 1.0  # 1 / world_size
    model.set_gradient_divide_factors(2.0, 4.0, recursive=False)
    assert (model.gradient_predivide_factor, inner.gradient_predivide_factor) == (2.0, 1)


def test_training_in_one_process_matches_cpu():
    policy = functools.partial(wrap.transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(transformer(), auto_wrap_policy=policy, flatten_parameters=True)
    ref = transformer()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    x, y = torch.randn(2, 4, 8), torch.randn(2, 4, 4)
    for _ in range(3):
        for m, opt, dev in ((model, opts[0], DEV), (ref, opts[1], "cpu")):
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            m.loss = loss.item()
        xm.mark_step()
        assert abs(model.loss - ref.loss) < 1e-5


def test_wrap_policies():
    model = nn.Sequential(nn.Linear(10, 10), nn.Sequential(nn.Linear(10, 100), nn.ReLU()),
                          nn.ModuleList([nn.Linear(100, 1)]))
    size = functools.partial(wrap.size_based_auto_wrap_policy, min_num_params=1000)
    assert size(module=model, recurse=True, unwrapped_params=2000)
    assert not size(module=model[2], recurse=False, unwrapped_params=2000)  # ModuleList
    assert not size(module=nn.MultiheadAttention(4, 2), recurse=True, unwrapped_params=10**9)
    assert wrap.always_wrap_policy() is True
    lam = functools.partial(wrap.lambda_auto_wrap_policy, lambda_fn=lambda m: m is model[0])
    assert lam(module=model[0], recurse=False, unwrapped_params=0)
    seen = []

    def recorder(m, **kwargs):
        seen.append(m)
        return m

    out, wrapped = wrap.recursive_wrap(model, size, recorder, set(), set(),
                                       only_wrap_children=True)
    assert out is model and seen == [model[1][0]] and wrapped == 1100  # Linear(10, 100)
    transformer_policy = functools.partial(wrap.transformer_auto_wrap_policy,
                                           transformer_layer_cls={nn.ReLU})
    seen.clear()
    wrap.recursive_wrap(model, transformer_policy, recorder, set(), set())
    assert seen == [model[1][1]]


def test_checkpoint_module_packs_kwargs_and_skips_without_grad():
    class Scale(nn.Module):
        def forward(self, x, factor=1.0):
            return x * factor

    m = checkpoint_module(Scale())
    x = torch.ones(2, requires_grad=True)
    y = m(x, factor=3.0)
    assert y.grad_fn.__class__.__name__ == "CheckpointFunctionBackward"
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0))
    assert m(torch.ones(2), factor=2.0).grad_fn is None  # nothing requires grad: plain forward


def test_consolidation_restores_buffer_dtype_and_flat_parameters():
    policy = functools.partial(wrap.transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(transformer(), auto_wrap_policy=policy, flatten_parameters=True,
                 buffer_dtype=torch.bfloat16)
    assert model.module.module.in_scale.dtype == torch.bfloat16
    sd = {k: v.cpu() for k, v in model.state_dict().items()}
    meta = model.get_shard_metadata()
    assert meta["buffer_info"] == {"_fsdp_wrapped_module.in_scale":
                                   {"_orig_dtype": torch.float32}}
    full = consolidate_sharded_state_dicts([sd], meta)
    want = transformer().state_dict()
    assert set(full) == set(want) and full["in_scale"].dtype == torch.float32
    for k, v in want.items():
        torch.testing.assert_close(full[k], v, rtol=0, atol=0 if k != "in_scale" else 1e-2)


def test_replace_data_swaps_shape_dtype_and_keeps_the_parameter():
    p = nn.Parameter(torch.randn(4, 3).to(DEV))
    view = p.t()
    new = torch.arange(12.).reshape(4, 3).to(DEV)
    _C._replace_data(p, torch.zeros(1, device=DEV))
    assert p.shape == (1,) and p._version == 0 and p.requires_grad
    _C._replace_data(p, new.to(torch.bfloat16))
    assert p.shape == (4, 3) and p.dtype == torch.bfloat16
    _C._replace_data(p, new)
    torch.testing.assert_close(view.cpu(), new.cpu().t())  # views follow the new data
    # A plain `.data =` swaps the data too on torch 2.x (torch 1.13's functionalization
    # ignored it, which is why _replace_data exists); both keep the parameter object.
    p.data = torch.zeros(1, device=DEV)
    assert p.shape == (1,) and p.requires_grad


def test_optimization_barrier_is_a_checked_no_op():
    t = torch.ones(2).to(DEV)
    xm.optimization_barrier_([t])
    with pytest.raises(TypeError, match="expects tensors"):
        xm.optimization_barrier_([1.0])


def test_bucketed_reduce_scatter_and_meta_init_train_like_cpu():
    """reduce_scatter_bucket_size_mb > 0 (several gradients per collective) and a module built
    on the meta device (materialized with reset_parameters) still train like CPU eager."""
    meta = nn.Linear(6, 3, device="meta")
    model = FSDP(meta, reduce_scatter_bucket_size_mb=1)
    assert model.module.module.weight.device == DEV  # the (freed) full parameter
    ref = nn.Linear(6, 3)
    with torch.no_grad():  # the same weights (reset_parameters drew random ones)
        for (n, shard), p in zip(model.get_original_names_and_sharded_parameters(),
                                 ref.parameters()):
            p.copy_(shard.cpu()[:p.numel()].view_as(p))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    x = torch.randn(5, 6)
    for _ in range(2):
        for m, opt, dev in ((model, opts[0], DEV), (ref, opts[1], "cpu")):
            opt.zero_grad()
            loss = m(x.to(dev)).pow(2).mean()
            loss.backward()
            opt.step()
            m.loss = loss.detach()  # not the graph: its hooks would tie it to the module
        xm.mark_step()
        torch.testing.assert_close(model.loss.cpu(), ref.loss.detach())


def test_apply_backward_optimization_barrier_keeps_gradients():
    import torch_spmd.distributed.spmd as xs
    torch.manual_seed(0)
    model, ref = nn.Linear(3, 2).to(DEV), nn.Linear(3, 2)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    xs.apply_backward_optimization_barrier(model)
    x = torch.randn(4, 3)
    model(x.to(DEV)).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad)
