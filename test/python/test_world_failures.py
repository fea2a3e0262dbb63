"""A multi-process SPMD world when one process fails (issue 51; runtime/world_health.h): a step
that raises in one process only, a process stopped (SIGSTOP) or killed (SIGKILL) mid-training.
The others must raise within seconds, naming the process (and its error), instead of waiting
in their next exchange for SPMD_DIST_TIMEOUT (30 minutes)."""
import json
import os
import signal
import sys
import time

import numpy as np
import pytest
import torch

import torch_spmd.distributed.xla_multiprocessing as xmp

pytestmark = pytest.mark.slow  # processes

HEARTBEAT = 3.0


def _setup():
    import torch_spmd
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    return torch_spmd.device(), xs.Mesh(np.arange(n), (n,), ("data",)), xs, xr


def _exchange(dev, mesh, xs):
    """A step whose sum crosses the processes (an all-reduce over 'data')."""
    t = torch.ones(16, 4).to(dev)
    xs.mark_sharding(t, mesh, ("data", None))
    return (t * 2).sum().item()


def _record(out_dir, index, **values):
    with open(os.path.join(out_dir, f"p{index}.json"), "w") as f:
        json.dump(values, f)


def _await(out_dir, index, limit=90):
    deadline = time.time() + limit
    while time.time() < deadline and not os.path.exists(os.path.join(out_dir, f"p{index}.json")):
        time.sleep(0.1)


def _failing_step_worker(index, out_dir):
    dev, mesh, xs, xr = _setup()
    _exchange(dev, mesh, xs)
    x = torch.arange(16.0).to(dev)
    # The indices of process 1's copy are out of range: its devices' kernels raise, process 0's
    # do not, and process 0 goes on into the sum's all-reduce.
    i = (torch.arange(16) + (100 if xr.process_index() == 1 else 0)).to(dev)
    xs.mark_sharding(i, mesh, ("data",))
    started = time.time()
    try:
        torch.index_select(x, 0, i).sum().item()
        outcome = "no error"
    except (RuntimeError, IndexError) as e:  # (process 1: the kernel's IndexError)
        outcome = str(e)
    _record(out_dir, index, seconds=time.time() - started, error=outcome)
    if index == 1:
        _await(out_dir, 0)  # alive (it caught its error), its sockets open


def _stopping_worker(index, out_dir, sig):
    dev, mesh, xs, xr = _setup()
    _exchange(dev, mesh, xs)
    if index == 1:
        os.kill(os.getpid(), sig)
        time.sleep(600)
    started = time.time()
    try:
        _exchange(dev, mesh, xs)
    except RuntimeError as e:
        _record(out_dir, index, seconds=time.time() - started, error=str(e))
        raise  # spawn_spmd reports it, and stops process 1


def _run(worker, out_dir, *args):
    os.environ["SPMD_HEARTBEAT_SECONDS"] = str(HEARTBEAT)
    try:
        ctx = xmp.spawn_spmd(worker, args=(str(out_dir),) + args, nprocs=2, join=False)
        _await(str(out_dir), 0, limit=120)
        for p in ctx.processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        os.environ.pop("SPMD_HEARTBEAT_SECONDS", None)
    with open(os.path.join(out_dir, "p0.json")) as f:
        return json.load(f), ctx


def test_a_step_that_fails_in_one_process_aborts_the_others(tmp_path):
    p0, _ = _run(_failing_step_worker, tmp_path)
    with open(tmp_path / "p1.json") as f:
        p1 = json.load(f)
    assert "index" in p1["error"] and "out of range" in p1["error"], p1
    assert "world was aborted" in p0["error"] and "process 1 failed its step" in p0["error"], p0
    assert "out of range" in p0["error"], p0  # process 1's own error, named
    assert p0["seconds"] < 10, p0


def test_a_stopped_process_is_named_within_a_heartbeat(tmp_path, monkeypatch):
    # Its sockets stay open: only its silence tells. spawn_spmd then reports process 0's error
    # and stops process 1.
    monkeypatch.setenv("SPMD_HEARTBEAT_SECONDS", str(HEARTBEAT))
    with pytest.raises(xmp.ProcessRaisedException, match="process 1 has sent no heartbeat"):
        xmp.spawn_spmd(_stopping_worker, args=(str(tmp_path), signal.SIGSTOP), nprocs=2)
    with open(tmp_path / "p0.json") as f:
        p0 = json.load(f)
    assert "world was aborted" in p0["error"], p0
    assert p0["seconds"] < 2 * HEARTBEAT + 3, p0


def test_a_killed_process_is_named_within_a_heartbeat(tmp_path):
    # (Left to process 0 alone: spawn_spmd would report the killed process and stop process 0.)
    p0, _ = _run(_stopping_worker, tmp_path, signal.SIGKILL)
    assert "world was aborted" in p0["error"], p0
    assert "process 1 has sent no heartbeat" in p0["error"], p0
    assert p0["seconds"] < 2 * HEARTBEAT + 3, p0
