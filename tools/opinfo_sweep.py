#!/usr/bin/env python
"""Runs PyTorch's own OpInfo database (``op_db``) on the spmd device and compares every result
with CPU eager.

Usage (from the repository root, after a build):

    PYTHONPATH=$PWD python tools/opinfo_sweep.py --mode both --json /tmp/opinfo.json
    PYTHONPATH=$PWD python tools/opinfo_sweep.py --mode sharded --ops '^(cumsum|sort)$' -v

What it does, per op of ``op_db`` that has CPU samples of the dtype (``--dtype``, default
float32: ``op.supported_dtypes('cpu')`` contains it), for up to ``--max-samples`` of
``op.sample_inputs('cpu', dtype)``:

- CPU: runs the op on the sample; a sample whose CPU run raises is skipped.
- device: runs the op on a copy of the sample whose tensors (also inside lists, tuples, dicts
  and kwargs) are on the spmd device, and whose ``device='cpu'`` arguments name the spmd device.
  Mode ``unsharded`` leaves them unannotated (replicated); mode ``sharded`` marks every tensor
  with ``size(0) >= 2`` and even ``size(0)`` sharded on dim 0 over an 8-device 1-D mesh
  (``xs.Mesh(range(8), (8,), ('x',))``, spec ``('x', None, ...)``). Sizes not divisible by 8
  give padded shards; their padding is filled with NaN (integers: a large value) unless
  ``--no-poison``, so an op that reads the padding shows up (the padding is unspecified).
  Two exceptions, both as in PyTorch's own CUDA runs of op_db: tensors that OpInfo creates on
  the CPU whatever device it is asked for (``tensor_split``'s indices, ``narrow``'s start, ...;
  found by generating the same samples for the 'meta' device) stay on the CPU; and a sample
  tensor that is a view into a larger storage is moved as its base plus the same view
  (``as_strided``), so storage-level ops see the same storage.
- compares outputs (structure, tensor shape, dtype, device, values with
  ``torch.testing.assert_close(equal_nan=True)``) and the inputs after the call (in-place
  ops). Tolerances (``DTYPE_TOLERANCES``): float32 rtol=1.3e-6, atol=1e-5, raised to the op's
  own ``toleranceOverride`` / ``precisionOverride`` for the dtype from its OpInfo decorators
  where it has one; a result of another dtype at least as loose as that dtype's.
- random ops (``RANDOM_OPS`` below and ``op.has_nondeterministic_output``, e.g. ``empty``), and
  random samples of other ops (the CPU run drew from the default generator, e.g. SDPA with
  ``dropout_p > 0``; detected through OpInfo's ``wrapper_set_seed``): only structure, shapes,
  dtypes and devices are compared.

An op agrees when every sample it tried agrees; an op with no sample that runs on CPU is
"skipped" and not counted. A device error where CPU succeeded, a hang (``--timeout`` seconds
without progress on one sample) or a crash of the process is a disagreement. Each mode runs in
worker subprocesses; a worker that hangs or crashes is replaced and the sweep continues with
the next op.
"""
import argparse
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

DEFAULT_RTOL = 1.3e-6
DEFAULT_ATOL = 1e-5
# (rtol, atol) per dtype: torch.testing.assert_close's defaults, which PyTorch's own device
# tests start from; integers and bool compare exactly.
DTYPE_TOLERANCES = {"float32": (DEFAULT_RTOL, DEFAULT_ATOL), "bfloat16": (1.6e-2, 1e-5),
                    "float16": (1e-3, 1e-5), "int64": (0.0, 0.0), "bool": (0.0, 0.0)}
DTYPES = tuple(DTYPE_TOLERANCES)
MODES = ("unsharded", "sharded")
MESH_SIZE = 8

# Ops whose values depend on a random generator (or are uninitialized memory): only the
# structure, shapes, dtypes and devices of their results are compared. Names are OpInfo full
# names (name + '.' + variant_test_name). ``op.has_nondeterministic_output`` adds the rest.
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
    "normal.in_place", "normal.number_mean", "uniform", "multinomial",
    "rand_like", "randn", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu", "svd_lowrank", "pca_lowrank",
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
}


