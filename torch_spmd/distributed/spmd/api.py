"""The DTensor bridge of PyTorch/XLA's ``torch_xla.distributed.spmd.api``:
``xla_distribute_tensor``, ``xla_distribute_module``, ``convert_to_xla_mesh``,
``convert_to_xla_partition_spec`` and ``auto_policy``.

A ``torch.distributed.DeviceMesh`` here describes the emulated devices: its device type may be
``"spmd"`` or ``"xla"`` (PyTorch/XLA scripts), its size must be the number of emulated devices.
``auto_policy`` (XLA's auto-sharding search) is not implemented: torch_spmd has no search over
shardings, so ``xla_distribute_module(..., partition_fn=auto_policy)`` raises
NotImplementedError (from ``runtime.use_spmd(auto=True)``).
"""
import inspect
import warnings
from typing import Callable, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..._impl.device import device as _spmd_device
from ... import runtime as xr
from ._sharding_type import ShardingType
from .mesh import Mesh
from .xla_sharded_tensor import XLAShardedTensor
from .xla_sharding import mark_sharding

_DEVICE_TYPES = ("spmd", "xla")


def auto_policy(mod_name, mod, mesh):
    """Marker for ``xla_distribute_module(partition_fn=auto_policy)``: auto-sharding
    (``use_spmd(auto=True)``) lays the module's parameters out; this leaves them alone."""
    return


def convert_to_xla_mesh(dt_mesh) -> Mesh:
    """The ``Mesh`` of a DeviceMesh (same device ids, shape and dim names)."""
    xr.use_spmd()
    assert dt_mesh.size() == xr.global_runtime_device_count()
    return Mesh(dt_mesh.mesh.flatten().tolist(), tuple(dt_mesh.mesh.size()),
                dt_mesh.mesh_dim_names)


def convert_to_xla_partition_spec(tensor: torch.Tensor, placements: Sequence) -> Tuple:
    """DTensor placements (one per mesh dim) as a partition spec (one entry per tensor dim):
    ``Shard(d)`` on mesh dim ``i`` puts ``i`` at entry ``d``; ``Replicate()`` adds nothing;
    other placements raise ValueError."""
    xr.use_spmd()
    sharding_spec = [None] * len(tensor.shape)
    for mesh_idx, spec in enumerate(placements):
        if spec.is_shard():
            sharding_spec[spec.dim] = mesh_idx
        elif spec.is_replicate():
            continue
        else:
            raise ValueError(f"Unsupported placement type: {type(spec).__name__}")
    return tuple(sharding_spec)


def xla_distribute_tensor(tensor: torch.Tensor, device_mesh,
                          placements: Optional[Sequence] = None) -> XLAShardedTensor:
    """``tensor`` moved to the spmd device and sharded per ``placements`` on ``device_mesh``
    (default: replicated); returns the XLAShardedTensor."""
    from torch.distributed.tensor.placement_types import Replicate
    xr.use_spmd()
    dt_mesh = device_mesh
    assert dt_mesh.device_type in _DEVICE_TYPES, \
        f"device_mesh.device_type must be one of {_DEVICE_TYPES}, got {dt_mesh.device_type!r}"
    xla_mesh = convert_to_xla_mesh(dt_mesh)
    assert xla_mesh.mesh_shape == tuple(dt_mesh.mesh.size())
    if type(tensor).__name__ == "DTensor":
        raise ValueError("Cannot distribute a DTensor with local tensor on xla devices."
                         "The input tensor must be global.")
    if not tensor.is_meta and not isinstance(tensor, XLAShardedTensor):
        tensor = tensor.to(_spmd_device())
    if placements is None:
        placements = [Replicate() for _ in range(dt_mesh.ndim)]
    assert len(placements) == dt_mesh.ndim, \
        ("`placements` must have the same length as `device_mesh.ndim`! "
         f"Found placements length: {len(placements)}, and device_mesh.ndim: {dt_mesh.ndim}.")
    partition_spec = convert_to_xla_partition_spec(tensor, placements)
    global_tensor = tensor
    if isinstance(tensor, XLAShardedTensor):
        sharding_type = tensor.sharding_type
        assert sharding_type is None or sharding_type == ShardingType.REPLICATED, \
            ("XLAShardedTensor `tensor` is already annotated with non-replication sharding. "
             "Clear the existing sharding annotation first, by callling "
             "torch_xla.distributed.spmd.clear_sharding API.")
        global_tensor = tensor.global_tensor
    result = mark_sharding(global_tensor, xla_mesh, partition_spec)
    result._device_mesh = dt_mesh  # ``result.device_mesh`` / ``_spec.mesh`` is this DeviceMesh
    return result


def _hook_arity(fn: Callable, kind: str) -> int:
    num_args = len(inspect.signature(fn).parameters)
    if num_args not in (2, 3):
        raise ValueError(f"{kind} should take in 3 arguments, but got {num_args} arguments!")
    if num_args == 2:
        warnings.warn(f"Deprecating {kind} that takes two arguments (inputs, device_mesh), "
                      f"please use {kind} that takes in (module, inputs, device_mesh) instead!")
    return num_args


def xla_distribute_module(module: nn.Module, device_mesh=None,
                          partition_fn: Optional[Callable] = None,
                          input_fn: Optional[Callable] = None,
                          output_fn: Optional[Callable] = None) -> nn.Module:
    """Applies ``partition_fn(name, submodule, device_mesh)`` to every submodule (parameters it
    leaves alone stay replicated) and installs ``input_fn`` / ``output_fn`` as forward pre- and
    post-hooks. ``partition_fn=auto_policy`` turns auto-sharding on (``use_spmd(auto=True)``)
    and moves the module to the device, as PyTorch/XLA's does."""
    xr.use_spmd()
    if partition_fn:
        if getattr(partition_fn, "__name__", "unknown") == "auto_policy":
            xr.use_spmd(auto=True)
            module = module.to(_spmd_device())
        for name, submod in module.named_modules():
            partition_fn(name, submod, device_mesh)
    if input_fn is not None:
        if _hook_arity(input_fn, "input_fn") == 2:
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, device_mesh))
        else:
            module.register_forward_pre_hook(
                lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        if _hook_arity(output_fn, "output_fn") == 2:
            module.register_forward_hook(
                lambda mod, inputs, outputs: output_fn(outputs, device_mesh))
        else:
            module.register_forward_hook(
                lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    return module
