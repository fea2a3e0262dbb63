"""PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint._helpers`` names that its
scripts and tests import, in terms of torch_spmd's checkpoint code: a host copy of a state
dict with its sharded tensors as host shards (``_sharded_cpu_state_dict``, torch_spmd's
``stage_state_dict``), the class of those shards (``_CpuShards``, torch_spmd's ``HostShards``)
and whether a value is a sharded tensor (``_is_sharded_tensor``)."""
from typing import Any

from ...distributed.checkpoint.planners import HostShards as _CpuShards
from ...distributed.checkpoint.planners import stage_state_dict as _sharded_cpu_state_dict
from ...distributed.spmd.xla_sharded_tensor import ShardingType, XLAShardedTensor

__all__ = ["_CpuShards", "_sharded_cpu_state_dict", "_is_sharded_tensor"]


def _is_sharded_tensor(x: Any) -> bool:
    """Whether ``x`` is an ``XLAShardedTensor`` whose data is split over devices (not
    replicated), as PyTorch/XLA's helper answers."""
    return isinstance(x, XLAShardedTensor) and x.sharding_type not in (
        None, ShardingType.REPLICATED)