def _stub_expecttest() -> None:
    """torch.testing._internal imports ``expecttest`` (a test-only dependency pip's torch does not
    install); only its TestCase base class is needed to build op_db."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        mod = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            pass

        mod.TestCase = TestCase
        mod.ACCEPT = False
        sys.modules["expecttest"] = mod


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def load_ops(regex=None, every=1, dtype="float32"):
    """The OpInfos with CPU samples of ``dtype``, in op_db order, as (index, name, opinfo);
    ``regex`` (re.search on the full name) and ``every`` (every k-th op by index) select a
    subset. The index is the position in this list before any selection, so it is stable."""
    _stub_expecttest()
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    want = getattr(torch, dtype)
    ops = []
    for op in op_db:
        try:
            ok = want in op.supported_dtypes("cpu")
        except Exception:
            ok = False
        if ok:
            ops.append(op)
    pat = re.compile(regex) if regex else None
    out = []
    for i, op in enumerate(ops):
        name = full_name(op)
        if i % every != 0:
            continue
        if pat is not None and not pat.search(name):
            continue
        out.append((i, name, op))
    return out


# ------------------------------------------------------------------------------------------
# Worker side: runs ops and reports one JSON line per event on stdout.
# ------------------------------------------------------------------------------------------

def _op_tolerances(op, dtype="float32"):
    """(rtol, atol) for ``dtype``: its defaults, raised to the largest tolerance override for
    that dtype among the op's OpInfo decorators (any test, CPU or any device)."""
    import torch
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    rtol, atol = DTYPE_TOLERANCES[dtype]
    key = getattr(torch, dtype)
    for info in list(getattr(op, "decorators", ()) or ()):
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for dec in getattr(info, "decorators", ()) or ():
            if isinstance(dec, toleranceOverride):
                t = dec.d.get(key)
                if t is not None:
                    rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
            elif isinstance(dec, precisionOverride):
                p = dec.d.get(key)
                if p is not None:
                    atol = max(atol, p)
    return rtol, atol


class _Timeout(Exception):
    pass


def _one_line(e: BaseException, limit: int = 300) -> str:
    msg = str(e).strip()
    # Drop PyTorch's boilerplate: the dispatcher's advice and C++ stack traces.
    msg = re.split(r" This could be because the operator doesn't exist|\nException raised from ",
                   msg)[0]
    msg = msg.replace("\n", " | ")
    msg = re.sub(r"\s+", " ", msg)
    if len(msg) > limit:
        msg = msg[:limit] + "..."
    return f"{type(e).__name__}: {msg}"


