"""Which multi-process world this process is a replica of: None outside multi-process mode.

State only, so that everything may read it: ``torch_spmd.distributed._process_world`` joins and
leaves worlds (it sets this), ``runtime`` (xr) and ``xm`` read it.
"""
import threading

lock = threading.Lock()  # held while a world is joined or left
_current = None


def current():
    return _current


def set_current(world) -> None:
    global _current
    _current = world
