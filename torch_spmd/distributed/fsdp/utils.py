"""FSDP helpers (PyTorch/XLA's ``torch_xla.distributed.fsdp.utils``): ``checkpoint_module``,
the patched ``nn.Linear`` whose backward reads the weight parameter itself, the bucketed
gradient reduce-scatter, and dummy collectives for debugging."""
from types import MethodType

import torch

from ...core import xla_model as xm
from ... import runtime as xr
from ...utils.checkpoint import checkpoint


def checkpoint_module(module):
    """Wraps ``module.forward`` with activation checkpointing (``torch_spmd.utils.checkpoint``):
    its activations are not kept after forward and are recomputed in backward.

    Keyword arguments are packed into positional ones (the reentrant checkpoint takes none).
    When no input requires grad there is nothing to checkpoint and ``forward`` runs as is.
    Returns ``module`` (changed in place).
    """

    def _xla_checkpointed_forward_no_kwargs(m, num_args, num_kwargs, *packed_args):
        assert num_args + num_kwargs * 2 == len(packed_args)
        args = packed_args[:num_args]
        kwargs = packed_args[num_args:]
        kwargs = dict(zip(kwargs[:num_kwargs], kwargs[num_kwargs:]))
        return m._xla_checkpointed_forward_original(*args, **kwargs)

    def _forward_with_checkpoint(m, *args, **kwargs):
        packed_args = args + tuple(kwargs.keys()) + tuple(kwargs.values())
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in packed_args):
            return checkpoint(m._xla_checkpointed_forward_no_kwargs, len(args), len(kwargs),
                              *packed_args)
        # No input requires grad: the module's own parameters may, but the reentrant
        # checkpoint could not propagate to them, so run the forward plainly.
        return m._xla_checkpointed_forward_original(*args, **kwargs)

    assert isinstance(module, torch.nn.Module)
    module._xla_checkpointed_forward_original = module.forward
    module._xla_checkpointed_forward_no_kwargs = MethodType(
        _xla_checkpointed_forward_no_kwargs, module)
    module.forward = MethodType(_forward_with_checkpoint, module)
    return module


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear`` whose backward reads the ``weight`` *parameter* it was given.

    Plain ``F.linear`` saves ``weight.t()``, a separate tensor; FSDP swaps the full parameter's
    data between forward and backward, and wants backward to use the re-gathered data. Saving
    the parameter itself makes that explicit (a saved view would also follow the swap here, but
    only once it is read again).
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        with torch.no_grad():
            return torch._C._nn.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if input.dim() > 2:
            input_flat = input.flatten(start_dim=0, end_dim=-2)
            grad_output_flat = grad_output.flatten(start_dim=0, end_dim=-2)
        else:
            input_flat, grad_output_flat = input, grad_output
        if ctx.needs_input_grad[0]:
            grad_input = grad_output_flat.mm(weight)
            if input.dim() > 2:
                grad_input = grad_input.view(*input.size())
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output_flat.t().mm(input_flat)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output_flat.sum(0)
        return grad_input, grad_weight, grad_bias


def _xla_patched_nn_linear_forward(m, input):
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


def apply_xla_patch_to_nn_linear(module, patched_function=_xla_patched_nn_linear_forward):
    """Makes every ``nn.Linear`` in ``module`` (whose forward is still ``nn.Linear.forward``,
    also under ``checkpoint_module``) use ``patched_function``. Returns ``module``."""

    def _try_patching_forward_method(m, forward_method_name="forward"):
        forward_method = getattr(m, forward_method_name, None)
        if forward_method is None:
            return
        if getattr(forward_method, "__func__", None) != torch.nn.Linear.forward:
            return
        m._nn_linear_forward_original = forward_method
        setattr(m, forward_method_name, MethodType(patched_function, m))

    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            _try_patching_forward_method(m, "forward")
            _try_patching_forward_method(m, "_xla_checkpointed_forward_original")
    return module


def dummy_all_gather(value, dim=0, groups=None):
    """Same output shape as ``xm.all_gather``, no communication (debugging)."""
    repeat_num = [1] * value.dim()
    repeat_num[dim] = xr.world_size()
    return value.repeat(tuple(repeat_num))


def dummy_all_reduce(reduce_type, inputs, scale=1.0, groups=None):
    """Same output shape as ``xm.all_reduce``, no communication (debugging)."""
    if isinstance(inputs, torch.Tensor):
        return inputs * scale
    return [t.mul_(scale) for t in inputs]


class DummyReduceScatter:
    """Same output shape as the reduce-scatter, keeping this rank's slice (debugging)."""

    def __init__(self, shard_count):
        assert shard_count == xr.world_size()
        self.scale = 1.0

    def __call__(self, input, callback, predivide=1.0):
        shard_size = input.size(0) // xr.world_size()
        begin = shard_size * xr.global_ordinal()
        callback(input[begin:begin + shard_size] / predivide)

    def flush(self):
        pass


class BucketizedReduceScatter:
    """Reduce-scatters gradients in buckets of about ``bucket_size_mb`` (0: one per tensor),
    calling each tensor's callback with its reduced shard.

    ``predivide``: the inputs are to be divided by it before the sum. It is applied as part of
    the collective's ``scale`` instead (exact for powers of two, which FSDP's factors are), so
    no gradient-sized quotient is ever materialized; tensors with different factors go to
    different buckets.
    """

    def __init__(self, bucket_size_mb, shard_count, groups, pin_layout) -> None:
        self.bucket_size_bytes = bucket_size_mb * 1024 * 1024
        self.shard_count = shard_count
        self.groups = groups
        self.pin_layout = pin_layout
        self.scale = 1.0
        self.callbacks = []
        self.bucket = []
        self.bucket_watermark = 0
        self.bucket_predivide = 1.0

    def __call__(self, input, callback, predivide=1.0):
        if self.bucket and predivide != self.bucket_predivide:
            self.flush()
        self.bucket_predivide = predivide
        self.bucket.append(input)
        self.callbacks.append(callback)
        self.bucket_watermark += input.element_size() * input.numel()
        if self.bucket_watermark > self.bucket_size_bytes:
            self.flush()

    def flush(self):
        if not self.bucket:
            return
        inputs = self.bucket[0] if len(self.bucket) == 1 else self.bucket
        results = xm.reduce_scatter(xm.REDUCE_SUM, inputs,
                                    scale=self.scale / self.bucket_predivide, scatter_dim=0,
                                    shard_count=self.shard_count, groups=self.groups,
                                    pin_layout=self.pin_layout)
        if len(self.bucket) == 1:
            results = [results]
        for cb, result in zip(self.callbacks, results):
            cb(result)
        self.bucket.clear()
        self.callbacks.clear()
        self.bucket_watermark = 0