class Worker:
    def __init__(self, mode: str, poison: bool, dtype: str = "float32"):
        _stub_expecttest()
        import torch
        import torch_spmd
        import torch_spmd.distributed.spmd as xs
        import torch_spmd.runtime as xr
        from torch_spmd import _C

        self.torch, self.torch_spmd, self.xs, self._C = torch, torch_spmd, xs, _C
        if xr.global_runtime_device_count() != MESH_SIZE:
            import gc
            gc.collect()
            xr.configure_devices(MESH_SIZE, "16GiB")
        xr.use_spmd()
        self.mode = mode
        self.poison = poison
        self.dtype_name = dtype
        self.dtype = getattr(torch, dtype)
        self.dev = torch_spmd.device()
        self.mesh = xs.Mesh(list(range(MESH_SIZE)), (MESH_SIZE,), ("x",))
        self._install_draw_detector()

    def _install_draw_detector(self) -> None:
        """Random OpInfos call ``wrapper_set_seed`` (seed 42 inside ``freeze_rng_state``, which
        restores the generator afterwards, so a draw leaves no trace outside). Wrapping it
        records whether the sample really drew random numbers (dropout_p > 0, training=True)."""
        torch = self.torch
        import torch.testing._internal.common_methods_invocations as cmi
        from torch.testing._utils import freeze_rng_state
        self.drew = False
        worker = self

        def wrapper_set_seed(op, *args, **kwargs):
            with freeze_rng_state():
                torch.manual_seed(42)
                before = torch.get_rng_state()
                output = op(*args, **kwargs)
                if not torch.equal(before, torch.get_rng_state()):
                    worker.drew = True
            return output

        cmi.wrapper_set_seed = wrapper_set_seed

    # -- trees ---------------------------------------------------------------------------
    def tree_map(self, fn, obj):
        if isinstance(obj, (list, tuple)):
            mapped = [self.tree_map(fn, o) for o in obj]
            if hasattr(obj, "_fields"):  # namedtuples (torch.return_types)
                return type(obj)(*mapped)
            return type(obj)(mapped) if isinstance(obj, list) else tuple(mapped)
        if isinstance(obj, dict):
            return {k: self.tree_map(fn, v) for k, v in obj.items()}
        return fn(obj)

    def leaves(self, obj):
        out = []
        self.tree_map(out.append, obj)
        return out

    # -- moving a sample to the device ------------------------------------------------------
    def _poison_value(self, dtype):
        if dtype.is_floating_point or dtype.is_complex:
            return float("nan")
        if dtype == self.torch.bool:
            return True
        return 77 if dtype in (self.torch.int8, self.torch.uint8, self.torch.int16) else 1 << 20

    def _poison_padding(self, t) -> None:
        shards = self._C._local_shards(t)
        padded = False
        out = []
        for _device, data, _offsets, lengths, _ in sorted(shards, key=lambda s: s[0]):
            data = data.clone()
            for d, length in enumerate(lengths):
                if length < data.shape[d]:
                    padded = True
                    data.narrow(d, length, data.shape[d] - length).fill_(
                        self._poison_value(data.dtype))
            out.append(data)
        if padded:
            self._C._load_local_shards(t, out)

    def _upload(self, x):
        """A fresh device copy of CPU tensor ``x``, sharded on dim 0 in sharded mode when
        ``size(0)`` is even and >= 2."""
        y = x.detach().clone().to(self.dev)
        if self.mode == "sharded" and y.dim() >= 1 and y.size(0) >= 2 and y.size(0) % 2 == 0 \
                and y.layout == self.torch.strided:
            self.xs.mark_sharding(y, self.mesh, ("x",) + (None,) * (y.dim() - 1))
            if self.poison:
                self._poison_padding(y)
        return y

    def _move(self, x, pinned, bases):
        torch = self.torch
        if isinstance(x, torch.Tensor):
            if pinned:
                # OpInfo creates this tensor on the CPU whatever the device (e.g. the indices of
                # tensor_split); it stays there, as it does in PyTorch's CUDA runs.
                return x.detach().clone()
            base = x._base
            if base is not None and x.layout == torch.strided and base.layout == torch.strided \
                    and (x.storage_offset() != 0 or not x.is_contiguous()
                         or base.numel() != x.numel()):
                # A view into a larger storage (noncontiguous / partial-view samples): the device
                # gets its base and the same view of it, so storage-level ops (as_strided) see
                # the same storage.
                key = id(base)
                if key not in bases:
                    bases[key] = self._upload(base)
                y = bases[key].as_strided(x.size(), x.stride(), x.storage_offset())
            else:
                y = self._upload(x)
            if x.requires_grad:
                y.requires_grad_(True)
            return y
        if isinstance(x, torch.device) and x.type == "cpu":
            return self.dev
        if isinstance(x, str) and x == "cpu":
            return self.dev
        return x

    def to_device(self, obj, pinned=()):
        """``obj`` with its tensors on the device; ``pinned``: indices (in ``leaves`` order) of
        tensors that stay on the CPU."""
        counter = [0]
        bases = {}
        self.moved = False

        def move(x):
            i = counter[0]
            counter[0] += 1
            y = self._move(x, i in pinned, bases)
            if y is not x and (isinstance(y, self.torch.device)
                               or (isinstance(y, self.torch.Tensor) and y.device == self.dev)):
                self.moved = True
            return y

        return self.tree_map(move, obj)

    def host_pinned(self, op, samples):
        """Per sample, the leaf indices of tensors that OpInfo puts on the CPU whatever device it
        is asked for: found by generating the same samples for the 'meta' device (tensors still
        on the CPU there are pinned). Empty sets when that fails or does not line up."""
        torch = self.torch
        import itertools
        none = [set() for _ in samples]
        try:
            torch.manual_seed(0)
            metas = list(itertools.islice(
                op.sample_inputs("meta", self.dtype, requires_grad=False), len(samples)))
        except Exception:
            return none
        if len(metas) != len(samples):
            return none
        out = []
        for s, m in zip(samples, metas):
            a = self.leaves((s.input, s.args, s.kwargs))
            b = self.leaves((m.input, m.args, m.kwargs))
            pins = set()
            if len(a) == len(b):
                for i, (x, y) in enumerate(zip(a, b)):
                    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) \
                            and y.device.type == "cpu" and x.shape == y.shape:
                        pins.add(i)
            out.append(pins)
        return out

    def to_cpu(self, obj):
        torch = self.torch
        return self.tree_map(
            lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu"
            else x, obj)

    # -- comparison ----------------------------------------------------------------------
    def compare(self, dev, cpu, rtol, atol, values: bool, what: str, host=False) -> None:
        """``dev``: the device result with every tensor still where the op put it; ``host``:
        ``dev`` is a tensor expected on the CPU."""
        torch = self.torch
        if isinstance(cpu, torch.Tensor):
            if not isinstance(dev, torch.Tensor):
                raise AssertionError(f"{what}: expected a tensor, got {type(dev).__name__}")
            if not host and dev.device.type != self.dev.type:
                raise AssertionError(f"{what}: on {dev.device}, expected {self.dev.type}")
            if tuple(dev.shape) != tuple(cpu.shape):
                raise AssertionError(f"{what}: shape {tuple(dev.shape)} != {tuple(cpu.shape)}")
            if dev.dtype != cpu.dtype:
                raise AssertionError(f"{what}: dtype {dev.dtype} != {cpu.dtype}")
            if values:
                d = dev.detach().cpu() if dev.device.type != "cpu" else dev.detach()
                # A result of another dtype than the samples' (an integer op's float output)
                # is compared at least as loosely as that dtype's defaults.
                own = DTYPE_TOLERANCES.get(str(cpu.dtype).replace("torch.", ""))
                if own is not None:
                    rtol, atol = max(rtol, own[0]), max(atol, own[1])
                torch.testing.assert_close(d, cpu.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                           check_device=False, check_layout=False,
                                           msg=lambda m: f"{what}: {m}")
        elif isinstance(cpu, (list, tuple)):
            if not isinstance(dev, (list, tuple)) or len(dev) != len(cpu):
                raise AssertionError(f"{what}: expected a sequence of {len(cpu)}, got "
                                     f"{type(dev).__name__} {len(dev) if hasattr(dev, '__len__') else ''}")
            for i, (d, c) in enumerate(zip(dev, cpu)):
                self.compare(d, c, rtol, atol, values, f"{what}[{i}]", host)
        elif isinstance(cpu, dict):
            if not isinstance(dev, dict) or set(dev) != set(cpu):
                raise AssertionError(f"{what}: dict keys differ")
            for k in cpu:
                self.compare(dev[k], cpu[k], rtol, atol, values, f"{what}[{k!r}]", host)
        elif isinstance(cpu, float) and values:
            torch.testing.assert_close(dev, cpu, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"{what}: {m}")
        elif isinstance(cpu, (bool, int, complex, float)):
            if values and dev != cpu:
                raise AssertionError(f"{what}: {dev!r} != {cpu!r}")
        elif isinstance(cpu, torch.device):
            pass  # a device result names the device the op ran on
        else:
            if values and dev != cpu:
                raise AssertionError(f"{what}: {dev!r} != {cpu!r}")

    # -- one op ---------------------------------------------------------------------------
    def run_op(self, op, name, max_samples, emit, sample_timeout):
        import itertools
        import signal
        torch = self.torch
        random = name in RANDOM_OPS or bool(getattr(op, "has_nondeterministic_output", False))
        rtol, atol = _op_tolerances(op, self.dtype_name)
        res = {"op": name, "dtype": self.dtype_name, "random": random, "rtol": rtol, "atol": atol,
               "tried": 0,
               "cpu_skipped": 0, "status": "skipped", "reason": ""}

        def on_alarm(signum, frame):
            raise _Timeout(f"sample took more than {sample_timeout}s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            torch.manual_seed(0)
            try:
                samples = list(itertools.islice(
                    op.sample_inputs("cpu", self.dtype, requires_grad=False), max_samples))
            except Exception as e:
                res["status"] = "skipped"
                res["reason"] = "sample_inputs failed: " + _one_line(e)
                return res
            pinned = self.host_pinned(op, samples)
            if any(pinned):
                res["host_tensors"] = True
            for si, sample in enumerate(samples):
                emit({"event": "sample", "index": si, "sample": _describe_sample(sample)})
                signal.alarm(sample_timeout)
                try:
                    why = self.run_sample(op, sample, rtol, atol, random, pinned[si])
                except _Timeout as e:
                    why = "timeout: " + str(e)
                finally:
                    signal.alarm(0)
                if why == "cpu_error":
                    res["cpu_skipped"] += 1
                    continue
                res["tried"] += 1
                if why == "random":
                    res["random_samples"] = res.get("random_samples", 0) + 1
                    continue
                if why is not None:
                    res["status"] = "disagree"
                    res["reason"] = f"sample {si}: {why}"
                    res["sample"] = _describe_sample(sample)
                    return res
            res["status"] = "agree" if res["tried"] else "skipped"
            if not res["tried"]:
                res["reason"] = "no sample runs on CPU"
            return res
        finally:
            signal.signal(signal.SIGALRM, old)

    def run_sample(self, op, sample, rtol, atol, random, pinned=()):
        """None when the device agrees with CPU, 'random' when it agrees in structure, shapes
        and dtypes and the sample draws random numbers on CPU (values not compared),
        'cpu_error' when CPU itself raised, else the reason for the disagreement."""
        torch = self.torch
        args = (sample.input, sample.args, sample.kwargs)
        try:
            dev_args = self.to_device(args, pinned)
        except _Timeout:
            raise
        except Exception as e:
            dev_args = e
        cpu_args = args
        try:
            torch.manual_seed(1)
            rng = torch.get_rng_state()
            self.drew = False
            cpu_out = op(cpu_args[0], *cpu_args[1], **cpu_args[2])
            # A sample that draws from the default generator (dropout_p > 0, training=True, ...)
            # is random even when its op is not.
            draws = self.drew or not torch.equal(rng, torch.get_rng_state())
        except _Timeout:
            raise
        except Exception:
            return "cpu_error"
        if isinstance(dev_args, Exception):
            return "moving the inputs to the device raised " + _one_line(dev_args)
        try:
            torch.manual_seed(1)
            dev_out = op(dev_args[0], *dev_args[1], **dev_args[2])
            self.torch_spmd.sync()
            values = not (random or draws)
            # Outputs belong on the device unless nothing in the call named it (a factory
            # function called without device=, e.g. torch.arange(2), runs on the CPU).
            self.compare(dev_out, cpu_out, rtol, atol, values, "output", host=not self.moved)
            # Inputs after the call (in-place ops mutate them).
            for i, (d, c) in enumerate(zip(self.leaves(dev_args), self.leaves(cpu_args))):
                if isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor):
                    self.compare(d, c, rtol, atol, values, f"input leaf {i} after the call",
                                 host=i in pinned)
        except _Timeout as e:
            return "timeout: " + str(e)
        except AssertionError as e:
            return "mismatch: " + _one_line(e, 400)
        except Exception as e:
            return "device error: " + _one_line(e)
        return "random" if draws and not random else None


