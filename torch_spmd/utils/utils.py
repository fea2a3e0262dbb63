"""Generic helpers under the names PyTorch/XLA scripts import from ``torch_xla.utils.utils``
(``xu``): environment parsing, a synthetic-batch generator for benchmarks, and tree walks.
Nothing here touches devices; it exists so that such scripts run under
``python -m torch_spmd.xla`` (the functions are this project's own implementations of the same
documented behaviour).
"""
import contextlib
import copy
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, List

_TRUE = {"1", "true", "yes", "on", "y"}


def getenv_as(name: str, type: Callable, defval: Any = None) -> Any:
    """``type(os.environ[name])``, or ``defval`` when unset. A ``bool`` type parses the usual
    true words ("1", "true", "yes", "on", "y"; case-insensitive)."""
    value = os.environ.get(name)
    if value is None:
        return defval
    if type is bool:
        return value.strip().lower() in _TRUE
    return type(value)


def check_env_flag(name: str, default: str = "") -> bool:
    """Whether the environment variable ``name`` (or ``default``) is a true word."""
    return os.environ.get(name, default).strip().lower() in _TRUE


def as_list(t: Any) -> List[Any]:
    """``t`` if it is a list or tuple (as a list), else ``[t]``."""
    return list(t) if isinstance(t, (list, tuple)) else [t]


class LazyProperty:
    """A value computed by ``gen_fn()`` on first access of ``.value``."""

    _UNSET = object()

    def __init__(self, gen_fn: Callable[[], Any]):
        self._gen_fn = gen_fn
        self._value = self._UNSET

    @property
    def value(self) -> Any:
        if self._value is self._UNSET:
            self._value = self._gen_fn()
        return self._value


class SampleGenerator:
    """Yields the same ``data`` ``sample_count`` times: fake input for benchmarks."""

    def __init__(self, data: Any, sample_count: int):
        self._data = data
        self._sample_count = sample_count

    def __len__(self) -> int:
        return self._sample_count

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self._sample_count):
            yield self._data


class TmpFolder:
    """A temporary directory (``.name``) removed when the object is collected."""

    def __init__(self):
        self.name = tempfile.mkdtemp()

    def __del__(self):
        shutil.rmtree(self.name, ignore_errors=True)


def _walk(value: Any, select_fn: Callable, fn: Callable, seen: set) -> None:
    if id(value) in seen:
        return
    seen.add(id(value))
    if select_fn(value):
        fn(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk(k, select_fn, fn, seen)
            _walk(v, select_fn, fn, seen)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            _walk(v, select_fn, fn, seen)
    elif hasattr(value, "__dict__"):
        for v in vars(value).values():
            _walk(v, select_fn, fn, seen)


def for_each_instance(value: Any, select_fn: Callable, fn: Callable) -> None:
    """Calls ``fn(x)`` for every ``x`` nested in ``value`` (containers and object attributes,
    each object once) for which ``select_fn(x)`` holds."""
    _walk(value, select_fn, fn, set())


def for_each_instance_rewrite(value: Any, select_fn: Callable, fn: Callable) -> Any:
    """A copy of ``value`` with every nested ``x`` selected by ``select_fn`` replaced by
    ``fn(x)`` (containers rebuilt, objects shallow-copied; shared objects rewritten once)."""
    memo = {}

    def rewrite(v):
        if id(v) in memo:
            return memo[id(v)]
        if select_fn(v):
            out = fn(v)
        elif isinstance(v, dict):
            out = type(v)((rewrite(k), rewrite(x)) for k, x in v.items())
        elif isinstance(v, (list, tuple, set)):
            items = [rewrite(x) for x in v]
            out = type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            out = copy.copy(v)
            memo[id(v)] = out
            for k, x in vars(v).items():
                setattr(out, k, rewrite(x))
            return out
        else:
            out = v
        memo[id(v)] = out
        return out

    return rewrite(value)


def eprint(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)


def null_print(*args, **kwargs) -> None:
    pass


def get_print_fn(debug: bool = None) -> Callable:
    if debug is None:
        debug = check_env_flag("DEBUG")
    return eprint if debug else null_print


@contextlib.contextmanager
def timed(msg: str = "", printfn: Callable = eprint) -> Iterator[None]:
    """Prints how long the block took."""
    start = time.perf_counter()
    yield
    printfn(f"{msg}{time.perf_counter() - start:.6f}s")


def get_free_tcp_ports(n: int = 1) -> List[int]:
    """``n`` TCP ports free on this host right now."""
    sockets, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports
