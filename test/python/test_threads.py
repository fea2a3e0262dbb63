"""Intra-op threads on import (torch_spmd/_threads.py): the cores of the process by default,
SPMD_NUM_THREADS when set, torch's own choice when OMP_NUM_THREADS / MKL_NUM_THREADS is set.
Each case runs in a fresh interpreter, since the rule applies once, on import."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = ("import os, torch, torch_spmd; "
         "print(torch.get_num_threads(), len(os.sched_getaffinity(0)))")


def _threads(preexec_fn=None, **env_vars):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SPMD_NUM_THREADS",
                        "LOCAL_WORLD_SIZE")}
    env.update(env_vars)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120, preexec_fn=preexec_fn)
    assert out.returncode == 0, out.stderr
    threads, cores = map(int, out.stdout.split())
    return threads, cores


def test_default_is_the_process_cores():
    threads, cores = _threads()
    assert threads == cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_default_follows_the_affinity_mask():
    first = min(os.sched_getaffinity(0))
    threads, cores = _threads(preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    assert (threads, cores) == (1, 1)


def test_processes_of_one_host_share_its_cores():
    # xmp.spawn / torchrun replicas: each gets its share (at least one), never all the cores.
    threads, cores = _threads(LOCAL_WORLD_SIZE="2")
    assert threads == max(1, cores // 2)
    threads, cores = _threads(LOCAL_WORLD_SIZE=str(8 * cores))
    assert threads == 1


def test_spmd_num_threads():
    assert _threads(SPMD_NUM_THREADS="1")[0] == 1
    assert _threads(SPMD_NUM_THREADS="3")[0] == 3


def test_spmd_num_threads_wins_over_omp():
    assert _threads(SPMD_NUM_THREADS="2", OMP_NUM_THREADS="1")[0] == 2


def test_omp_num_threads_is_left_to_torch():
    assert _threads(OMP_NUM_THREADS="1")[0] == 1


def test_bad_value_raises():
    env = {k: v for k, v in os.environ.items() if k != "SPMD_NUM_THREADS"}
    env.update(SPMD_NUM_THREADS="zero", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", "import torch_spmd"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "SPMD_NUM_THREADS" in out.stderr


RECORDERS = """
import threading, numpy as np, torch
import torch_spmd, torch_spmd.runtime as xr, torch_spmd.distributed.spmd as xs
xr.use_spmd()
dev = torch_spmd.device()
mesh = xs.Mesh(np.arange(8), (8,), ("x",))
done, wrong = [], []

def work(k):
    g = torch.Generator().manual_seed(k)
    a = torch.randn(64, 32, generator=g, dtype=torch.float64)
    b = torch.randn(32, 16, generator=g, dtype=torch.float64)
    for i in range(100):
        x = a.to(dev)
        xs.mark_sharding(x, mesh, ("x", None))   # a binding that takes the graph lock
        got = (torch.tanh(x @ b.to(dev)) * (i + 1)).sum(0).cpu()
        if not torch.allclose(got, (torch.tanh(a @ b) * (i + 1)).sum(0), rtol=1e-12, atol=1e-12):
            wrong.append((k, i))
    done.append(k)

threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(sorted(done), wrong)
"""


def test_python_threads_recording_at_once_equal_cpu():
    # Four threads record, annotate and read back their own values at once. (The graph lock
    # used to be waited for with the GIL held: a thread in mark_sharding and one whose op
    # released a tensor's Python object under the lock deadlocked.)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", RECORDERS], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[0, 1, 2, 3] []", out.stdout
