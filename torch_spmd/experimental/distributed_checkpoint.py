"""PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint`` path for torch_spmd's sharded
checkpoints (``torch_spmd.distributed.checkpoint``): ``CheckpointManager`` and
``prime_optimizer`` under the same names, and ``save_sharded`` / ``load_sharded`` in place of
the ``SPMDSavePlanner`` / ``SPMDLoadPlanner`` plug-ins (see that package for why)."""
from ..distributed.checkpoint import (CheckpointManager, load_sharded, prime_optimizer,
                                      read_metadata, save_sharded)

__all__ = ["CheckpointManager", "prime_optimizer", "save_sharded", "load_sharded",
           "read_metadata"]
