"""Sharded checkpoints that reshard on load, in two formats.

**DCP** (``torch.distributed.checkpoint``, PyTorch/XLA's ``SPMDSavePlanner`` /
``SPMDLoadPlanner``): standard DCP checkpoints, one chunk per distinct tile of each sharded
tensor. They load into plain CPU tensors with DCP alone, and plain DCP checkpoints load into
sharded spmd tensors::

  >>> import torch.distributed.checkpoint as dist_cp
  >>> from torch_spmd.distributed.checkpoint import (SPMDLoadPlanner, SPMDSavePlanner,
  ...                                                prime_optimizer)
  >>> sd = {'model': model.state_dict(), 'optim': opt.state_dict()}
  >>> dist_cp.save(sd, storage_writer=dist_cp.FileSystemWriter('/ckpt/step7'),
  ...              planner=SPMDSavePlanner())
  >>> # later, maybe under another mesh or with other partition specs:
  >>> prime_optimizer(opt)
  >>> sd = {'model': model.state_dict(), 'optim': opt.state_dict()}
  >>> dist_cp.load(sd, storage_reader=dist_cp.FileSystemReader('/ckpt/step7'),
  ...              planner=SPMDLoadPlanner())
  >>> model.load_state_dict(sd['model']); opt.load_state_dict(sd['optim'])
  >>> # a plain CPU model, with DCP alone:
  >>> cpu_sd = {'model': cpu_model.state_dict()}
  >>> dist_cp.load(cpu_sd, checkpoint_id='/ckpt/step7')

One process drives every device, so DCP runs in its single-process mode (no process group).
Through ``dist_cp`` the planners' errors (ValueError/RuntimeError naming the key) arrive
wrapped in DCP's ``CheckpointException``; a failed load changes no tensor (``planners.py``).
``save_dcp(sd, path)`` / ``load_dcp(sd, path)`` do the same in one call, raise the planners'
own errors, and replace an existing checkpoint so that an interrupted save leaves the previous
one loadable (``_dcp.py``; DCP's ``FileSystemWriter`` alone overwrites data files in place).

**torch_spmd's own format** (``save_sharded`` / ``load_sharded`` / ``read_metadata``): a data
file and a JSON manifest that also records each tensor's mesh and partition spec
(``_storage.py``, ``_snapshot.py``)::

  >>> import torch_spmd.distributed.checkpoint as ckpt
  >>> ckpt.save_sharded({'model': model.state_dict(), 'optim': opt.state_dict()}, '/ckpt/s7')
  >>> ckpt.prime_optimizer(opt)
  >>> sd = {'model': model.state_dict(), 'optim': opt.state_dict()}
  >>> ckpt.load_sharded(sd, '/ckpt/s7')

``CheckpointManager`` keeps per-step checkpoints under one directory (PyTorch/XLA's interface:
``save``, ``save_async``, ``restore``, ``all_steps``, ``max_to_keep``), in either format
(``use_dcp=True`` for DCP); ``restore`` reads both.

The ``torch.distributed.checkpoint`` import (half a second) happens on first use of the DCP
names.
"""
from .api import load_sharded, read_metadata, save_sharded
from .manager import CheckpointManager
from ._optimizer import prime_optimizer

_DCP_NAMES = {
    "SPMDSavePlanner": "planners",
    "SPMDLoadPlanner": "planners",
    "HostShards": "planners",
    "stage_state_dict": "planners",
    "save_dcp": "_dcp",
    "load_dcp": "_dcp",
    "is_dcp_checkpoint": "_dcp",
}

__all__ = ["save_sharded", "load_sharded", "read_metadata", "CheckpointManager",
           "prime_optimizer"] + list(_DCP_NAMES)


def __getattr__(name):
    """The DCP names, imported on first use."""
    if name in _DCP_NAMES:
        import importlib
        module = importlib.import_module(f".{_DCP_NAMES[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_DCP_NAMES))
