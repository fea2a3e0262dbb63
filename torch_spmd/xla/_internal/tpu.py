"""``torch_xla._internal.tpu`` under ``torch_spmd.xla.install()``: the emulated devices are no TPU.

Code such as ``skipIf(xr.device_type() == 'TPU' and tpu.version() < 4, ...)`` imports this module
and never calls ``version()`` off TPU; where it is called it raises EnvironmentError, as
PyTorch/XLA's does on a machine without TPU metadata.
"""
from typing import List, Optional


def num_available_chips() -> int:
    """TPU chips attached to this machine: none."""
    return 0


def num_available_devices() -> int:
    return 0


def num_local_processes() -> int:
    return 1


def task_id() -> Optional[int]:
    return None


def worker_id() -> int:
    return 0


def version() -> int:
    raise EnvironmentError("torch_spmd emulates its devices (device type 'SPMD'); there is no TPU "
                           "to report a version of")


def get_tpu_type() -> str:
    raise EnvironmentError("torch_spmd emulates its devices (device type 'SPMD'); there is no TPU")


def get_worker_ips() -> List[str]:
    return ["localhost"]


def num_tpu_workers() -> int:
    return 0