def _describe_sample(sample) -> str:
    import torch

    def d(x):
        if isinstance(x, torch.Tensor):
            dt = "" if x.dtype == torch.float32 else ":" + str(x.dtype).replace("torch.", "")
            lay = "" if x.layout == torch.strided else ":" + str(x.layout).replace("torch.", "")
            return f"T{tuple(x.shape)}{dt}{lay}"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in x.items()) + "}"
        r = repr(x)
        return r if len(r) < 40 else r[:37] + "..."

    s = f"input={d(sample.input)} args={d(tuple(sample.args))} kwargs={d(sample.kwargs)}"
    return s if len(s) < 300 else s[:297] + "..."


def worker_main(args) -> int:
    import faulthandler
    import warnings
    faulthandler.enable()  # a crash leaves its Python stack on stderr for the parent
    warnings.filterwarnings("ignore")
    out = sys.stdout
    # Anything else printing to stdout (torch, the extension) must not mix with the protocol.
    sys.stdout = sys.stderr

    def emit(obj):
        out.write("@@" + json.dumps(obj) + "\n")
        out.flush()

    ops = load_ops(args.ops, args.every, args.dtype)
    w = Worker(args.mode, not args.no_poison, args.dtype)
    emit({"event": "ready"})
    for idx, name, op in ops:
        if idx < args.start:
            continue
        emit({"event": "begin", "index": idx, "op": name})
        t0 = time.time()
        res = w.run_op(op, name, args.max_samples, emit, args.timeout)
        res["index"] = idx
        res["mode"] = args.mode
        res["dtype"] = args.dtype
        res["seconds"] = round(time.time() - t0, 3)
        emit({"event": "result", "result": res})
    emit({"event": "end"})
    return 0


