"""PyTorch/XLA's ``torch_xla.core.xla_model`` (``xm``) for the spmd device."""
import sys

import torch

from .. import _C
from .._impl import step as _step
from .. import runtime
from .._impl.device import device as _device
from .._impl.device import is_spmd_tensor
from .._impl.barriers import optimization_barrier_  # noqa: F401  (the xm API)
from ..distributed.spmd.xla_sharded_tensor import XLAShardedTensor
from .._impl import process_world as _process_world
from ._replica_collectives import (  # noqa: F401  (the xm collectives API)
    REDUCE_AND, REDUCE_MAX, REDUCE_MIN, REDUCE_MUL, REDUCE_OR, REDUCE_SUM, all_gather,
    all_reduce, all_to_all, reduce_scatter, rendezvous)
from ._tree import map_tensors

def xla_device(n=None, devkind=None) -> torch.device:
    """The spmd device (one logical device in SPMD mode)."""
    return _device(0 if n is None else n)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Executes all pending operations as one graph, then runs the step closures."""
    _step.mark_step()


def add_step_closure(closure, args=(), run_async=False):
    """Runs ``closure(*args)`` after the current step's graph has executed."""
    _step.add_step_closure(closure, args)


def wait_device_ops(devices=()):
    """Execution is synchronous on the emulated devices: nothing to wait for."""


def get_memory_info(device=None) -> dict:
    """``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` of one emulated device.

    ``device`` is an emulated device index (default 0); a torch.device selects device 0.
    """
    index = 0
    if isinstance(device, int):
        index = device
    elif isinstance(device, str) and device.rsplit(":", 1)[-1].isdigit():
        index = int(device.rsplit(":", 1)[-1])
    info = _C._memory_info(index)
    return {k: info[k] for k in ("bytes_used", "bytes_limit", "peak_bytes_used")}


# ---------------------------------------------------------------------------------------------
# Replication helpers. In SPMD mode one process drives every device, so there is one replica:
# ordinal 0, world size 1, and the gradient all-reduce of optimizer_step has nothing to do. In
# multi-process mode (xmp.spawn) each process is one replica of the world.

def get_ordinal(defval: int = 0) -> int:
    """This replica's global ordinal (its process rank); 0 with a single replica."""
    world = _process_world.current()
    return world.rank if world is not None else 0


def get_local_ordinal(defval: int = 0) -> int:
    """This replica's ordinal among the replicas of its host; 0 with a single replica."""
    world = _process_world.current()
    return world.local_rank if world is not None else 0


def xrt_world_size(defval: int = 1) -> int:
    """Number of replicas: the processes of the world, 1 in SPMD mode (the devices sit behind
    one logical device)."""
    world = _process_world.current()
    return world.world_size if world is not None else 1


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this replica is the local (``local=True``) or global master (ordinal 0)."""
    return (get_local_ordinal() if local else get_ordinal()) == 0


def master_print(*args, fd=None, local: bool = False, flush: bool = False) -> None:
    """``print`` on the master replica only."""
    if is_master_ordinal(local=local):
        print(*args, file=fd if fd is not None else sys.stdout, flush=flush)


def xla_device_hw(device=None) -> str:
    """The hardware kind behind the device: the emulated ``'SPMD'`` devices (``'CPU'`` under
    ``PJRT_DEVICE=CPU``: ``runtime.device_type()``)."""
    return runtime.device_type()


def _fetch_gradients(optimizer) -> list:
    return [p.grad for group in optimizer.param_groups for p in group["params"]
            if p.grad is not None]


def reduce_gradients(optimizer, groups=None, pin_layout: bool = True) -> None:
    """Averages the gradients over the replicas: one coalesced all-reduce (sum, scaled by
    1 / world size, as PyTorch/XLA scales even when ``groups`` is given). A no-op with one
    replica: in SPMD mode the partitioner already inserts the reductions sharded gradients
    need."""
    count = xrt_world_size()
    if count > 1:
        gradients = _fetch_gradients(optimizer)
        if gradients:
            all_reduce(REDUCE_SUM, gradients, scale=1.0 / count, groups=groups,
                       pin_layout=pin_layout)


def optimizer_step(optimizer, barrier: bool = False, optimizer_args={}, groups=None,
                   pin_layout: bool = True):
    """Averages the gradients across replicas (``reduce_gradients``), runs
    ``optimizer.step(**optimizer_args)`` and, if ``barrier``, ``mark_step()``. Returns what
    ``step`` returned."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def _to_cpu(tensors: list) -> list:
    """Host copies of spmd tensors, computed by one sync of everything pending among them."""
    plain = [t.global_tensor if isinstance(t, XLAShardedTensor) else t for t in tensors]
    _C._sync_tensors([t.detach() for t in plain])
    out = []
    for t, p in zip(tensors, plain):
        host = p.detach().cpu()
        if isinstance(t, torch.nn.Parameter):
            host = torch.nn.Parameter(host, requires_grad=t.requires_grad)
        out.append(host)
    return out


