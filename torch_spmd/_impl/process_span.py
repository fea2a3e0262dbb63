"""Multi-process SPMD: one mesh of global devices split over several processes (hosts).

As on a multi-host TPU pod, every process runs the same script and owns a contiguous slice of
the global devices: process p of P holds devices ``[p * L, (p + 1) * L)`` with ``L = N / P``,
``N`` being ``SPMD_NUM_DEVICES`` (the *global* count, default 8; the same on every process).
Each process compiles the same partitioned program and runs it for its own devices; the
collectives whose groups span processes run over torch.distributed's gloo default group
(``csrc/runtime/process_span.h``).

A process joins with ``torch_spmd.distributed.init_spmd_processes()`` or, when a launcher
(torchrun, ``spawn_spmd``) started it with ``WORLD_SIZE > 1``, with ``xr.use_spmd()``.
"""
import atexit
import datetime
import os
from typing import Optional

import torch.distributed as dist

from .. import _C
from . import launcher_env as _dist_env
from . import world as world_state
from .device import configure_devices

_DEFAULT_DEVICES = 8
_DEFAULT_MEMORY = "16GiB"
# Whether init created torch.distributed's default group (then shutdown destroys it).
_owns_group = False


class MismatchedSettingsError(RuntimeError):
    """Processes of one multi-process SPMD world were started with different settings."""


def _settings() -> dict:
    """What every process must agree on, from this process's environment."""
    text = os.environ.get("SPMD_NUM_DEVICES", str(_DEFAULT_DEVICES))
    try:
        devices = int(text)
    except ValueError:
        devices = -1
    if devices < 1:
        raise ValueError(f"SPMD_NUM_DEVICES must be a positive integer (the global device "
                         f"count in multi-process SPMD), got {text!r}")
    memory = _C._parse_bytes(os.environ.get("SPMD_DEVICE_MEMORY", _DEFAULT_MEMORY))
    return {"SPMD_NUM_DEVICES": devices, "SPMD_DEVICE_MEMORY": memory}


def is_active() -> bool:
    """Whether this process is one of several of a multi-process SPMD world."""
    return _C._process_span() is not None


def launched_with_several_processes() -> bool:
    """Whether a launcher described a world of more than one process (RANK, WORLD_SIZE)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK") is not None
    except ValueError:
        return False


def init(timeout: Optional[float] = None) -> None:
    """Joins the multi-process SPMD world the launcher describes (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), or the one torch.distributed's default group already forms.

    Every process must have the same ``SPMD_NUM_DEVICES`` (global devices, divisible by the
    process count) and ``SPMD_DEVICE_MEMORY``; a mismatch raises MismatchedSettingsError in
    every process, naming each process's values. Call it before creating spmd tensors."""
    if is_active():
        return
    if world_state.current() is not None:
        raise RuntimeError("this process is a replica of a multi-process (xmp.spawn) world, "
                           "one device per process; multi-process SPMD needs its own world")
    if timeout is None:
        timeout = _dist_env.timeout_seconds()
    global _owns_group
    _owns_group = not dist.is_initialized()
    if _owns_group:
        missing = [v for v in _dist_env.LAUNCHER_ENV if not os.environ.get(v)]
        if missing:
            raise RuntimeError(
                f"multi-process SPMD: the environment variables {', '.join(missing)} are not "
                "set: start the script with a launcher such as torchrun (or set RANK, "
                "WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or call dist.init_process_group first")
        dist.init_process_group(
            "gloo", init_method=_dist_env.env_init_method(),
            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=timeout))
    elif "gloo" not in str(dist.get_backend()):
        raise RuntimeError("multi-process SPMD runs its collectives over gloo, but "
                           f"torch.distributed's default group uses {dist.get_backend()!r}")
    # (A failed join leaves the group as it is: tearing it down could wait on a process that
    # already failed the same check and exited, and this one is about to fail too.)
    _join(dist.get_world_size())