# ------------------------------------------------------------------------------------------
# Parent side: drives workers, survives hangs and crashes.
# ------------------------------------------------------------------------------------------

class _Run:
    """One worker process for one mode and dtype, restarted past an op that hangs or crashes
    it."""

    def __init__(self, mode, dtype, opts, names):
        self.mode, self.dtype, self.opts, self.names = mode, dtype, opts, names
        self.key = run_key(mode, dtype)
        self.results = {}
        self.start = 0
        self.proc = None
        self.current = None  # (index, name) being run
        self.sample = None  # (index, description) of the sample being run
        self.last = time.time()
        self.buf = b""
        self.done = False
        self.restarts = 0
        self.errlog = None
        self.ready = False
        self._spawn()

    def _spawn(self):
        cmd = [sys.executable, os.path.abspath(__file__), "--_worker", "--mode", self.mode,
               "--dtype", self.dtype,
               "--max-samples", str(self.opts.max_samples), "--timeout", str(self.opts.timeout),
               "--start", str(self.start), "--every", str(self.opts.every)]
        if self.opts.ops:
            cmd += ["--ops", self.opts.ops]
        if self.opts.no_poison:
            cmd.append("--no-poison")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("SPMD_NUM_DEVICES", str(MESH_SIZE))
        if self.opts.threads:
            env["OMP_NUM_THREADS"] = str(self.opts.threads)
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.errlog, env=env,
                                     cwd=ROOT)
        self.buf = b""
        self.current = None
        self.ready = False
        self.last = time.time()

    def _stderr_tail(self, n=3):
        """The fatal-error line and innermost frames faulthandler printed, else the last lines."""
        try:
            self.errlog.seek(0)
            lines = [ln.strip() for ln in self.errlog.read().decode(errors="replace").splitlines()
                     if ln.strip()]
        except Exception:
            return ""
        for i, ln in enumerate(lines):
            if ln.startswith("Fatal Python error"):
                frames = [x for x in lines[i + 1:] if x.startswith("File ")][:n]
                return " | ".join([ln] + frames)[:500]
        return " | ".join(lines[-n:])[-400:]

    def _fail_current(self, status, reason):
        idx, name = self.current
        si, desc = self.sample if self.sample else (0, "")
        self.results[idx] = {"op": name, "index": idx, "mode": self.mode, "dtype": self.dtype,
                             "status": status,
                             "reason": f"sample {si}: {reason}", "sample": desc,
                             "tried": si + 1, "random": name in RANDOM_OPS,
                             "seconds": round(time.time() - self.op_t0, 3)}
        self.start = idx + 1
        self.restarts += 1
        self._spawn()

    def fileno(self):
        return self.proc.stdout.fileno()

    def on_readable(self):
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            self._on_exit()
            return
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.decode(errors="replace")
            if not line.startswith("@@"):
                continue
            msg = json.loads(line[2:])
            self.last = time.time()
            ev = msg["event"]
            if ev == "ready":
                self.ready = True
            elif ev == "begin":
                self.current = (msg["index"], msg["op"])
                self.op_t0 = time.time()
                self.sample = None
            elif ev == "sample":
                self.sample = (msg["index"], msg["sample"])
            elif ev == "result":
                r = msg["result"]
                self.results[r["index"]] = r
                self.current = None
                if self.opts.verbose:
                    _print_result(r)
            elif ev == "end":
                self.done = True

    def _on_exit(self):
        rc = self.proc.wait()
        if self.done:
            return
        if self.current is None:
            # Died outside an op (start-up): give up on this mode.
            self.done = True
            self.fatal = f"worker exited with {rc} before running an op: {self._stderr_tail(8)}"
            return
        self._fail_current("crash", f"process died (exit {rc}): {self._stderr_tail()}")

    def check_timeout(self):
        limit = self.opts.timeout + 30 if self.ready else 300
        if not self.done and time.time() - self.last > limit:
            self.proc.kill()
            self.proc.wait()
            if self.current is None:
                self.done = True
                self.fatal = "worker hung outside an op"
            else:
                self._fail_current("timeout", f"no progress for {limit}s (hang)")


