"""Experimental APIs, at PyTorch/XLA's ``torch_xla.experimental`` paths.

- ``spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel`` (alias ``FSDPv2``): FSDP
  through sharding annotations, with the auto-wrap policies of ``torch_spmd.distributed.wrap``
  re-exported here for convenience.
- ``distributed_checkpoint``: sharded checkpoints that reshard on load
  (``torch_spmd.distributed.checkpoint``).
"""
from ..distributed.wrap import (always_wrap_policy, lambda_auto_wrap_policy, recursive_wrap,
                                size_based_auto_wrap_policy, transformer_auto_wrap_policy)
from .spmd_fully_sharded_data_parallel import FSDPv2, SpmdFullyShardedDataParallel

__all__ = [
    "SpmdFullyShardedDataParallel",
    "FSDPv2",
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "recursive_wrap",
]
