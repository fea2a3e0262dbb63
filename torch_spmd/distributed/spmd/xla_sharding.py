"""Sharding annotations: ``mark_sharding``, ``clear_sharding``, ``ShardingSpec`` and helpers,
mirroring ``torch_xla.distributed.spmd.xla_sharding`` (meshes live in ``mesh.py`` and are
re-exported here, so ``from ...xla_sharding import Mesh`` works as in PyTorch/XLA).
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

import torch

from ... import _C
from ..._device import is_spmd_tensor
from ... import runtime as xr
from . import _partition_spec
from ._partition_spec import PartitionSpec, _get_sharding_type  # noqa: F401
from ._sharding_type import ShardingType
from .mesh import HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh  # noqa: F401
from .xla_sharded_tensor import XLAShard, XLAShardedTensor  # noqa: F401


def wrap_as_sharded_tensor(t: Union[torch.Tensor, XLAShardedTensor],
                           mesh_shape=None,
                           partition_spec=None) -> XLAShardedTensor:
    """``t`` as an XLAShardedTensor (``t`` itself if it already is one), recording the mesh
    shape and partition spec when given."""
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    if mesh_shape is not None:
        t.mesh_shape = mesh_shape
    if partition_spec is not None:
        t.partition_spec = partition_spec
    return t


def unwrap_sharded_tensor(t: Union[torch.Tensor, XLAShardedTensor]) -> torch.Tensor:
    """The plain spmd tensor behind ``t``."""
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def _check_spmd_tensor(t: torch.Tensor, api: str) -> None:
    if not is_spmd_tensor(t):
        device = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise RuntimeError(f"{api} needs a tensor on the spmd device (torch_spmd.device()), got "
                           f"one on {device}; move it there first, e.g. t.to(xm.xla_device())")


def mark_sharding(t: Union[torch.Tensor, XLAShardedTensor], mesh: Mesh,
                  partition_spec: PartitionSpec) -> XLAShardedTensor:
    """Annotates ``t`` in place with the sharding ``partition_spec`` describes on ``mesh`` and
    returns it wrapped as an XLAShardedTensor.

    ``partition_spec`` has one entry per dim of ``t``: a mesh axis index, an axis name, a tuple
    (or list) of those (the dim is tiled over all of them, first most major), or None
    (replicated). Mesh axes no entry uses replicate the tensor.

    Device data is laid out over the devices now (each device keeps only its shard); a pending
    value gets a sharding constraint that propagation respects. Annotating again with the same
    sharding is a no-op, over a replicated one re-lays the data out, and over a different
    non-replicated one raises RuntimeError ("Existing annotation must be cleared first").

    Example::

      >>> mesh = Mesh(np.arange(8), (4, 2), ('data', 'model'))
      >>> t = torch.randn(8, 32).to(xm.xla_device())
      >>> xs.mark_sharding(t, mesh, ('data', None))  # 4-way data parallel, 2 replicas each
    """
    partition_spec = _partition_spec.normalize(partition_spec)
    # Checked first, as in PyTorch/XLA: unspecified dims are never filled in with None.
    assert len(t.shape) == len(partition_spec), \
        (f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
         f"({len(t.shape)}).")
    num_devices = xr.global_runtime_device_count()
    # A mesh built before the device set was reconfigured no longer maps onto it.
    assert mesh.size() == num_devices, \
        f"{mesh.mesh_shape} is not mappable over {num_devices} devices."
    args = mesh._sharding_args(partition_spec)
    tensor = unwrap_sharded_tensor(t)
    _check_spmd_tensor(tensor, "mark_sharding")
    _C._mark_sharding(tensor, *args)
    return wrap_as_sharded_tensor(t, mesh.mesh_shape, partition_spec)


def clear_sharding(t: Union[torch.Tensor, XLAShardedTensor]) -> torch.Tensor:
    """Removes ``t``'s sharding annotation in place (device data is gathered back to a
    replicated layout) and returns the plain tensor (``global_tensor`` of a wrapper)."""
    tensor = unwrap_sharded_tensor(t)
    _check_spmd_tensor(tensor, "clear_sharding")
    _C._clear_sharding(tensor)
    return tensor


def wrap_if_sharded(x: Any) -> Any:
    """``x`` wrapped as an XLAShardedTensor if it is an spmd tensor with a sharding, else ``x``."""
    if (isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) and
            is_spmd_tensor(x) and _C._get_sharding_spec(x) != ""):
        return XLAShardedTensor(x)
    return x


def get_sharding_spec(t: Union[torch.Tensor, XLAShardedTensor]) -> str:
    """The sharding of ``t`` in XLA text form, ``""`` if it has none (PyTorch/XLA's
    ``_get_xla_sharding_spec``); accepts plain spmd tensors and wrappers."""
    return _C._get_sharding_spec(unwrap_sharded_tensor(t))


@dataclass
class ShardingSpec:
    """A mesh and partition spec to apply to tensors later (input pipelines:
    ``xm.send_cpu_data_to_device(..., input_sharding=spec)``).

    The spec is validated on construction. ``minibatch=True`` means each host loads only its
    slice of the batch; with a single host that is the whole batch, but the batch dim must
    still divide evenly over the devices.
    """
    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: Optional[bool] = False

    _dim_axes: List[List[int]] = field(init=False, repr=False)
    _sharding_type: ShardingType = field(init=False, repr=False)

    def __post_init__(self):
        self.partition_spec = _partition_spec.normalize(self.partition_spec)
        self._dim_axes = _partition_spec.to_dim_axes(self.mesh, self.partition_spec)
        self._sharding_type = _partition_spec.sharding_type_for(self.mesh, self.partition_spec)

    def xla_spec(self, t: torch.Tensor) -> Optional[str]:
        """The sharding ``t`` would get, in XLA text form; None if the spec does not fit its
        rank."""
        if not self.can_apply(t):
            return None
        return self.mesh.get_op_sharding(self.partition_spec)

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec fits ``t`` (same rank)."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        """``mark_sharding(t, mesh, partition_spec)``; ``t`` must be on the spmd device."""
        assert is_spmd_tensor(t), f"ShardingSpec.apply needs an spmd tensor, got one on {t.device}"
        mark_sharding(t, self.mesh, self.partition_spec)

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """A new spmd tensor with ``host``'s data laid out in this sharding directly (no
        transient replicated copy on every device)."""
        mesh = self.mesh
        return _C._upload_sharded(host, [int(d) for d in mesh.device_ids], list(mesh.mesh_shape),
                                  list(mesh.axis_names or ()), self._dim_axes)


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Accepted for PyTorch/XLA compatibility; deliberately does nothing.

    In PyTorch/XLA this registers a backward hook that puts ``xm.optimization_barrier_`` on a
    module's gradients, because XLA's common-subexpression elimination would otherwise merge
    the backward pass's parameter all-gathers with the forward pass's and keep every gathered
    (full) parameter alive from forward to backward, defeating FSDP's memory savings.

    torch_spmd's partitioner never merges nodes: each use of a sharded parameter that needs it
    whole gets its own all-gather, in forward and again in backward (test_fsdpv2.py counts
    them), so there is nothing to fence off.
    """
    del m
