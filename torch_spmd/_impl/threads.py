"""Intra-op threads: the emulated devices run their kernels on the host's cores, so by default
torch_spmd gives torch one intra-op thread per core this process may run on.

Rule, applied once on ``import torch_spmd``:

1. ``SPMD_NUM_THREADS`` (a positive integer) if set: ``torch.set_num_threads`` of it;
2. else, if ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, torch already honoured it
   (torchrun sets ``OMP_NUM_THREADS=1`` per worker): left alone;
3. else ``len(os.sched_getaffinity(0))``, the cores this process may run on (respects
   ``taskset`` and cgroup cpusets, unlike torch's own default of the machine's physical cores),
   shared among the processes of this host when it is one of several (``LOCAL_WORLD_SIZE``, as
   torchrun and ``xmp.spawn`` set it): more OpenMP threads than free cores make every parallel
   region wait for a descheduled thread, which slows small kernels down tenfold.

``torch.set_num_threads`` after the import overrides it as usual.
"""
import os
from typing import Optional

import torch


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_num_threads() -> Optional[int]:
    """The thread count the rule above picks; None where torch's own choice stands."""
    value = os.environ.get("SPMD_NUM_THREADS", "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"SPMD_NUM_THREADS must be a positive integer, got {value!r}") from None
        if n < 1:
            raise ValueError(f"SPMD_NUM_THREADS must be a positive integer, got {value!r}")
        return n
    if os.environ.get("OMP_NUM_THREADS", "").strip() or os.environ.get("MKL_NUM_THREADS", "").strip():
        return None
    local_processes = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    share = int(local_processes) if local_processes.isdigit() and int(local_processes) > 0 else 1
    return max(1, _cores() // share)


def configure_threads() -> None:
    """Applies the rule (called on import)."""
    n = default_num_threads()
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