def _print_result(r):
    if r["status"] == "agree":
        tag = "ok" + (" (random: shapes only)" if r.get("random") else
                      f" ({r['random_samples']} random sample(s): shapes only)"
                      if r.get("random_samples") else "")
    else:
        tag = f"{r['status'].upper()}: {r['reason']}"
    print(f"  [{r['mode']}] {r['op']}: {tag} ({r.get('seconds', 0):.2f}s)", flush=True)


def run_key(mode: str, dtype: str) -> str:
    """The sweep's key of one run: the mode for float32, else "mode/dtype"."""
    return mode if dtype == "float32" else f"{mode}/{dtype}"


def sweep(modes=MODES, ops=None, max_samples=3, timeout=60, every=1, no_poison=False,
          jobs=None, threads=None, verbose=False, dtypes=("float32",)):
    """Runs the sweep; returns {run_key(mode, dtype): summary dict} (see ``summarize``)."""
    opts = argparse.Namespace(ops=ops, max_samples=max_samples, timeout=timeout, every=every,
                              no_poison=no_poison, threads=threads, verbose=verbose)
    names = {d: {i: n for i, n, _ in load_ops(ops, every, d)} for d in dtypes}
    pending = [(m, d) for d in dtypes for m in modes]
    jobs = jobs or len(modes)
    active = []
    finished = {}
    t0 = {}
    while pending or active:
        while pending and len(active) < jobs:
            m, d = pending.pop(0)
            r = _Run(m, d, opts, names[d])
            t0[r.key] = time.time()
            r.fatal = None
            active.append(r)
        rl, _, _ = select.select(active, [], [], 1.0)
        for r in rl:
            r.on_readable()
        for r in list(active):
            r.check_timeout()
            if r.done:
                active.remove(r)
                finished[r.key] = summarize(r.mode, names[r.dtype], r.results,
                                            time.time() - t0[r.key], r.restarts, r.fatal,
                                            r.dtype)
    return finished


