"""PyTorch/XLA's ``torch_xla.distributed.xla_multiprocessing`` (``xmp``): one process per replica.

``spawn(fn, args, nprocs)`` starts ``nprocs`` processes; each drives ONE emulated device, joins a
torch.distributed gloo world and calls ``fn(ordinal, *args)``, where ``ordinal`` is its global
replica ordinal (``xm.get_ordinal()``). Collectives between replicas are explicit
(``xm.all_reduce``, ``xm.optimizer_step``, ...), as in PyTorch/XLA's multi-process mode.

Across machines, the process running ``spawn`` is one of ``WORLD_SIZE`` launchers (rank
``RANK``, default 0 of 1), exactly the variables torchrun sets; launcher ``RANK`` runs replicas
``RANK * nprocs ... RANK * nprocs + nprocs - 1`` of ``WORLD_SIZE * nprocs``. The world meets at
``MASTER_ADDR`` (default 127.0.0.1) : ``MASTER_PORT`` (default: a free port, single launcher
only). See docs/multiprocess.md.

Under torchrun, every worker process already is one replica: ``spawn`` with one replica per
launcher (``nprocs`` None or 1) runs ``fn`` in the worker itself, joined to the world torchrun
describes (``torch_spmd.distributed.init_multiprocess``), instead of starting a child.
"""
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import traceback

import torch.distributed as dist

from .._impl import process_world as _process_world
from .._impl import process_span as _process_span

# Seconds between asking the surviving processes to stop (SIGTERM) and killing them.
_TERMINATE_GRACE = 5.0
# Longest traceback a child sends back: a pipe write larger than the pipe's buffer would block
# the child until the parent reads, and the parent only reads after the child exits.
_MAX_TRACEBACK = 32 * 1024

_env_lock = threading.Lock()


class ProcessRaisedException(RuntimeError):
    """A replica process raised: the message holds its traceback."""

    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg)
        self.error_index = error_index
        self.pid = error_pid


class ProcessExitedException(RuntimeError):
    """A replica process exited with a non-zero code or was killed by a signal."""

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        super().__init__(msg)
        self.error_index = error_index
        self.pid = error_pid
        self.exit_code = exit_code
        self.signal_name = signal_name


