"""What a launcher (torchrun, ``xmp.spawn``, ``spawn_spmd``) tells a process about its world,
and how a process joins torch.distributed's rendezvous: shared by multi-process mode (one
replica per process, ``distributed._process_world``) and multi-process SPMD (``_process_span``).
"""
import functools
import os

import torch.distributed as dist

# Seconds a collective or a rendezvous waits for the other processes before it fails (gloo's
# timeout). A dead peer usually fails faster: its sockets close.
TIMEOUT_ENV = "SPMD_DIST_TIMEOUT"
# What a launcher (torchrun, xmp.spawn) tells each process about its world.
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_DEFAULT_TIMEOUT = 1800


@functools.lru_cache(maxsize=None)
def tcpstore_has_libuv() -> bool:
    """Whether this torch's TCPStore has its libuv backend, the default that ``env://`` asks
    for. Debian's torch is built without it, and there the default fails ("use_libuv was
    requested but PyTorch was build without libuv support"). Probed once with a store on an
    ephemeral loopback port."""
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              use_libuv=True)
    except RuntimeError as e:
        if "libuv" in str(e):
            return False
        raise
    del store
    return True


def env_init_method() -> str:
    """``env://``, with TCPStore's classic backend where the torch lacks libuv."""
    return "env://" if tcpstore_has_libuv() else "env://?use_libuv=0"


def timeout_seconds() -> float:
    return float(os.environ.get(TIMEOUT_ENV, _DEFAULT_TIMEOUT))


# Seconds without a heartbeat after which a process of a multi-process SPMD world is taken for
# stopped or hung, and the world aborted (runtime/world_health.h).
HEARTBEAT_ENV = "SPMD_HEARTBEAT_SECONDS"
_DEFAULT_HEARTBEAT = 30.0


def heartbeat_seconds() -> float:
    raw = os.environ.get(HEARTBEAT_ENV, "")
    try:
        value = float(raw) if raw else _DEFAULT_HEARTBEAT
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{HEARTBEAT_ENV}={raw!r}: expected a number of seconds > 0")
    return value
