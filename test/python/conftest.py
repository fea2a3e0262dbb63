"""pytest setup for the torch_spmd Python suite: makes the repository root importable (the
extension is built into torch_spmd/) and the helper module next to this file."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for p in (_ROOT, _HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402,F401  (torch before the extension)
import torch_spmd  # noqa: E402,F401

import gc  # noqa: E402

import pytest  # noqa: E402

import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402


def ensure_devices(n: int = 8, memory: str = "16GiB") -> None:
    """Configures `n` emulated devices unless they already are (reconfiguring needs every device
    buffer to be gone, hence the collection)."""
    if xr.global_runtime_device_count() != n:
        gc.collect()
        xr.configure_devices(n, memory)


@pytest.fixture(scope="module")
def eight_devices():
    """Eight emulated devices in SPMD mode; no global mesh left behind."""
    ensure_devices(8)
    xr.use_spmd()
    yield
    xs.set_global_mesh(None)


@pytest.fixture(scope="module", autouse=True)
def _older_objects_frozen():
    """Objects still alive when a module starts (earlier modules' caches, torch's and
    hypothesis's state) are left out of this module's collections: the differential helpers
    collect before every example to free device buffers, and scanning a long suite's whole heap
    each time made the property sweeps several times slower in the full run."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