def _env_int(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _free_port():
    """A port free on every interface now (replica 0 binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# Set in the processes spawn_spmd starts: each joins a multi-process SPMD world (several
# devices per process, one mesh) instead of being one replica with one device.
_SPMD_WORLD_ENV = "TORCH_SPMD_SPAWNED_SPMD"


def _replica_envs(nprocs, spmd=False):
    """The environment of each replica process, from the launcher's torchrun-style variables."""
    launchers = _env_int("WORLD_SIZE", 1)
    launcher = _env_int("RANK", 0)
    local_launcher = _env_int("LOCAL_RANK", 0)
    local_launchers = _env_int("LOCAL_WORLD_SIZE", 1)
    if not 0 <= launcher < launchers:
        raise ValueError(f"RANK={launcher} is not in [0, WORLD_SIZE={launchers})")
    addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = os.environ.get("MASTER_PORT")
    if not port:
        if launchers > 1:
            raise ValueError("MASTER_PORT must be set (the same on every machine) when "
                             f"WORLD_SIZE={launchers} launchers spawn replicas")
        port = str(_free_port())
    envs = []
    for index in range(nprocs):
        envs.append({
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(launchers * nprocs),
            "RANK": str(launcher * nprocs + index),
            "LOCAL_RANK": str(local_launcher * nprocs + index),
            "LOCAL_WORLD_SIZE": str(local_launchers * nprocs),
        })
        if spmd:
            # The global device count, split over the processes (torch_spmd._impl.process_span).
            envs[-1]["SPMD_NUM_DEVICES"] = os.environ.get("SPMD_NUM_DEVICES", "8")
            envs[-1][_SPMD_WORLD_ENV] = "1"
        else:
            # One device per replica process; set before torch_spmd creates its device set.
            envs[-1]["SPMD_NUM_DEVICES"] = "1"
    return envs


@contextlib.contextmanager
def _environ(**values):
    """This process's environment (which processes started meanwhile inherit) with ``values``
    set, restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _replica_main(index, fn, args, env, error_queue):
    """Body of one replica process."""
    os.environ.update(env)
    try:
        if env.get(_SPMD_WORLD_ENV):
            _process_span.init()
            fn(int(env["RANK"]), *args)
            _process_span.shutdown(barrier=True)
        else:
            _process_world.init_from_env()
            fn(int(env["RANK"]), *args)
            _process_world.shutdown(barrier=True)
    except Exception:
        # The parent re-raises this; the others are terminated, so no one waits on a barrier.
        tb = traceback.format_exc()
        if len(tb) > _MAX_TRACEBACK:
            tb = "...\n" + tb[-_MAX_TRACEBACK:]
        error_queue.put((time.time(), tb))  # when: orders failures noticed together
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip atexit hooks: gloo teardown could block on a dead peer


class ProcessContext:
    """The replica processes of one ``spawn``; ``join`` waits for them."""

    def __init__(self, processes, error_queues):
        self.processes = processes
        self.error_queues = error_queues
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self):
        return [p.pid for p in self.processes]

    def join(self, timeout=None) -> bool:
        """Waits up to ``timeout`` seconds (None: until a change) for the processes. Returns
        True once all exited successfully, False if some still run. On the first failure it
        stops the others (SIGTERM, then SIGKILL after a grace period) and raises
        ProcessRaisedException (with the child's traceback) or ProcessExitedException."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        failed = []
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            self.processes[index].join()
            if self.processes[index].exitcode != 0:
                failed.append(index)
        if not failed:
            return not self.sentinels
        self._stop_all()
        raise self._error(failed)

    def _stop_all(self):
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + _TERMINATE_GRACE
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        self.sentinels.clear()

    def _exit_description(self, index):
        code = self.processes[index].exitcode
        if code is not None and code < 0:
            return f"process {index} terminated with signal {signal.Signals(-code).name}"
        return f"process {index} terminated with exit code {code}"

    def _error(self, failed):
        """The exception for the first failure noticed: the processes in ``failed`` exited
        together. A replica that loses a peer fails only after that peer exited, so the first
        exit is the root cause; within one batch a process that died without raising comes
        first, then the earliest exception."""
        tracebacks = {}  # index -> (time raised, traceback)
        for i, q in enumerate(self.error_queues):
            if not q.empty():
                tracebacks[i] = q.get()
        silent = [i for i in failed if i not in tracebacks]
        index = silent[0] if silent else min(failed, key=lambda i: tracebacks[i][0])
        p = self.processes[index]
        others = "".join(f"\n-- Process {i} also failed:\n{tb}"
                         for i, (_, tb) in sorted(tracebacks.items()) if i != index)
        if index in tracebacks:
            return ProcessRaisedException(
                f"\n\n-- Process {index} terminated with the following error:\n"
                f"{tracebacks[index][1]}{others}", index, p.pid)
        code = p.exitcode
        name = signal.Signals(-code).name if code is not None and code < 0 else None
        return ProcessExitedException(self._exit_description(index) + others, index, p.pid,
                                      code, name)


def _run_in_this_process(fn, args):
    """A torchrun worker as the replica: joins the world torchrun describes (unless the script
    already did), runs ``fn(ordinal, *args)`` and leaves the world it joined. An exception
    propagates: torchrun reports it and stops the other workers."""
    joined_here = not _process_world.is_multiprocess()
    _process_world.join_from_launcher()
    fn(_process_world.current().rank, *args)
    if joined_here:
        _process_world.shutdown(barrier=True)


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    """Runs ``fn(ordinal, *args)`` in ``nprocs`` new processes, one replica (and one emulated
    device) each, joined in a gloo process group.

    ``nprocs``: replicas this launcher runs; None = one per device of the host
    (``SPMD_NUM_DEVICES``, default 8) or 1 when launched by torchrun (RANK set). In a torchrun
    worker, one replica (``nprocs`` None or 1, ``join=True``) runs in the worker itself: it
    is a replica of torchrun's world, and ``fn``'s exceptions propagate as they are. ``join``:
    wait for them and raise the first failure (``ProcessRaisedException`` carries the child's
    traceback); False returns the ``ProcessContext`` to join later. A failing replica makes
    ``spawn`` stop the others, so a replica waiting in a collective for a dead peer never hangs
    the parent.
    """
    if nprocs is None:
        nprocs = 1 if os.environ.get("RANK") else _env_int("SPMD_NUM_DEVICES", 8)
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if nprocs == 1 and join and dist.is_torchelastic_launched():
        _run_in_this_process(fn, args)
        return None
    return _start(_replica_envs(nprocs), fn, args, join, daemon, start_method)


def spawn_spmd(fn, args=(), nprocs=2, join=True, daemon=False, start_method="spawn"):
    """Runs ``fn(process_index, *args)`` in ``nprocs`` new processes that together form ONE
    multi-process SPMD world: the ``SPMD_NUM_DEVICES`` global devices (default 8) split evenly
    over them, one mesh, the same program in each (docs/multihost_spmd.md). The one-host
    stand-in for one process per host of a pod; failures are reported as ``spawn``'s.
    With several launchers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, one per machine),
    launcher r runs processes ``r * nprocs ..``, as ``spawn`` does."""
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    return _start(_replica_envs(nprocs, spmd=True), fn, args, join, daemon, start_method)


def _start(envs, fn, args, join, daemon, start_method):
    """Starts one process per environment of ``envs`` running ``fn``; joins them if ``join``."""
    ctx = multiprocessing.get_context(start_method)
    processes, error_queues = [], []
    for index, env in enumerate(envs):
        q = ctx.SimpleQueue()
        p = ctx.Process(target=_replica_main, args=(index, fn, args, env, q), daemon=daemon)
        # A spawned child imports the caller's modules (unpickling fn) before _replica_main
        # runs: give it its environment from the start.
        with _env_lock, _environ(**env):
            p.start()
        processes.append(p)
        error_queues.append(q)
    context = ProcessContext(processes, error_queues)
    if not join:
        return context
    try:
        while not context.join():
            pass
    except BaseException:
        context._stop_all()  # also on KeyboardInterrupt: never leave replicas behind
        raise
    return None
