"""The step boundary: runs everything recorded so far as one graph, then the step closures
(``xm.add_step_closure``). Below both ``torch_spmd.sync`` and ``xm.mark_step``."""
from .. import _C

_closures = []


def add_step_closure(closure, args=()) -> None:
    """Runs ``closure(*args)`` after the current step's graph has executed."""
    _closures.append((closure, args))


def mark_step() -> None:
    global _closures
    _C._mark_step()
    closures, _closures = _closures, []
    for fn, args in closures:
        fn(*args)