def save(data, file_or_path, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with every spmd tensor (also inside dicts, lists, tuples)
    replaced by its CPU value, so the file loads without torch_spmd. Sharded tensors are
    gathered. Only the master replica writes, unless ``master_only=False``."""
    cpu_data = map_tensors(data, is_spmd_tensor, _to_cpu)
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(cpu_data, file_or_path)


def _upload_replicated(host: torch.Tensor) -> torch.Tensor:
    """``host`` uploaded whole to every device, with the sharding ``{replicated}``.

    As PyTorch/XLA's ``send_cpu_data_to_device`` without a sharding: it creates the device data
    replicated over the devices, and the tensor carries that data's ``{replicated}`` sharding
    (whereas ``t.to(device)`` leaves a tensor with none, ``""``). A new leaf, like the upload.
    """
    n = runtime.global_runtime_device_count()
    out = _C._upload_sharded(host.detach(), list(range(n)), [n], [], [[] for _ in host.shape])
    return out.requires_grad_() if host.requires_grad else out


def _send_to_device(datas, input_sharding):
    """Moves every CPU tensor in ``datas`` to the spmd device, laid out by ``input_sharding``
    (a ShardingSpec or None = replicated: ``{replicated}``) where its rank fits."""

    def select(v):
        return type(v) == torch.Tensor and v.device.type == "cpu"

    def convert(tensors):
        specs = [input_sharding if input_sharding is not None and input_sharding.can_apply(t)
                 else None for t in tensors]
        if input_sharding is not None and input_sharding.minibatch:
            # Batch dim 0 is split over the local devices, so it must divide evenly.
            count = runtime.addressable_runtime_device_count()
            for t, spec in zip(tensors, specs):
                if spec is not None and t.dim() > 0 and t.size()[0] % count != 0:
                    raise RuntimeError(
                        "When minibatch is configured, the per-host batch size must be divisible "
                        + "by local runtime device count. Per host input data shape " +
                        f"= {t.size()}, local_runtime_device_count = {count}")
        return [spec._upload(_whole_batch(t, spec)) if spec is not None else _upload_replicated(t)
                for t, spec in zip(tensors, specs)]

    def _whole_batch(t, spec):
        # Several processes (multi-process SPMD), each loading its part of the batch.
        if not spec.minibatch or runtime.process_count() == 1 or t.dim() == 0 or \
                _C._process_span() is None:
            return t
        from .._impl import process_span as _process_span
        return _process_span.global_batch_from_local(t, spec.xla_spec(t))

    return map_tensors(datas, select, convert)


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """Moves the CPU tensors in ``datas`` (a tensor, or dicts/lists/tuples of them) to the spmd
    device; a single tensor comes back as a one-element list, as in PyTorch/XLA.

    ``input_sharding``: None (replicated: the tensors report ``{replicated}``, as in PyTorch/XLA),
    a ``ShardingSpec`` (applied to every tensor whose rank matches, the others replicated;
    sharded tensors are uploaded shard by shard, never whole to every device), or a
    dict key -> ShardingSpec, in which case ``datas`` must be a dict (or a list of dicts) whose
    keys all have a spec: ValueError / KeyError otherwise. ``device`` is the spmd device (the
    only one there is).
    """
    if isinstance(input_sharding, dict):
        def send_dict(batch):
            missing = [k for k in batch if k not in input_sharding]
            if missing:
                raise KeyError(f"Keys: {missing} are missing from input_sharding.")
            return {k: _send_to_device(v, input_sharding[k]) for k, v in batch.items()}

        if isinstance(datas, dict):
            return send_dict(datas)
        if isinstance(datas, (list, tuple)) and datas and all(isinstance(b, dict) for b in datas):
            return [send_dict(b) for b in datas]
        raise ValueError("input batch should be a dict when input sharding is a dict.")
    if type(datas) is torch.Tensor:
        datas = [datas]
    return _send_to_device(datas, input_sharding)


# ---------------------------------------------------------------------------------------------
# Device listing, RNG and small helpers of PyTorch/XLA's xm (used by its scripts and tests).

def get_xla_supported_devices(devkind=None, max_devices=None) -> list:
    """The logical devices as strings: ``['spmd:0']`` (PyTorch/XLA's SPMD mode: ``['xla:0']``)."""
    devices = [str(_device(0))]
    return devices[:max_devices] if max_devices else devices


def xla_real_devices(devices=None) -> list:
    """The emulated physical device behind each logical device: ``['SPMD:0']``.

    (In SPMD mode the one logical device stands for all of them; see
    ``runtime.global_runtime_device_attributes()`` for the full list.)"""
    devices = devices or get_xla_supported_devices()
    for d in devices:
        if str(d) != str(_device(0)):
            raise ValueError(f"{d} is not a torch_spmd device (there is one: {_device(0)})")
    return [f"{runtime.device_type()}:0" for _ in devices]


def xla_replication_devices(local_devices=None) -> list:
    """The physical devices a replicated computation on ``local_devices`` spans: every
    emulated device of their kind, by ordinal (``['SPMD:0', ..., 'SPMD:7']``), as PyTorch/XLA
    lists all devices of the kind behind its logical device."""
    kind = xla_real_devices(local_devices)[0].partition(":")[0]
    return [f"{kind}:{i}" for i in range(runtime.global_runtime_device_count())]


def set_rng_state(seed: int, device=None) -> None:
    """Seeds device randomness. Random ops on the spmd device draw their seeds from torch's
    default generator when recorded, so this is ``torch.manual_seed(seed)``."""
    torch.manual_seed(int(seed))


def get_rng_state(device=None) -> int:
    """The seed last set (``torch.initial_seed()``). PyTorch/XLA returns its running seed, which
    advances as random ops run; torch_spmd's device randomness follows torch's default CPU
    generator instead, whose full state is ``torch.get_rng_state()``."""
    return torch.initial_seed()


class RateTracker(object):
    """Smoothed rate of a count over wall time (PyTorch/XLA's ``xm.RateTracker``)."""

    def __init__(self, smooth_factor=None):
        import os
        import time
        self._smooth_factor = (float(os.environ.get("RATE_TRACKER_SMOOTHING", 0.4))
                               if smooth_factor is None else smooth_factor)
        self._start_time = time.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate = None
        self._count = 0.0

    def _update(self, now, rate):
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = rate

    def add(self, count):
        self._count += count

    def _smooth(self, current_rate):
        if self._partial_rate is None:
            return current_rate
        return ((1 - self._smooth_factor) * current_rate +
                self._smooth_factor * self._partial_rate)

    def rate(self):
        import time
        now = time.time()
        delta = now - self._partial_time
        report_rate = 0.0
        if delta > 0:
            report_rate = self._smooth(self._count / delta)
            self._update(now, report_rate)
        return report_rate

    def global_rate(self):
        import time
        delta = time.time() - self._start_time
        count = self._partial_count + self._count
        return count / delta if delta > 0 else 0.0
