"""Which multi-process world this process is a replica of: None outside multi-process mode.

State only, so that everything may read it: ``torch_spmd._impl.process_world`` joins and
leaves worlds (it sets this), ``runtime`` (xr) and ``xm`` read it.
"""
import threading
from typing import Callable, Optional

lock = threading.RLock()  # held while a world is joined or left
_current = None
# A join that waits for torch.distributed's default group to exist (the ``xla`` backend is
# created inside dist.init_process_group, before that group is): it returns whether it joined,
# and runs the first time the world is asked for after that.
_pending: Optional[Callable[[], bool]] = None


def current():
    global _pending
    if _pending is not None:
        with lock:
            if _pending is not None and _pending():
                _pending = None
    return _current


def set_current(world) -> None:
    global _current
    _current = world


def set_pending(join: Optional[Callable[[], bool]]) -> None:
    global _pending
    _pending = join
