"""The process world of multi-process mode: one process per replica, each with one device.

``xmp.spawn`` initializes it in every child (``init_from_env``), and a process started by a
launcher such as torchrun joins it with ``torch_spmd.distributed.init_multiprocess``
(``join_from_launcher``); the ``xm`` and ``xr`` functions read it. Collectives recorded by
``xm`` run in C++ over torch.distributed gloo process groups: this module creates the groups (in
Python, where torch.distributed keeps its bookkeeping) and hands their C++ objects to
``torch_spmd._C``, which runs the collectives without the GIL.
"""
import datetime
import os

import torch.distributed as dist

from .. import _C
from . import world as world_state
from .device import configure_devices

# The launcher's environment and torch.distributed's rendezvous (shared with multi-process SPMD).
from .launcher_env import (LAUNCHER_ENV, TIMEOUT_ENV, env_init_method,  # noqa: F401
                         tcpstore_has_libuv, timeout_seconds)


class _World:
    def __init__(self, rank, world_size, local_rank, local_world_size, owns_group):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.owns_group = owns_group  # we initialized torch.distributed, so we tear it down
        self.subgroups = {}           # sorted ranks -> ProcessGroup (NON_GROUP_MEMBER if not ours)
        self.rendezvous_count = {}    # (tag, replicas) -> times entered


def _env_int(name, default=None):
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise RuntimeError(f"multi-process mode needs the environment variable {name}")
        return default
    return int(value)


def init_from_env() -> None:
    """Joins the world described by RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT (what xmp.spawn sets in each child), over gloo."""
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    init(rank, world_size, _env_int("LOCAL_RANK", rank), _env_int("LOCAL_WORLD_SIZE", world_size))


def join_from_launcher(timeout=None) -> None:
    """Makes this process one replica of the world its launcher describes (torchrun sets
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    If torch.distributed is already initialized (the script called
    ``dist.init_process_group``), its default group is the world: rank and size come from it.
    Otherwise a gloo default group is created with ``init_method='env://'``: under torchrun
    that connects to the store the launcher already serves on MASTER_PORT
    (TORCHELASTIC_USE_AGENT_STORE) instead of opening a second one there. A second call in a
    process that already joined the same world returns (a script may call it and also run
    under ``xmp.spawn``)."""
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        missing = [v for v in LAUNCHER_ENV if not os.environ.get(v)]
        if missing:
            raise RuntimeError(
                f"init_multiprocess: the environment variables {', '.join(missing)} are not "
                "set: start the script with a launcher such as torchrun (or set RANK, "
                "WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or call dist.init_process_group first")
        rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    world = world_state.current()
    if world is not None and (world.rank, world.world_size) == (rank, world_size):
        return
    init(rank, world_size, _env_int("LOCAL_RANK", rank),
         _env_int("LOCAL_WORLD_SIZE", world_size), timeout)


def init(rank: int, world_size: int, local_rank: int, local_world_size: int,
         timeout=None) -> None:
    """Joins the world as replica ``rank`` of ``world_size``: torch.distributed's default group
    (created over gloo with ``init_method='env://'`` unless the process already has one of
    that rank and size) carries the xm collectives. ``timeout``: seconds a collective waits
    for the others (default ``SPMD_DIST_TIMEOUT``)."""
    if timeout is None:
        timeout = timeout_seconds()
    with world_state.lock:
        if world_state.current() is not None:
            raise RuntimeError("the multi-process world is already initialized")
        # Each replica process drives exactly one device: its device id in the collectives is
        # its rank. The device set is created lazily, so this only fails if the process made
        # spmd tensors before joining the world.
        if _C._num_devices() != 1:
            configure_devices(1)
        owns_group = not dist.is_initialized()
        if owns_group:
            dist.init_process_group(
                "gloo", init_method=env_init_method(), rank=rank, world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout))
        elif dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise RuntimeError(
                f"torch.distributed is already initialized as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, not rank {rank} of {world_size}")
        elif "gloo" not in str(dist.get_backend()):
            raise RuntimeError(
                "the xm collectives run over gloo, but torch.distributed's default group uses "
                f"{dist.get_backend()!r}: initialize it with dist.init_process_group('gloo')")
        _C._install_process_group_collectives(dist.distributed_c10d._get_default_group())
        world_state.set_current(
            _World(rank, world_size, local_rank, local_world_size, owns_group))


