"""Sharded checkpoints that reshard on load (PyTorch/XLA's distributed checkpoint, reduced to
what one SPMD process needs).

  >>> import torch_spmd.distributed.checkpoint as ckpt
  >>> ckpt.save_sharded({'model': model.state_dict(), 'optim': opt.state_dict()}, '/ckpt/step7')
  >>> # later, maybe under another mesh or with other partition specs:
  >>> ckpt.prime_optimizer(opt)
  >>> sd = {'model': model.state_dict(), 'optim': opt.state_dict()}
  >>> ckpt.load_sharded(sd, '/ckpt/step7')
  >>> model.load_state_dict(sd['model']); opt.load_state_dict(sd['optim'])

``CheckpointManager`` keeps per-step checkpoints under one directory (PyTorch/XLA's interface:
``save``, ``save_async``, ``restore``, ``all_steps``, ``max_to_keep``).

Why not PyTorch/XLA's ``SPMDSavePlanner`` / ``SPMDLoadPlanner``: they plug into
``torch.distributed.checkpoint`` (torch >= 2.0). torch 1.13 only has its prototype,
``torch.distributed._shard.checkpoint``, without planners, and that package does not even
import on Python 3.11 (a dataclass with a mutable default). The planners' job (one write item
per local shard from its unpadded indices; on load, fill each local shard from the saved chunks
that overlap it) is done here directly; the on-disk format is described in ``_storage.py`` and
``_snapshot.py``.
"""
from .api import load_sharded, read_metadata, save_sharded
from .manager import CheckpointManager
from ._optimizer import prime_optimizer

__all__ = ["save_sharded", "load_sharded", "read_metadata", "CheckpointManager",
           "prime_optimizer"]
