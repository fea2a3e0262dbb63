"""DCP's default load planner on spmd tensors.

``torch.distributed.checkpoint.load`` without a planner (``DefaultLoadPlanner``) hands the
storage reader, per saved chunk, a narrowed view of the target, which the reader detaches and
copies the chunk into. A detached *view* of an spmd tensor is a value of its own, not an alias
of its base (csrc/aten/backend.cc, fix 1: it would otherwise pin superseded device buffers), so
every chunk smaller than its tensor was lost and the load silently left the tensor as it was
(a sharded checkpoint loaded into an unsharded model: PyTorch/XLA's
test_resharding_sharded_to_unsharded). For spmd targets the planner now hands out a host buffer
and, when the reader commits it, copies it into the target's view, which writes the base.
Other devices' tensors take DCP's own path.

The planner's module costs over a second to import, so it is patched when something imports it
(or at once, if it already is).
"""
import importlib.abc
import importlib.util
import sys

import torch

_MODULE = "torch.distributed.checkpoint.default_planner"


def _patch(module) -> None:
    planner = module.DefaultLoadPlanner
    resolve, commit = planner.resolve_tensor, planner.commit_tensor

    def resolve_tensor(self, read_item):
        target = resolve(self, read_item)
        if not isinstance(target, torch.Tensor) or target.device.type != "spmd":
            return target
        self.__dict__.setdefault("_spmd_targets", {})[read_item] = target
        return torch.empty(target.shape, dtype=target.dtype)

    def commit_tensor(self, read_item, tensor):
        target = self.__dict__.get("_spmd_targets", {}).pop(read_item, None)
        if target is not None:
            with torch.no_grad():
                target.copy_(tensor)
        return commit(self, read_item, tensor)

    resolve_tensor.__doc__, commit_tensor.__doc__ = resolve.__doc__, commit.__doc__
    planner.resolve_tensor, planner.commit_tensor = resolve_tensor, commit_tensor


class _PatchWhenImported(importlib.abc.MetaPathFinder):
    """Finds the planner's module with the other finders, then patches it once executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)  # (one module, once; also keeps the search below from recursing)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    else:
        sys.meta_path.insert(0, _PatchWhenImported())
