"""Sharding annotations: ``mark_sharding``, ``clear_sharding``, ``ShardingSpec`` and helpers,
mirroring ``torch_xla.distributed.spmd.xla_sharding`` (meshes live in ``mesh.py`` and are
re-exported here, so ``from ...xla_sharding import Mesh`` works as in PyTorch/XLA).
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

import torch

from ... import _C
from ..._impl.device import is_spmd_tensor
from ... import runtime as xr
from . import _partition_spec
from ._partition_spec import PartitionSpec, _get_sharding_type  # noqa: F401
from ._sharding_type import ShardingType
from .mesh import HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh  # noqa: F401
from .xla_sharded_tensor import XLAShard, XLAShardedTensor, _unwrap  # noqa: F401


def wrap_as_sharded_tensor(t: Union[torch.Tensor, XLAShardedTensor],
                           mesh_shape=None,
                           partition_spec=None) -> XLAShardedTensor:
    """``t`` as an XLAShardedTensor (``t`` itself if it already is one), recording the mesh
    shape and partition spec when given (which invalidates the cached DTensor ``_spec``)."""
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    if mesh_shape is not None:
        t.mesh_shape = mesh_shape
    if partition_spec is not None:
        t.partition_spec = partition_spec
    if mesh_shape is not None or partition_spec is not None:
        t.invalidate_spec_cache()
    return t


def unwrap_sharded_tensor(t: Union[torch.Tensor, XLAShardedTensor]) -> torch.Tensor:
    """The plain spmd tensor behind ``t``.

    Besides a wrapper itself this unwraps the result of an op that mixed a wrapper with plain
    spmd tensors when it was called below ``__torch_function__`` (e.g. from ``__torch_dispatch__``
    or autograd): functionalization (which runs before ``__torch_dispatch__``) hands that back as
    a functional tensor around the wrapper the op returned.
    """
    return _unwrap(t)


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
    return _annotate(t, mesh, partition_spec, _C._mark_sharding, "mark_sharding")


def _annotate(t, mesh: Mesh, partition_spec: PartitionSpec, annotate, what: str
              ) -> XLAShardedTensor:
    """``annotate(tensor, *sharding args)`` (a C++ annotation call) after PyTorch/XLA's
    checks; ``t`` wrapped as an XLAShardedTensor."""
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
    _check_spmd_tensor(tensor, what)
    annotate(tensor, *args)
    wrapper = wrap_as_sharded_tensor(t if isinstance(t, XLAShardedTensor) else tensor,
                                     mesh.mesh_shape, partition_spec)
    wrapper._mesh = mesh  # device order and axis names for the DTensor view (``_spec``)
    wrapper._device_mesh = None
    return wrapper


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
            is_spmd_tensor(x) and _C._get_sharding_spec(unwrap_sharded_tensor(x)) != ""):
        return XLAShardedTensor(unwrap_sharded_tensor(x))
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


# ---------------------------------------------------------------------------------------------
# Annotations on intermediates, with gradients; sharding hints between tensors.

class MarkShardingFunction(torch.autograd.Function):
    """``mark_sharding`` on a copy of a tensor and on the gradient flowing back into it.

    ``MarkShardingFunction.apply(t, mesh, partition_spec)`` returns a new tensor (``t`` is left
    as it is) whose value is ``t`` constrained to the sharding; in the backward pass the
    incoming gradient gets the same constraint. The values are those of ``t`` and its gradient:
    only the layout the partitioner uses changes.
    """

    @staticmethod
    def forward(ctx, torch_tensor: torch.Tensor, mesh: Mesh, partition_spec) -> torch.Tensor:
        ctx.mesh = mesh
        ctx.partition_spec = partition_spec
        return _aot_constrained_copy(torch_tensor, mesh, partition_spec)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _aot_constrained_copy(grad_output, ctx.mesh, ctx.partition_spec), None, None


def _constrained_copy(t: torch.Tensor, mesh: Mesh, partition_spec) -> torch.Tensor:
    if t is None:
        return None
    out = unwrap_sharded_tensor(t).clone()  # a pending value: the annotation is a constraint
    return mark_sharding(out, mesh, partition_spec).global_tensor


def _aot_constrained_copy(t: Optional[torch.Tensor], mesh: Mesh, partition_spec):
    """``_constrained_copy`` through the op ``xla::aot_mark_sharding`` (mesh and spec as
    strings, as PyTorch/XLA's), so that AOTAutograd and dynamo keep it in the graphs they
    capture; its fake kernel gives an empty tensor of the input's type."""
    if t is None:
        return None
    op = _aot_mark_sharding_op()
    if op is None:  # (a real torch_xla in this process owns the name)
        return _constrained_copy(t, mesh, partition_spec)
    return op(unwrap_sharded_tensor(t), str(mesh), str(_partition_spec.normalize(partition_spec)))


def _aot_mark_sharding_op():
    if not hasattr(_aot_mark_sharding_op, "op"):
        try:
            @torch.library.custom_op("xla::aot_mark_sharding", mutates_args=())
            def aot_mark_sharding(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
                import ast
                return _constrained_copy(t, Mesh.from_str(mesh), ast.literal_eval(partition_spec))

            @aot_mark_sharding.register_fake
            def _(t, mesh, partition_spec):
                return torch.empty_like(t)

            _aot_mark_sharding_op.op = aot_mark_sharding
        except RuntimeError:
            _aot_mark_sharding_op.op = None
    return _aot_mark_sharding_op.op


def mark_sharding_with_gradients(t: Union[torch.Tensor, XLAShardedTensor], mesh: Mesh,
                                 partition_spec: PartitionSpec) -> torch.Tensor:
    """Not in place, unlike ``mark_sharding``: returns a new tensor equal to ``t`` carrying the
    sharding, and annotates the gradient of that tensor with the same sharding in the backward
    pass (``MarkShardingFunction``). ``t`` itself keeps its annotation (or none)."""
    assert len(t.shape) == len(partition_spec), \
        (f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
         f"({len(t.shape)}).")
    r = MarkShardingFunction.apply(unwrap_sharded_tensor(t), mesh, partition_spec)
    assert isinstance(r, torch.Tensor)
    return r


def annotate_custom_sharding(t: Union[torch.Tensor, XLAShardedTensor], mesh: Mesh,
                             partition_spec: PartitionSpec) -> XLAShardedTensor:
    """Annotates ``t`` in place with a sharding constraint on its current value, as PyTorch/XLA
    adds a custom sharding node: unlike ``mark_sharding``, a tensor that already has another
    sharding may be annotated, and its device data is not laid out again now; the step that
    computes the constrained value reshards it (with the collectives that takes), and the tensor
    keeps the new sharding from then on. Returns ``t`` wrapped as an XLAShardedTensor."""
    return _annotate(t, mesh, partition_spec, _C._constrain_sharding, "annotate_custom_sharding")


def shard_as(a, b):
    """Makes corresponding tensors of the pytrees ``a`` and ``b`` sharded alike (PyTorch/XLA:
    JAX's ``shard_alike``). Returns ``(a, b)``.

    Where one tensor of a pair has a sharding and the other none, the other is annotated with it
    (in place, as ``mark_sharding``). Where both have one they must agree (ValueError otherwise).
    Where neither has one yet (typically pending intermediates), nothing is annotated and the
    partitioner's propagation decides, independently for each; values are never affected.
    """
    from torch.utils._pytree import tree_flatten
    a_flat, a_spec = tree_flatten(a)
    b_flat, b_spec = tree_flatten(b)
    assert a_spec == b_spec, f"a and b must have the same structure. got {a_spec} and {b_spec}"
    for x, y in zip(a_flat, b_flat):
        if x is None or y is None:
            assert x is None and y is None
            continue
        px, py = unwrap_sharded_tensor(x), unwrap_sharded_tensor(y)
        sx, sy = _C._get_sharding_spec(px), _C._get_sharding_spec(py)
        if sx and sy:
            if sx != sy:
                raise ValueError(f"shard_as: the tensors are already sharded differently: "
                                 f"{sx} and {sy}")
        elif sx or sy:
            src, dst = (px, py) if sx else (py, px)
            axes = _C._get_sharding_axes(src)
            if axes is None:
                raise NotImplementedError(
                    "shard_as: the source sharding " + (sx or sy) + " has no mesh form")
            assert tuple(src.shape) == tuple(dst.shape), \
                f"shard_as: shapes differ: {tuple(px.shape)} and {tuple(py.shape)}"
            _check_spmd_tensor(dst, "shard_as")
            _C._mark_sharding(dst, axes["device_ids"], axes["mesh_shape"], axes["axis_names"],
                              axes["dim_axes"])
    return a, b


# ---------------------------------------------------------------------------------------------
# Manual sharding (shard_map-like regions): needs C++ support torch_spmd does not have.

def _mesh_for(mesh: Optional[Mesh], api: str) -> Mesh:
    mesh = mesh if mesh is not None else get_global_mesh()
    if mesh is None:
        raise ValueError(f"{api} needs a mesh: pass mesh= or call xs.set_global_mesh first")
    return mesh


def _mark_manual_sharding(t: Union[torch.Tensor, XLAShardedTensor]) -> XLAShardedTensor:
    """Marks a value computed inside a manual region as ``{manual}`` (each device's buffer is a
    tensor of its own). Device data raises RuntimeError: only computed values can be manual."""
    tensor = unwrap_sharded_tensor(t)
    _check_spmd_tensor(tensor, "_mark_manual_sharding")
    _C._mark_manual_sharding(tensor)
    return wrap_as_sharded_tensor(tensor)


def enable_manual_sharding(t: Union[torch.Tensor, XLAShardedTensor], partition_spec: PartitionSpec,
                           *, mesh: Optional[Mesh] = None) -> XLAShardedTensor:
    """Enters a manual region: ``t`` is laid out as ``partition_spec`` on ``mesh`` (default the
    global mesh) and each device's (padded) shard becomes a tensor of its own, of the shard's
    shape, sharded ``{manual}``. Ops on it run on every device on its own buffer, with no
    collective; ``disable_manual_sharding`` turns the results back into a global tensor.

      >>> xs.set_global_mesh(xs.Mesh(np.arange(8), (1, 8)))
      >>> x = torch.zeros(8, 8).to(xm.xla_device())
      >>> xx = xs.enable_manual_sharding(x, (0, 1))        # shape (8, 1) on each device
      >>> y = xs.disable_manual_sharding(xx + 1, (0, 1), x.shape)   # (8, 8), sharded (0, 1)
    """
    mesh = _mesh_for(mesh, "enable_manual_sharding")
    tensor = unwrap_sharded_tensor(t)
    _check_spmd_tensor(tensor, "enable_manual_sharding")
    mark_sharding(tensor, mesh, partition_spec)
    return wrap_as_sharded_tensor(_C._spmd_full_to_shard_shape(tensor))


def disable_manual_sharding(t: Union[torch.Tensor, XLAShardedTensor], partition_spec: PartitionSpec,
                            full_shape: torch.Size, *,
                            mesh: Optional[Mesh] = None) -> XLAShardedTensor:
    """Leaves a manual region: the devices' manual tensors ``t`` become the shards of a
    ``full_shape`` tensor laid out as ``partition_spec`` on ``mesh`` (default the global mesh).
    ``t`` must be manual (from ``enable_manual_sharding`` and ops on it)."""
    mesh = _mesh_for(mesh, "disable_manual_sharding")
    partition_spec = _partition_spec.normalize(partition_spec)
    tensor = unwrap_sharded_tensor(t)
    _check_spmd_tensor(tensor, "disable_manual_sharding")
    full = _C._spmd_shard_to_full_shape(tensor, *mesh._sharding_args(partition_spec),
                                        [int(d) for d in full_shape])
    return wrap_as_sharded_tensor(full, mesh.mesh_shape, partition_spec)


# ---------------------------------------------------------------------------------------------
# nn.Linear through einsum (PyTorch/XLA keeps sharded batch dims from being flattened by matmul).

class XLAPatchedLinear(torch.autograd.Function):
    """``torch.nn.functional.linear`` computed with einsum, forward and backward, so that a
    sharded leading dim of the input is never flattened into a matmul dim."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor] = None):
        ctx.save_for_backward(input, weight, bias)
        product = torch.einsum('...n,mn->...m', input, weight)
        return product + bias if bias is not None else product

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.einsum('...m,mn->...n', grad_output, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.einsum('...m,...n->mn', grad_output, input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.einsum('...m->m', grad_output)
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m, input):
    """``m``'s linear layer applied with ``XLAPatchedLinear``."""
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


class EinsumLinear(torch.nn.Linear):
    """A ``torch.nn.Linear`` computed with einsum (``XLAPatchedLinear``)."""

    def forward(self, input):
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every ``nn.Linear`` in ``module`` (recursively) by an ``EinsumLinear`` holding
    the same parameter objects (their shardings kept). Returns ``module``."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device('meta'):
                einsum_linear = EinsumLinear(child.in_features, child.out_features,
                                             bias=child.bias is not None)
            # The same Parameter objects: shardings, gradients and optimizer references stay.
            einsum_linear.weight = child.weight
            einsum_linear.bias = child.bias
            einsum_linear.train(child.training)
            setattr(module, name, einsum_linear)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module
