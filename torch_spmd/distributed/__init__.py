"""Distributed APIs of torch_spmd: ``torch_spmd.distributed.spmd`` (the sharding annotations)
and ``torch_spmd.distributed.xla_multiprocessing`` (multi-process mode: one process per
replica).

A process started by a launcher such as ``torchrun`` (one process per replica) joins the
multi-process world with ``init_multiprocess()``, PyTorch/XLA's
``dist.init_process_group('xla', init_method='xla://')``; see docs/multiprocess.md.
"""
from typing import Optional

from .._impl import process_world as _process_world
from .._impl import process_span as _process_span


def init_multiprocess(timeout: Optional[float] = None) -> None:
    """Makes this process one replica of the multi-process world its launcher describes:
    torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    Call it before creating spmd tensors (the process is given one emulated device). The
    world's gloo group is torch.distributed's default group: the one the script already
    initialized, if any, else one created with ``init_method='env://'`` (under torchrun it
    shares the launcher's store on MASTER_PORT). ``timeout``: seconds a collective waits for
    the other replicas (default ``SPMD_DIST_TIMEOUT``, 1800). Calling it again in the same
    world does nothing.
    """
    _process_world.join_from_launcher(timeout)


def shutdown_multiprocess(barrier: bool = True) -> None:
    """Leaves the multi-process world: waits for every replica (``barrier``), restores the
    in-process collectives and destroys torch.distributed's default group if
    ``init_multiprocess`` created it. Nothing happens outside multi-process mode."""
    _process_world.shutdown(barrier)


def is_multiprocess() -> bool:
    """Whether this process is a replica of a multi-process world (``xmp.spawn`` or
    ``init_multiprocess``)."""
    return _process_world.is_multiprocess()


def init_spmd_processes(timeout: Optional[float] = None) -> None:
    """Makes this process one of several that together run ONE SPMD program over one mesh,
    each owning a contiguous slice of the ``SPMD_NUM_DEVICES`` global devices (as each host of
    a multi-host pod owns its chips). The world comes from the launcher (torchrun's RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or torch.distributed's gloo default group.
    ``xr.use_spmd()`` calls it when a launcher started several processes.
    See docs/multihost_spmd.md."""
    _process_span.init(timeout)


def shutdown_spmd_processes(barrier: bool = True) -> None:
    """Leaves the multi-process SPMD world (after a barrier) and destroys the default group."""
    _process_span.shutdown(barrier)


__all__ = ["init_multiprocess", "shutdown_multiprocess", "is_multiprocess",
           "init_spmd_processes", "shutdown_spmd_processes"]