def join_when_initialized(rank: int, world_size: int) -> None:
    """Makes this process replica ``rank`` of ``world_size`` over torch.distributed's default
    group once the ``xla`` backend's ``dist.init_process_group`` (which calls this while it
    creates that group) has made it: the process gets its one device now, the collectives the
    first time the world is asked for. LOCAL_RANK and LOCAL_WORLD_SIZE come from the
    environment; the group stays the script's to destroy."""
    with world_state.lock:
        world = world_state.current()
        if world is not None:
            raise RuntimeError(f"this process is already replica {world.rank} of "
                               f"{world.world_size} of a multi-process world")
        if _C._num_devices() != 1:
            configure_devices(1)

        def join() -> bool:
            if not dist.is_initialized():
                return False
            _C._install_process_group_collectives(dist.distributed_c10d._get_default_group())
            world_state.set_current(_World(rank, world_size, _env_int("LOCAL_RANK", rank),
                                           _env_int("LOCAL_WORLD_SIZE", world_size), False))
            return True
        world_state.set_pending(join)


def shutdown(barrier: bool = True) -> None:
    """Leaves the world: waits for every process (so that no one tears down the store while
    others still use it), then restores the in-process collectives."""
    with world_state.lock:
        world = world_state.current()
        if world is None:
            return
        world_state.set_current(None)
    try:
        if barrier and world.world_size > 1:
            dist.barrier()
    finally:
        _C._reset_collectives()
        if world.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def current():
    """The world, or None outside multi-process mode."""
    return world_state.current()


def is_multiprocess() -> bool:
    return world_state.current() is not None


def groups_for(groups) -> list:
    """``groups`` (None = all replicas, or a list of rank lists) as a list of lists of ints,
    with a communicator registered in C++ for this process's group.

    Every process records the same collectives in the same order, so every process reaches
    here with the same groups and creates their torch.distributed groups in the same order, as
    ``new_group`` requires (non-members take part too).
    """
    world = world_state.current()
    n = world.world_size if world is not None else 1
    if groups is None or len(groups) == 0:
        return [list(range(n))]
    out = [[int(r) for r in g] for g in groups]
    if world is None:
        return out
    flat = sorted(r for g in out for r in g)
    if flat != list(range(n)):
        raise ValueError(f"groups {groups} must hold every replica 0..{n - 1} exactly once")
    for g in out:
        key = tuple(sorted(g))
        if len(key) in (1, n) or key in world.subgroups:
            continue  # a replica alone needs no one; the world group serves all replicas
        pg = dist.new_group(list(key))
        world.subgroups[key] = pg
        if world.rank in key:
            _C._add_process_subgroup(list(key), pg)
    return out


def rendezvous(tag: str, payload: bytes, replicas) -> list:
    """Waits until every replica in ``replicas`` (all if empty) reached the rendezvous ``tag``;
    returns their payloads in replica order. Runs over the torch.distributed store, so any
    subset of replicas can meet without creating a process group."""
    world = world_state.current()
    members = sorted(set(int(r) for r in replicas)) or list(range(world.world_size))
    if world.rank not in members:
        raise ValueError(f"replica {world.rank} is not one of the rendezvous replicas {members}")
    count_key = (tag, tuple(members))
    seq = world.rendezvous_count.get(count_key, 0)
    world.rendezvous_count[count_key] = seq + 1
    store = dist.distributed_c10d._get_default_store()
    prefix = f"torch_spmd/rendezvous/{tag}/{','.join(map(str, members))}/{seq}/"
    store.set(prefix + str(world.rank), payload)
    keys = [prefix + str(r) for r in members]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_seconds()))
    except RuntimeError as e:
        raise RuntimeError(f"rendezvous '{tag}': not every replica of {members} arrived within "
                           f"{timeout_seconds():g}s ({e})") from e
    return [store.get(k) for k in keys]
