"""The top-level ``torch_xla`` module under ``torch_spmd.xla.install()`` (PyTorch/XLA's
``torch_xla/__init__.py`` + ``torch_xla/torch_xla.py``): ``device``, ``devices``,
``device_count``, ``sync``, ``step``, ``manual_seed``, ``launch``, and the ``runtime`` and
``_XLAC`` submodules.

The device is torch_spmd's one logical device, ``spmd:0`` (PyTorch/XLA's SPMD mode reports its
virtual device as ``xla:0``); the emulated physical devices sit behind it.
"""
import contextlib
from typing import Callable, List, Tuple

import torch

import torch_spmd
from torch_spmd import runtime  # noqa: F401  (torch_xla.runtime)
from torch_spmd.core import xla_model as _xm
from . import _XLAC  # noqa: F401  (torch_xla._XLAC)

# A package for the import system (submodules such as torch_xla.core are resolved by
# torch_spmd.xla's import hook, not searched for on disk).
__path__: List[str] = []

__version__ = "0.0.0+torch_spmd"


def device(index: int = None) -> torch.device:
    """The spmd device (one logical device; ``index`` must be None or 0)."""
    return torch_spmd.device(0 if index is None else index)


def devices() -> List[torch.device]:
    """Every logical device of this process: the one spmd device."""
    return [torch_spmd.device()]


def real_devices() -> List[str]:
    """The emulated physical devices, e.g. ``['SPMD:0', ..., 'SPMD:7']``."""
    return [a["name"] for a in runtime.global_runtime_device_attributes()]


def device_count() -> int:
    """Number of addressable physical devices (PyTorch/XLA: ``len(real_devices())``)."""
    return runtime.addressable_runtime_device_count()


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Runs everything pending as one graph, then the step closures (``xm.mark_step``)."""
    _xm.mark_step(wait=wait, reset_scope=reset_scope)


@contextlib.contextmanager
def step():
    """Code inside runs as one step: a sync before and after (PyTorch/XLA's ``torch_xla.step``
    clears pending work on entry and syncs on exit)."""
    sync()
    try:
        yield
    finally:
        sync()


def manual_seed(seed, device=None) -> None:
    """Seeds the device's random numbers (they are drawn from torch's default generator)."""
    _xm.set_rng_state(seed, device)


def launch(fn: Callable, args: Tuple = (), start_method: str = "spawn",
           debug_single_process: bool = False):
    """Multi-process launch (``xmp.spawn``); NotImplementedError in SPMD mode, as upstream."""
    if runtime.is_spmd():
        raise NotImplementedError("launch function does not support SPMD at this time")
    import torch.distributed as dist
    from torch_spmd.distributed import xla_multiprocessing as xmp
    nprocs = 1 if debug_single_process else None
    if dist.is_torchelastic_launched():
        import os
        return fn(int(os.environ.get("LOCAL_RANK", "0")), *args)
    return xmp.spawn(fn, args=args, nprocs=nprocs, start_method=start_method)


def compile(f: Callable = None, full_graph: bool = False, name: str = None,
            max_different_graphs: int = None, custom_compile_options: dict = None):
    """``f`` run as one step: pending work is run first, then ``f`` is traced and its graph run
    (compiled once per distinct graph) when it returns, as PyTorch/XLA's ``torch_xla.compile``.

    torch_spmd always traces lazily, so this only places the step boundaries. ``full_graph``,
    ``name``, ``max_different_graphs`` and ``custom_compile_options`` are accepted and not
    checked (torch_spmd's graph count is in ``torch_xla.debug.metrics``: ``UncachedCompile``).
    Usable as ``compile(f)``, ``@compile`` or ``with compile():``.
    """
    import functools

    @contextlib.contextmanager
    def _step():
        sync()
        try:
            yield
        finally:
            sync()

    if f is None:
        return _step()

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        with _step():
            return f(*args, **kwargs)

    return wrapper
