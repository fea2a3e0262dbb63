"""PyTorch/XLA's FSDP (``torch_xla.distributed.fsdp``) for torch_spmd's multi-process mode.

``XlaFullyShardedDataParallel`` shards a module's parameters, gradients and optimizer state
across the replica processes (ZeRO-2 when wrapped once, ZeRO-3 with nested wrapping);
``consolidate_sharded_state_dicts`` / ``consolidate_sharded_model_checkpoints`` (and
``python3 -m torch_spmd.distributed.fsdp.consolidate_sharded_ckpts``) merge the per-rank
checkpoints; ``checkpoint_module`` adds activation checkpointing. See docs/fsdp.md.
"""
from .xla_fully_sharded_data_parallel import XlaFullyShardedDataParallel
from .state_dict_utils import (consolidate_sharded_state_dicts,
                               consolidate_sharded_model_checkpoints)
from .utils import checkpoint_module

__all__ = [
    "XlaFullyShardedDataParallel",
    "consolidate_sharded_state_dicts",
    "consolidate_sharded_model_checkpoints",
    "checkpoint_module",
]
