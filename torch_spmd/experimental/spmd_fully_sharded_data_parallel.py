"""FSDPv2: fully sharded data parallelism expressed as sharding annotations.

PyTorch/XLA's ``torch_xla.experimental.spmd_fully_sharded_data_parallel`` for torch_spmd. The
wrapper does not gather or scatter anything itself: it shards every parameter along the mesh's
``'fsdp'`` axis and the forward output's batch dim along it too, and the partitioner then
derives the FSDP algorithm (all-gather a parameter where it is used whole, reduce-scatter its
gradient back to the shard) from those annotations at ``mark_step``.

  >>> mesh = xs.Mesh(np.arange(8), (8,), ('fsdp',))
  >>> model = FSDPv2(MyModel(), mesh=mesh)
  >>> loss = model(x).sum(); loss.backward(); opt.step(); xm.mark_step()
"""
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.nn as nn

from .. import _C
from .._impl.device import device as _spmd_device
from ..distributed import spmd
from ..distributed.wrap import check_wrappable, recursive_wrap

__all__ = ["SpmdFullyShardedDataParallel", "FSDPv2"]


def _prepare_spmd_partition_spec(param: torch.Tensor, extra_data_axis: Optional[str] = None,
                                 shard_maximal: bool = False) -> tuple:
    """The FSDP spec of a tensor: ``'fsdp'`` on dim 0 (or, with ``shard_maximal``, on the first
    largest dim), combined with ``extra_data_axis`` as ``(extra_data_axis, 'fsdp')`` when given;
    every other dim replicated. Scalars are replicated (empty spec)."""
    shape = param.shape
    partition_spec = [None] * len(shape)
    if len(partition_spec) == 0:
        return tuple(partition_spec)
    index = 0
    if shard_maximal:
        index = list(shape).index(max(shape))  # the first one on ties
    partition_spec[index] = "fsdp"
    if extra_data_axis:
        partition_spec[index] = (extra_data_axis, "fsdp")
    return tuple(partition_spec)


def _model_output_tensor(output: Mapping) -> Optional[torch.Tensor]:
    """The tensor FSDPv2 shards of a Hugging Face ``ModelOutput``: ``logits`` where it is a
    tensor, else the first tensor value with a dim (None if there is none)."""
    logits = output.get("logits")
    if isinstance(logits, torch.Tensor):
        return logits
    for value in output.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value
    return None


