"""PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint`` path for torch_spmd's sharded
checkpoints (``torch_spmd.distributed.checkpoint``): ``SPMDSavePlanner`` / ``SPMDLoadPlanner``
for ``torch.distributed.checkpoint``, ``CheckpointManager`` and ``prime_optimizer`` under the
same names, plus ``save_dcp`` / ``load_dcp`` and torch_spmd's own ``save_sharded`` /
``load_sharded``."""
from ...distributed import checkpoint as _checkpoint
from ...distributed.checkpoint import (CheckpointManager, load_sharded, prime_optimizer,
                                       read_metadata, save_sharded)

_LAZY = ("SPMDSavePlanner", "SPMDLoadPlanner", "save_dcp", "load_dcp")

__all__ = ["CheckpointManager", "prime_optimizer", "save_sharded", "load_sharded",
           "read_metadata"] + list(_LAZY)


def __getattr__(name):
    """The DCP names, imported (with ``torch.distributed.checkpoint``) on first use."""
    if name in _LAZY:
        return getattr(_checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
