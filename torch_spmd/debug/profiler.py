"""Trace annotations with the names of PyTorch/XLA's ``torch_xla.debug.profiler``.

torch_spmd has no XLA profiler (no profiler server, no device traces, no TensorBoard/xprof
output). What it has an honest meaning for:

- ``Trace(name)`` / ``trace_me(name)``: a named range, recorded as a
  ``torch.profiler.record_function`` range, so it shows up in a ``torch.profiler.profile`` of
  the program (host side; torch_spmd's device work runs inside ``sync``).
- ``StepTrace(name)``: a ``Trace`` that ends the step (``sync()``) on exit, as PyTorch/XLA's does.

``start_server``, ``trace``, ``trace_detached``, ``start_trace`` and ``stop_trace`` (the XLA
profiler service and its trace files) raise NotImplementedError; use ``torch.profiler`` for
host-side profiles and ``torch_spmd.debug.last_step_stats()`` for per-step device statistics.
"""
import functools

import torch

from .._impl import step as _step

_TRACER_MARKED_STEP: bool = False

_NO_PROFILER = ("torch_spmd has no XLA profiler service (no profiler server or device traces); "
                "use torch.profiler.profile() for host-side traces (Trace/StepTrace ranges appear "
                "in it) and torch_spmd.debug.last_step_stats() for per-step device statistics")


def set_tracer_marked_step(value: bool) -> None:
    global _TRACER_MARKED_STEP
    _TRACER_MARKED_STEP = value


def get_tracer_marked_step() -> bool:
    return _TRACER_MARKED_STEP


def start_server(port: int, only_on_master: bool = True):
    """Not implemented: raises NotImplementedError (no XLA profiler server)."""
    raise NotImplementedError("start_server: " + _NO_PROFILER)


def trace(service_addr: str, logdir: str, duration_ms: int = 1000, num_tracing_attempts: int = 3,
          host_tracer_level: int = 2, device_tracer_level: int = 1, delay_ms: int = 0,
          timeout_s: int = 120, interval_s: int = 5):
    """Not implemented: raises NotImplementedError (no XLA profiler service)."""
    raise NotImplementedError("trace: " + _NO_PROFILER)


def trace_detached(*args, **kwargs):
    """Not implemented: raises NotImplementedError (at once, not in a background thread)."""
    raise NotImplementedError("trace_detached: " + _NO_PROFILER)


def start_trace(log_dir) -> None:
    """Not implemented: raises NotImplementedError."""
    raise NotImplementedError("start_trace: " + _NO_PROFILER)


def stop_trace() -> None:
    """Not implemented: raises NotImplementedError."""
    raise NotImplementedError("stop_trace: " + _NO_PROFILER)


class Trace:
    """A named range (``torch.profiler.record_function(name)``) while the block runs. Keyword
    arguments (PyTorch/XLA's trace metadata) are accepted and not recorded."""

    def __init__(self, name: str, **kwargs):
        self.name = name
        self._range = None

    def __enter__(self):
        self._range = torch.profiler.record_function(self.name)
        self._range.__enter__()
        return self

    def __exit__(self, type, value, traceback):
        rng, self._range = self._range, None
        if rng is not None:
            rng.__exit__(type, value, traceback)
        return False


class StepTrace(Trace):
    """A ``Trace`` for one training step: on exit the step ends (``torch_xla.sync()``), as in
    PyTorch/XLA."""

    def __enter__(self):
        set_tracer_marked_step(True)
        return super().__enter__()

    def __exit__(self, type, value, traceback):
        try:
            if type is None:
                _step.mark_step()
        finally:
            super().__exit__(type, value, traceback)
        return False


def trace_me(scope: str):
    """Decorator: runs the function inside ``Trace(scope)``."""

    def decorator_trace_me(func):

        @functools.wraps(func)
        def wrapper_trace_me(*args, **kwargs):
            with Trace(scope):
                return func(*args, **kwargs)

        return wrapper_trace_me

    return decorator_trace_me