def _join(count: int) -> None:
    """Checks the settings with every process, then installs this process's span."""
    settings = _settings()
    everyone = [None] * count
    dist.all_gather_object(everyone, settings)
    differing = [p for p in range(count) if everyone[p] != everyone[0]]
    if differing:
        listed = "; ".join(f"process {p}: {everyone[p]}" for p in range(count))
        raise MismatchedSettingsError(
            f"multi-process SPMD: the processes were started with different settings "
            f"(process(es) {differing} differ from process 0): {listed}. Every process needs "
            "the same SPMD_NUM_DEVICES (global devices) and SPMD_DEVICE_MEMORY")
    devices = settings["SPMD_NUM_DEVICES"]
    if devices % count:
        raise ValueError(f"SPMD_NUM_DEVICES={devices} global devices cannot be split evenly "
                         f"over {count} processes: use a multiple of {count}")
    local = devices // count
    memory = _C._memory_info(0)["bytes_limit"]
    if _C._num_devices() != local or memory != settings["SPMD_DEVICE_MEMORY"]:
        configure_devices(local, settings["SPMD_DEVICE_MEMORY"])
    _C._install_process_span(dist.distributed_c10d._get_default_group(), local)
    # Every process watches the others from now on: a failed step or a silent process aborts
    # every exchange instead of leaving it waiting (runtime/world_health.h).
    _C._start_world_health(dist.distributed_c10d._get_default_store(), dist.get_rank(), count,
                           _dist_env.heartbeat_seconds())
    atexit.register(_leave_at_exit)
    _share_cores()


def _leave_at_exit() -> None:
    """Leaves the world's health watch at exit; after an abort, exits at once: the process
    group's teardown would wait for an exchange that a stopped process never completes."""
    aborted = _C._world_aborted() is not None
    _C._stop_world_health()
    if aborted:
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _share_cores() -> None:
    """Processes of one machine share its cores: each gets its part for its intra-op threads
    (torchrun's OMP_NUM_THREADS=1 default, less drastic) unless the user chose a count."""
    import torch
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("SPMD_NUM_THREADS"):
        return
    try:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return
    if local_processes > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_processes))


def shutdown(barrier: bool = True) -> None:
    """Leaves the multi-process SPMD world (waiting for the others when ``barrier``); the
    process keeps its local devices only."""
    if not is_active():
        return
    try:
        # (An aborted world's barrier could wait for a stopped process.)
        if barrier and dist.is_initialized() and _C._world_aborted() is None:
            dist.barrier()
    finally:
        _C._stop_world_health()
        _C._clear_process_span()
        if _owns_group and dist.is_initialized():
            dist.destroy_process_group()  # (a group the script made stays the script's)


def local_devices() -> range:
    """The global ids of this process's devices: all of them, or in multi-process SPMD its
    slice."""
    span = _C._process_span()
    if span is None:
        return range(_C._num_devices())
    index, _count, local = span
    return range(index * local, (index + 1) * local)


def global_batch_from_local(local, sharding: str):
    """The global batch of which ``local`` is this process's part (dim 0; PyTorch/XLA's
    ``minibatch=True``: each host loads its own slice), as a host tensor to lay out as
    ``sharding`` (XLA text). Only this process's rows are filled: the caller uploads it, and
    each process keeps its own devices' shards, which must lie in its part (ValueError
    otherwise: dim 0 must be split over the devices in process order, e.g. over every device or
    over the axes that span processes)."""
    import torch

    from .tiles import device_shards
    index, count, _ = _C._process_span()
    rows = local.shape[0]
    shape = (rows * count,) + tuple(local.shape[1:])
    mine = local_devices()
    for shard in device_shards(sharding, shape):
        start, length = shard.box[0][0], shard.box[1][0]
        if shard.device in mine and length > 0 and \
                not index * rows <= start <= start + length <= (index + 1) * rows:
            raise ValueError(
                f"minibatch input: process {index}'s device {shard.device} holds rows "
                f"[{start}, {start + length}) of the global batch of {shape[0]}, outside this "
                f"process's part [{index * rows}, {(index + 1) * rows}): shard the batch dim "
                "over the devices in process order (over every device, or over the axes that "
                "span processes), or load the whole batch on every process (minibatch=False)")
    whole = torch.zeros(shape, dtype=local.dtype)
    whole[index * rows:(index + 1) * rows] = local
    return whole
