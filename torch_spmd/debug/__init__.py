"""Inspection tools: metrics, the pending graph, the partitioned program, step statistics."""
from typing import Iterable

import torch

from .. import _C
from . import metrics  # noqa: F401
from . import module_scope
from .comm_report import comm_report  # noqa: F401
from .views import memory_timeline, trace  # noqa: F401
from .html_report import report  # noqa: F401

module_scope.enable()  # ops record the module path they ran under


def _as_list(tensors) -> list:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    return list(tensors)


def graph_text(tensors: Iterable[torch.Tensor]) -> str:
    """The pending IR that computes ``tensors``, one node per line (nothing is executed)."""
    return _C._graph_text(_as_list(tensors))


def partitioned_program(tensors: Iterable[torch.Tensor]) -> str:
    """The per-device program that would compute ``tensors``: local ops with local shapes and
    shardings, and every collective with its kind, mesh axes, group size and bytes."""
    return _C._partitioned_program(_as_list(tensors))


def last_step_stats() -> dict:
    """Statistics of the most recently executed graph: ``collectives`` (list of dicts with
    kind, axes, group_size, bytes — bytes is each device's input buffer),
    ``pending_reductions`` (outputs left as partial sums, reduced when read: same fields),
    ``peak_bytes_per_device``, ``flops_per_device`` and ``replicated_fallback_ops``
    (op name -> count). Each collective also has ``scope``, the module path of the op it was
    emitted for (see ``module_scope``, ``comm_report``)."""
    return _C._last_step_stats()
