"""Run PyTorch/XLA scripts unmodified on torch_spmd: ``import torch_xla...`` resolves to torch_spmd.

From a shell::

    python -m torch_spmd.xla train.py --flags        # like `python train.py --flags`
    python -m torch_spmd.xla -m pytest test_foo.py   # like `python -m pytest test_foo.py`

In a notebook or a script of your own, before the first ``import torch_xla``::

    import torch_spmd.xla
    torch_spmd.xla.install()
    import torch_xla.core.xla_model as xm            # torch_spmd.core.xla_model
    import torch_xla.distributed.spmd as xs          # torch_spmd.distributed.spmd

``install()`` puts an import hook (a ``sys.meta_path`` finder) in front of Python's own. It
resolves each ``torch_xla`` module name to the torch_spmd module that implements it: the *same*
module object (``torch_xla.distributed.spmd is torch_spmd.distributed.spmd``), so state such as
the global mesh is shared whichever name code uses. Nothing is written to disk under the name
``torch_xla``. A name torch_spmd does not implement raises ``ModuleNotFoundError`` saying so.

It also makes the ``xla`` device name mean the spmd device (``t.to('xla')``,
``torch.randn(2, device='xla')``, ``model.to(torch.device('xla'))``), through a torch function
mode on the calling thread (``map_xla_device=False`` leaves it out; see ``_device_mode``).

If a real ``torch_xla`` is importable, ``install()`` raises RuntimeError instead of shadowing it.
``uninstall()`` removes the hook, the device mapping and the aliases it registered.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Dict, Optional

__all__ = ["install", "uninstall", "is_installed", "ALIASES"]

# torch_xla module name -> the torch_spmd module that implements it. A name not listed here whose
# parent is aliased to a torch_spmd package resolves to the same-named module of that package
# (``torch_xla.distributed.spmd.debugging`` -> ``torch_spmd.distributed.spmd.debugging``).
ALIASES: Dict[str, str] = {
    "torch_xla": "torch_spmd.xla._torch_xla",
    "torch_xla._XLAC": "torch_spmd.xla._XLAC",
    "torch_xla._internal": "torch_spmd.xla._internal",
    "torch_xla.core": "torch_spmd.core",
    "torch_xla.core.xla_model": "torch_spmd.core.xla_model",
    "torch_xla.core.xla_env_vars": "torch_spmd.xla.xla_env_vars",
    "torch_xla.core.xla_builder": "torch_spmd.xla.xla_builder",
    "torch_xla.runtime": "torch_spmd.runtime",
    "torch_xla.debug": "torch_spmd.debug",
    "torch_xla.debug.metrics": "torch_spmd.debug.metrics",
    "torch_xla.distributed": "torch_spmd.distributed",
    "torch_xla.distributed.spmd": "torch_spmd.distributed.spmd",
    "torch_xla.distributed.fsdp": "torch_spmd.distributed.fsdp",
    "torch_xla.distributed.xla_multiprocessing": "torch_spmd.distributed.xla_multiprocessing",
    "torch_xla.distributed.parallel_loader": "torch_spmd.distributed.parallel_loader",
    "torch_xla.distributed.xla_backend": "torch_spmd.distributed.xla_backend",
    "torch_xla.amp": "torch_spmd.amp",
    "torch_xla.experimental": "torch_spmd.experimental",
    # Older PyTorch/XLA releases kept the SPMD API under experimental.
    "torch_xla.experimental.xla_sharding": "torch_spmd.distributed.spmd.xla_sharding",
    "torch_xla.experimental.xla_sharded_tensor": "torch_spmd.distributed.spmd.xla_sharded_tensor",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel":
        "torch_spmd.experimental.spmd_fully_sharded_data_parallel",
    "torch_xla.experimental.distributed_checkpoint":
        "torch_spmd.experimental.distributed_checkpoint",
    "torch_xla.experimental.stablehlo_custom_call":
        "torch_spmd.experimental.stablehlo_custom_call",
    "torch_xla.utils": "torch_spmd.utils",
    "torch_xla.utils.checkpoint": "torch_spmd.utils.checkpoint",
    "torch_xla.utils.utils": "torch_spmd.utils.utils",
}

_ROOT = "torch_xla"


def _target_name(fullname: str) -> Optional[str]:
    """The torch_spmd module name behind ``fullname`` (a ``torch_xla...`` name), or None."""
    if fullname in ALIASES:
        return ALIASES[fullname]
    parent, _, child = fullname.rpartition(".")
    if not parent:
        return None
    parent_module = sys.modules.get(parent)
    if parent_module is None or not hasattr(parent_module, "__path__"):
        return None
    # The parent is an alias: its module object carries its real torch_spmd name.
    real_parent = parent_module.__name__
    if not real_parent.startswith("torch_spmd"):
        return None
    return real_parent + "." + child


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing the real module and handing back that same object."""

    def __init__(self, target: str):
        self._target = target
        self._saved = {}

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        # The import machinery overwrites __spec__ with the alias's spec; exec_module puts the
        # module's own spec back so that it keeps its identity (reload, pickling, -m).
        self._saved[id(module)] = module.__spec__
        return module

    def exec_module(self, module):
        saved = self._saved.pop(id(module), None)
        if saved is not None:
            module.__spec__ = saved


