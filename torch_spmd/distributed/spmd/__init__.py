"""PyTorch/XLA's ``torch_xla.distributed.spmd`` (``xs``) for torch_spmd.

  >>> import torch_spmd.distributed.spmd as xs
  >>> mesh = xs.Mesh(np.arange(8), (4, 2), ('data', 'model'))
  >>> xs.mark_sharding(t, mesh, ('data', 'model'))
"""
from .xla_sharded_tensor import XLAShard, XLAShardedTensor
from .mesh import HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh
from .xla_sharding import (ShardingSpec, ShardingType, apply_backward_optimization_barrier,
                           clear_sharding, get_sharding_spec,
                           mark_sharding, unwrap_sharded_tensor, wrap_as_sharded_tensor,
                           wrap_if_sharded)
from .debugging import visualize_sharding, visualize_tensor_sharding

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
]
