"""Counters and metrics, with PyTorch/XLA's ``torch_xla.debug.metrics`` interface.

Counters: ``MarkStep``, ``UncachedCompile``, ``CachedCompile``, ``ExecuteGraph``,
``EagerFallback`` (plus one counter per op that ran eagerly, named ``aten::<op>``),
``TransferToDevice``, ``TransferFromDevice``, collective counters, ``PropagationIterationCap``
(sharding propagation stopped at its iteration cap before a fixed point). Metrics (timers, seconds):
``CompileTime``, ``ExecuteTime``.
"""
from typing import List, Optional, Tuple

from .. import _C


def metrics_report() -> str:
    """A human-readable report of every metric and counter."""
    return _C._metrics_report()


def short_metrics_report(counter_names: Optional[List[str]] = None,
                         metric_names: Optional[List[str]] = None) -> str:
    """The report restricted to a few counters and metrics."""
    counter_names = counter_names or ["CachedCompile", "MarkStep"]
    metric_names = metric_names or ["CompileTime", "ExecuteTime"]
    lines = []
    for name in metric_names:
        data = metric_data(name)
        if data is not None:
            lines.append(f"Metric: {name}\n  TotalSamples: {data[0]}\n  Accumulator: {data[1]:.6f}")
    for name in counter_names:
        if name in counter_names_():
            lines.append(f"Counter: {name}\n  Value: {counter_value(name)}")
    return "\n".join(lines) + ("\n" if lines else "")


def counter_names() -> List[str]:
    """Names of every counter incremented so far."""
    return _C._counter_names()


counter_names_ = counter_names


# PyTorch/XLA's names for the same events: in SPMD mode every graph execution runs replicated on
# all devices (PyTorch/XLA's ExecuteReplicated), so its counter and timer are ours under another
# name. Looked up by counter_value / metric_data only (reports list each event once).
_COUNTER_ALIASES = {"ExecuteReplicated": "ExecuteGraph"}
_METRIC_ALIASES = {"ExecuteReplicatedTime": "ExecuteTime"}


def counter_value(name: str) -> Optional[int]:
    """A counter's value, or None if it was never incremented. PyTorch/XLA's
    ``ExecuteReplicated`` is ``ExecuteGraph``."""
    name = _COUNTER_ALIASES.get(name, name)
    return _C._counter_value(name) if name in _C._counter_names() else None


def metric_names() -> List[str]:
    """Names of every metric recorded so far."""
    return _C._metric_names()


def metric_data(name: str) -> Optional[Tuple[int, float, List[float]]]:
    """``(total_samples, accumulator, recent_samples)`` of a metric, or None. PyTorch/XLA's
    ``ExecuteReplicatedTime`` is ``ExecuteTime``."""
    return _C._metric_data(_METRIC_ALIASES.get(name, name))


def executed_fallback_ops() -> List[str]:
    """The ops that had to run eagerly on the host (counters named ``aten::...``)."""
    return [n for n in counter_names() if n.startswith("aten::")]


def clear_counters() -> None:
    _C._clear_counters()


def clear_metrics() -> None:
    _C._clear_metrics()


def clear_all() -> None:
    """Resets every counter and metric."""
    _C._clear_counters()
    _C._clear_metrics()