def summarize(mode, names, results, seconds, restarts=0, fatal=None, dtype="float32"):
    rs = [results[i] for i in sorted(results)]
    tried = [r for r in rs if r["status"] != "skipped"]
    agreed = [r for r in tried if r["status"] == "agree"]
    failed = [r for r in tried if r["status"] != "agree"]
    missing = [names[i] for i in sorted(names) if i not in results]
    pct = 100.0 * len(agreed) / len(tried) if tried else 0.0
    return {
        "mode": mode, "dtype": dtype, "ops": len(names), "tried": len(tried),
        "agreed": len(agreed),
        "percent": round(pct, 2), "random_shape_only": sum(1 for r in agreed if r.get("random")),
        "random_samples": sorted(r["op"] for r in agreed
                                 if r.get("random_samples") and not r.get("random")),
        "host_tensor_ops": sorted(r["op"] for r in rs if r.get("host_tensors")),
        "skipped": [{"op": r["op"], "reason": r["reason"]} for r in rs if r["status"] == "skipped"],
        "failures": [{"op": r["op"], "status": r["status"], "reason": r["reason"],
                      "sample": r.get("sample", "")} for r in failed],
        "not_run": missing, "seconds": round(seconds, 1), "worker_restarts": restarts,
        "fatal": fatal, "results": rs,
    }