class SpmdFullyShardedDataParallel(nn.Module):
    """Wraps ``module`` for FSDP via SPMD sharding annotations.

    Args:
      module: the module to wrap; it must define its own ``forward`` (not ``nn.ModuleList`` or
        ``nn.ModuleDict``) and must not be an ``SpmdFullyShardedDataParallel`` already. Apply
        gradient checkpointing first if wanted: ``FSDPv2(checkpoint_module(m), mesh=mesh)``.
      mesh: keyword-only; a mesh with an axis named ``'fsdp'``. Defaults to the global mesh
        (``xs.set_global_mesh``).
      shard_output: ``shard_output(output, mesh)`` annotates the forward output. The default
        shards dim 0 of a tensor output over ``'fsdp'`` (over ``(extra_data_axis, 'fsdp')`` when
        given); for a tuple only its first element, with a warning; for Hugging Face's
        ``ModelOutput`` its ``logits`` (else its first tensor field with a dim); anything else
        (a plain dict included) raises RuntimeError, as in PyTorch/XLA.
      auto_wrap_policy: wraps submodules first, through ``recursive_wrap`` (policies in
        ``torch_spmd.distributed.wrap``); the children get this mesh and ``shard_output``.
      auto_wrapper_callable: the wrapper used for the children (default this class).
      extra_data_axis: a further mesh axis the batch is split over (e.g. ``'data'`` in a
        ``('data', 'fsdp')`` mesh). Used for the output only: parameters are replicated over it.

    The module is moved to the spmd device. Every parameter that has no sharding yet gets
    ``'fsdp'`` on its largest dim (the first on ties; scalars are replicated); parameters the
    caller sharded before wrapping (e.g. tensor-parallel specs) are left alone.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh: Optional[spmd.Mesh] = None,
        shard_output: Optional[Callable] = None,
        auto_wrap_policy: Optional[Callable] = None,
        auto_wrapper_callable: Optional[Callable] = None,
        extra_data_axis: Optional[str] = None,
    ):
        check_wrappable(module, SpmdFullyShardedDataParallel)
        if mesh is None:
            mesh = spmd.get_global_mesh()
            if mesh is None:
                raise ValueError(
                    "No mesh is provided and no global mesh is set. Please provide a mesh.")
        # An unnamed mesh has no 'fsdp' axis either (PyTorch/XLA raises TypeError there).
        axis_names = mesh.axis_names or ()
        if "fsdp" not in axis_names:
            raise ValueError("The mesh must have an axis named 'fsdp'.")
        if extra_data_axis and extra_data_axis not in axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")

        super().__init__()

        wrapper_cls = auto_wrapper_callable or SpmdFullyShardedDataParallel
        if auto_wrap_policy is not None:
            auto_wrap_kwargs = {
                "module": module,
                "auto_wrap_policy": auto_wrap_policy,
                "wrapper_cls": wrapper_cls,
                "ignored_modules": [],
                "ignored_params": [],
                "only_wrap_children": True,  # this instance wraps the root
            }
            # As in PyTorch/XLA, children get the mesh and shard_output only (not
            # extra_data_axis, not the policy: recursive_wrap already recurses).
            fsdp_kwargs = dict(mesh=mesh, shard_output=shard_output)
            self._auto_wrap(auto_wrap_kwargs, fsdp_kwargs)

        self._orig_module = module.to(_spmd_device())
        self._mesh = mesh

        # Only parameters nobody sharded yet: wrapped children and caller-chosen specs (2-D
        # sharding) keep theirs, and an outer wrapper picks up the leftovers.
        for param in module.parameters():
            if _C._get_sharding_spec(param) != "":
                continue
            spmd.mark_sharding(param, mesh,
                               _prepare_spmd_partition_spec(param, shard_maximal=True))

        spmd.apply_backward_optimization_barrier(module)  # a documented no-op here

        if shard_output is None:

            def shard_output_impl(output, mesh):
                real_output = None
                if isinstance(output, torch.Tensor):
                    real_output = output
                elif isinstance(output, Mapping) and hasattr(output, "to_tuple"):
                    # Hugging Face's ModelOutput (an OrderedDict with to_tuple): its logits,
                    # else its first tensor field. Not the first field as such: with labels
                    # given that is the scalar loss, which has no batch dim to shard. (Other
                    # mappings raise below, as in PyTorch/XLA.)
                    real_output = _model_output_tensor(output)
                elif isinstance(output, tuple):
                    real_output = output[0] if isinstance(output[0], torch.Tensor) else None
                    warnings.warn(
                        "The output is a tuple, but only the first element is sharded. If this "
                        "is not intended, please provide your own shard_output callable.")
                if real_output is None:
                    raise RuntimeError(
                        f"The output type is not supported: {type(output)}. Please provide "
                        "your own shard_output callable.")
                spmd.mark_sharding(real_output, mesh,
                                   _prepare_spmd_partition_spec(real_output, extra_data_axis))

            shard_output = shard_output_impl

        self._shard_output = shard_output

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``DDP.module``)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        # The output annotation is what makes the partitioner keep the batch split over
        # 'fsdp' (data parallel) instead of gathering activations around sharded weights.
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str) -> Union[torch.Tensor, nn.Module]:
        """Attributes this wrapper lacks come from the wrapped module."""
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules
        except AttributeError:
            if name == "_orig_module":  # not set yet: no recursion through .module
                raise
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Indexing goes to the wrapped module (e.g. an ``nn.Sequential``)."""
        return self.module.__getitem__(key)

    def _auto_wrap(self, auto_wrap_kwargs: Dict[str, Any], fsdp_kwargs: Dict[str, Any]) -> None:
        """Wraps the root module's children with ``recursive_wrap`` (the root itself is this
        instance). Submodules must not be wrapped already: double wrapping is not supported."""
        auto_wrap_policy = auto_wrap_kwargs["auto_wrap_policy"]
        root_module = auto_wrap_kwargs["module"]
        assert auto_wrap_policy is not None
        for module_name, module in root_module.named_modules():
            if isinstance(module, SpmdFullyShardedDataParallel):
                raise ValueError(f"Expected {module_name} to NOT be SpmdFullyShardedDataParallel "
                                 "if using an `auto_wrap_policy`")
        recursive_wrap(**auto_wrap_kwargs, **fsdp_kwargs)


FSDPv2 = SpmdFullyShardedDataParallel
