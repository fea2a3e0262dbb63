"""PyTorch/XLA's ``torch_xla.distributed.xla_backend``: importing it registers torch.distributed's
``xla`` backend and ``xla://`` init method, so a script's
``dist.init_process_group('xla', init_method='xla://')`` runs unmodified.

- ``xla://`` finds rank and world size where the launcher put them (torchrun's or
  ``xmp.spawn``'s RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, through ``env://``); a process
  nothing launched is the only one of its world.
- The ``xla`` backend is gloo underneath (the emulated devices live in host memory), and the
  process joins the multi-process world over it as one replica (what
  ``torch_spmd.distributed.init_multiprocess`` does): ``xm`` collectives and
  ``dist.all_reduce`` of spmd tensors then cross processes.
- In SPMD mode it raises AssertionError, as PyTorch/XLA does ("XLA backend is not supported with
  SPMD"): there the partitioner makes the collectives.
"""
import datetime
import os

import torch.distributed as dist

from .. import runtime
from .._impl import process_world as _process_world

def _xla_rendezvous(url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                    **kwargs):
    if all(os.environ.get(v) for v in _process_world.LAUNCHER_ENV):
        yield from dist.rendezvous(_process_world.env_init_method(), timeout=timeout)
        return
    yield dist.HashStore(), 0, 1


def _create_xla_process_group(store, rank: int, world_size: int,
                              timeout: datetime.timedelta):
    assert not runtime.is_spmd(), "XLA backend is not supported with SPMD"
    _process_world.join_when_initialized(rank, world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _register() -> None:
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create_xla_process_group, devices=["cpu"])
    try:
        dist.register_rendezvous_handler("xla", _xla_rendezvous)
    except RuntimeError:  # registered already (a second import under another name)
        pass


_register()