def print_summary(s):
    print(f"== mode {s['mode']}, {s.get('dtype', 'float32')}: {s['agreed']}/{s['tried']} ops "
          f"agree ({s['percent']:.2f}%), "
          f"{s['random_shape_only']} of them random (shapes/dtypes only); "
          f"{len(s['random_samples'])} more with random samples (shapes/dtypes only there); "
          f"{len(s['skipped'])} skipped (no CPU-runnable sample); {s['seconds']}s; "
          f"{s['worker_restarts']} worker restart(s)")
    if s.get("fatal"):
        print(f"   FATAL: {s['fatal']}")
    if s["not_run"]:
        print(f"   not run: {len(s['not_run'])} ops")
    for f in s["failures"]:
        print(f"   FAIL {f['op']}: [{f['status']}] {f['reason']}"
              + (f" -- {f['sample']}" if f.get("sample") else ""))
    for f in s["skipped"]:
        print(f"   skip {f['op']}: {f['reason']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("unsharded", "sharded", "both"), default="both")
    p.add_argument("--dtype", default="float32",
                   help="the samples' dtype, or a comma-separated list, or 'all' "
                        f"({', '.join(DTYPES)}; default float32)")
    p.add_argument("--ops", default=None, help="regex (re.search) on OpInfo full names")
    p.add_argument("--every", type=int, default=1, help="only every k-th op (by op_db index)")
    p.add_argument("--max-samples", type=int, default=3, help="samples per op (default 3)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per sample (default 60)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--no-poison", action="store_true",
                   help="sharded mode: leave the padding of uneven shards as it is")
    p.add_argument("--jobs", type=int, default=None,
                   help="modes run in parallel (default: all of them)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the workers")
    p.add_argument("--min-percent", type=float, default=None,
                   help="exit 1 when a mode agrees on fewer ops than this")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per op as it finishes")
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:
        return worker_main(args)

    modes = MODES if args.mode == "both" else (args.mode,)
    dtypes = DTYPES if args.dtype == "all" else tuple(args.dtype.split(","))
    for d in dtypes:
        if d not in DTYPE_TOLERANCES:
            p.error(f"--dtype {d!r}: expected one of {', '.join(DTYPES)} or 'all'")
    t = time.time()
    res = sweep(modes, args.ops, args.max_samples, args.timeout, args.every, args.no_poison,
                args.jobs, args.threads, args.verbose, dtypes)
    wall = time.time() - t
    for key in res:
        print_summary(res[key])
    print(f"total wall time {wall:.1f}s")
    if args.json:
        import torch
        ext = [os.path.join(ROOT, "torch_spmd", n) for n in os.listdir(os.path.join(ROOT, "torch_spmd"))
               if n.startswith("_C") and n.endswith(".so")]
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__,
                       "extension": {os.path.basename(e): time.strftime(
                           "%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(e))) for e in ext},
                       "max_samples": args.max_samples,
                       "every": args.every, "ops_regex": args.ops, "poison": not args.no_poison,
                       "wall_seconds": round(wall, 1), "modes": res}, f, indent=1)
    if args.min_percent is not None and any(r["percent"] < args.min_percent for r in res.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
