"""PyTorch/XLA's ``torch_xla.distributed.spmd`` (``xs``) for torch_spmd.

  >>> import torch_spmd.distributed.spmd as xs
  >>> mesh = xs.Mesh(np.arange(8), (4, 2), ('data', 'model'))
  >>> xs.mark_sharding(t, mesh, ('data', 'model'))
"""
from .xla_sharded_tensor import XLAShard, XLAShardedTensor
from .mesh import HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh
from .xla_sharding import (EinsumLinear, MarkShardingFunction, ShardingSpec, ShardingType,
                           XLAPatchedLinear, _mark_manual_sharding, annotate_custom_sharding,
                           apply_backward_optimization_barrier, apply_xla_patch_to_nn_linear,
                           clear_sharding, disable_manual_sharding, enable_manual_sharding,
                           get_sharding_spec, mark_sharding, mark_sharding_with_gradients,
                           shard_as, unwrap_sharded_tensor, wrap_as_sharded_tensor,
                           wrap_if_sharded, xla_patched_nn_linear_forward)
from .api import auto_policy, xla_distribute_module, xla_distribute_tensor
from .debugging import visualize_sharding, visualize_tensor_sharding
from ._barriers import apply_backward_optimization_barrier

__all__ = [
    "XLAShard",
    "XLAShardedTensor",
    "Mesh",
    "HybridMesh",
    "ShardingType",
    "ShardingSpec",
    "mark_sharding",
    "clear_sharding",
    "get_1d_mesh",
    "wrap_if_sharded",
    "set_global_mesh",
    "get_global_mesh",
    "get_sharding_spec",
    "wrap_as_sharded_tensor",
    "unwrap_sharded_tensor",
    "visualize_sharding",
    "visualize_tensor_sharding",
    "apply_backward_optimization_barrier",
    "auto_policy",
    "XLAPatchedLinear",
    "EinsumLinear",
    "MarkShardingFunction",
    "mark_sharding_with_gradients",
    "shard_as",
    "annotate_custom_sharding",
    "xla_distribute_tensor",
    "xla_distribute_module",
    "xla_patched_nn_linear_forward",
    "apply_xla_patch_to_nn_linear",
    "_mark_manual_sharding",
    "enable_manual_sharding",
    "disable_manual_sharding",
]