class _AliasFinder(importlib.abc.MetaPathFinder):
    """``sys.meta_path`` finder for the ``torch_xla`` names (see ``ALIASES``)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ROOT and not fullname.startswith(_ROOT + "."):
            return None
        real = _target_name(fullname)
        if real is None or importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: torch_spmd's PyTorch/XLA compatibility layer "
                f"(torch_spmd.xla) does not implement it (see docs/xla_compat.md)",
                name=fullname)
        is_package = hasattr(importlib.import_module(real), "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=is_package)


_FINDER: Optional[_AliasFinder] = None
_DEVICE_MODE = None


def is_installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _FINDER is not None and _FINDER in sys.meta_path


def install(map_xla_device: bool = True) -> None:
    """Makes ``import torch_xla`` (and its submodules in ``ALIASES``) resolve to torch_spmd and,
    with ``map_xla_device``, ``xla`` device arguments name the spmd device (this thread).

    Idempotent. Raises RuntimeError if a real ``torch_xla`` is importable or already imported:
    torch_spmd never shadows it (use the torch_spmd modules directly alongside it).
    """
    global _FINDER, _DEVICE_MODE
    if is_installed():
        return
    existing = sys.modules.get(_ROOT)
    if existing is not None:
        raise RuntimeError(
            f"torch_spmd.xla.install(): a real torch_xla is already imported ({existing!r}); "
            "torch_spmd will not shadow it. Import torch_spmd's modules directly instead "
            "(torch_spmd.core.xla_model, torch_spmd.distributed.spmd, torch_spmd.runtime).")
    spec = importlib.util.find_spec(_ROOT)
    if spec is not None:
        where = spec.origin or list(spec.submodule_search_locations or [])
        raise RuntimeError(
            f"torch_spmd.xla.install(): a real torch_xla is installed ({where}); torch_spmd "
            "will not shadow it. Run without it on the path, or import torch_spmd's modules "
            "directly (torch_spmd.core.xla_model, torch_spmd.distributed.spmd, "
            "torch_spmd.runtime).")
    _FINDER = _AliasFinder()
    sys.meta_path.insert(0, _FINDER)
    if map_xla_device:
        from ._device_mode import XlaDeviceMapping
        _DEVICE_MODE = XlaDeviceMapping()
        _DEVICE_MODE.__enter__()


def uninstall() -> None:
    """Removes the import hook, the device mapping and every ``torch_xla`` alias from
    ``sys.modules``."""
    global _FINDER, _DEVICE_MODE
    if _DEVICE_MODE is not None:
        _DEVICE_MODE.__exit__(None, None, None)
        _DEVICE_MODE = None
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER = None
    for name in [n for n in sys.modules if n == _ROOT or n.startswith(_ROOT + ".")]:
        del sys.modules[name]
