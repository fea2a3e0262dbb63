"""PyTorch/XLA's ``torch_xla.runtime`` (``xr``) for the emulated spmd device set.

In SPMD mode there is one process and one logical torch device (``torch_spmd.device()``);
behind it sit N emulated physical devices. As in PyTorch/XLA's SPMD mode, the *logical* counts
(``global_device_count``, ``world_size``, ...) are 1 and the ordinals 0, while the *runtime*
counts (``global_runtime_device_count``) are the number of emulated devices.

The device set is created on first use from ``SPMD_NUM_DEVICES`` (default 8) and
``SPMD_DEVICE_MEMORY`` (default ``16GiB``); ``configure_devices`` replaces it while no buffer is
live.

In multi-process mode (``torch_spmd.distributed.xla_multiprocessing.spawn``) each process is one
replica with one emulated device; the logical counts and ordinals then describe the world of
processes, while the runtime device counts stay those of this process's device set.
"""
import contextlib
import os
from typing import Iterator, Optional, Union

from . import _C
from ._impl import hardware as _hardware
from ._impl import world as world_state
from ._impl.device import configure_devices  # noqa: F401  (xr.configure_devices)

# The env var PyTorch/XLA keeps SPMD mode in: use_spmd() sets it and is_spmd() reads it, as
# upstream's do, so code that sets or clears it (upstream's tests do) sees the same state.
_XLA_USE_SPMD = "XLA_USE_SPMD"


def use_spmd(auto: Optional[bool] = False, hardware: Union[str, dict] = "tpu-v4") -> None:
    """Enables SPMD mode (records the flag; spmd tensors are always SPMD-partitioned here).

    ``auto=True`` is PyTorch/XLA's auto-sharding: from then on, the parameters of every step
    that the script left unannotated get layouts chosen by plan mode's cost model for
    ``hardware`` (a ``torch_spmd.plan`` preset name or dict; an addition of ours), once per
    graph (counter ``CompileWithAutoSharding``). The mesh is ``XLA_AUTO_SPMD_MESH``'s shape
    (``"4,2"``) over every device, or one axis over all of them. The layouts are the graph's
    dim classes' (each class over some mesh axes or none) that the cost model ranks best
    within the device memory; tensors the script marked keep their layouts. For a whole
    training step searched over mesh shapes, FSDP storage included, in plan mode, see
    ``torch_spmd.plan.auto_shard``.
    """
    if auto:
        _C._set_auto_sharding(True, _hardware.resolve(hardware))
    os.environ[_XLA_USE_SPMD] = "1"
    # A process a launcher started as one of several (torchrun, spawn_spmd) owns its slice of
    # the global devices, as a host of a multi-host pod does.
    from ._impl import process_span as _process_span
    if _process_span.launched_with_several_processes() and world_state.current() is None:
        _process_span.init()


def is_spmd() -> bool:
    """Whether SPMD mode is on: ``use_spmd()`` was called, or ``XLA_USE_SPMD`` is set (the
    flag lives in the environment, as PyTorch/XLA's)."""
    return os.environ.get(_XLA_USE_SPMD, "0") not in ("", "0")


def device_type() -> str:
    """The kind of the emulated devices, used in shard device names such as ``'SPMD:3'``.

    ``'CPU'`` when ``PJRT_DEVICE=CPU`` is set, as PyTorch/XLA's CPU runs set it (its test suite
    reads the variable back and branches on ``device_type() == 'CPU'``): the emulated devices
    are host memory and host cores, so that is what they are. Any other ``PJRT_DEVICE`` (a TPU,
    a GPU) is not what runs here and leaves ``'SPMD'``."""
    return "CPU" if os.environ.get("PJRT_DEVICE", "").upper() == "CPU" else "SPMD"


def global_runtime_device_count() -> int:
    """Number of emulated physical devices, across all processes of a multi-process SPMD
    world (``torch_spmd.distributed.init_spmd_processes``)."""
    return _C._global_num_devices()


def addressable_runtime_device_count() -> int:
    """Number of emulated physical devices this process owns (all of them with one process)."""
    return _C._num_devices()


def _span():
    """(process index, process count, local devices) in multi-process SPMD, else None."""
    return _C._process_span()


def _world():
    return world_state.current()


def global_device_count() -> int:
    """Logical torch devices across processes: 1 in SPMD mode, as in PyTorch/XLA; one per
    replica process in multi-process mode (xmp.spawn)."""
    world = _world()
    return world.world_size if world is not None else 1


def addressable_device_count() -> int:
    """Logical torch devices in this process: 1."""
    return 1


def world_size() -> int:
    """Number of participating replicas: 1 in SPMD mode (one SPMD program drives every
    device), the number of replica processes in multi-process mode."""
    world = _world()
    return world.world_size if world is not None else 1


def global_ordinal() -> int:
    """This replica's global ordinal: 0 in SPMD mode, the process rank in multi-process mode."""
    world = _world()
    return world.rank if world is not None else 0


def local_ordinal() -> int:
    """This replica's ordinal on its host: 0 in SPMD mode."""
    world = _world()
    return world.local_rank if world is not None else 0


def process_index() -> int:
    """Index of this process: 0 with a single process, the rank in multi-process mode (SPMD
    across processes, or one replica per process)."""
    span = _span()
    return span[0] if span is not None else global_ordinal()


def process_count() -> int:
    """Number of processes: 1, or the world size in multi-process mode."""
    span = _span()
    return span[1] if span is not None else world_size()


def runtime_device_attributes(device: Union[str, int]) -> dict:
    """Attributes of one emulated device: ``{'name': 'SPMD:i', 'ordinal': i, 'process': p}``
    (``process``: the index of the process that owns it, as a pod device's host)."""
    index = int(str(device).rsplit(":", 1)[-1])
    if not 0 <= index < global_runtime_device_count():
        raise ValueError(f"device {device} is not one of the {global_runtime_device_count()} "
                         "emulated devices")
    span = _span()
    process = index // span[2] if span is not None else 0
    return {"name": f"{device_type()}:{index}", "ordinal": index, "process": process}


def global_runtime_device_attributes() -> list:
    """Attributes of every emulated device, in ordinal order."""
    return [runtime_device_attributes(i) for i in range(global_runtime_device_count())]


def local_process_count() -> int:
    """Processes on this host: 1, or ``LOCAL_WORLD_SIZE`` in either multi-process mode."""
    world = _world()
    if world is not None:
        return world.local_world_size
    if _span() is not None:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return 1


def local_device_count() -> int:
    """Logical devices on this host (``local_process_count() * addressable_device_count()``)."""
    return local_process_count() * addressable_device_count()


def is_bf16_supported() -> bool:
    """bfloat16 tensors work on the spmd device."""
    return True


def get_master_ip() -> str:
    """There is one host: ``'127.0.0.1'`` (``MASTER_ADDR`` in multi-process mode if set)."""
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


_CACHE_PATH: Optional[str] = None


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Accepted for PyTorch/XLA compatibility: torch_spmd's compile cache lives in memory only
    (it is keyed by graph and sharding; nothing is written to ``path``), so a new process
    compiles again. Results are unaffected."""
    global _CACHE_PATH
    _CACHE_PATH = path


def set_defer_output_reductions(defer: bool) -> None:
    """Opt-in to let a step hand back pending partial sums (default False).

    By default torch_spmd follows GSPMD: every value a step (``mark_step``) returns is complete,
    a partial sum (a contraction or reduction over a sharded dim) is reduced inside the step,
    reduce-scattered when its sharding tiles the reduced axis, all-reduced otherwise, so a
    step's collectives and bytes are those the pod runs. With ``defer=True`` such an output
    stays a partial sum on the devices (listed in ``last_step_stats()['pending_reductions']``)
    and is reduced by the step that reads it, or when it is read on the host: gradient
    accumulation over several steps then communicates once. Results are the same either way;
    programs compiled under each setting are cached separately.
    """
    _C._set_defer_output_reductions(bool(defer))


def defers_output_reductions() -> bool:
    """Whether steps may hand back pending partial sums (``set_defer_output_reductions``)."""
    return _C._defer_output_reductions()


@contextlib.contextmanager
def defer_output_reductions(defer: bool = True) -> Iterator[None]:
    """``set_defer_output_reductions(defer)`` for the steps run inside the block, e.g.::

      with xr.defer_output_reductions():
          for micro in batches:           # gradients accumulate as partial sums
              loss_fn(model(micro)).backward()
              xm.mark_step()
      optimizer.step()                     # reduced once, where the update reads them
      xm.mark_step()
    """
    previous = defers_output_reductions()
    set_defer_output_reductions(defer)
    try:
        yield
    finally:
        set_defer_output_reductions(previous)


def set_collective_matmul(threshold_bytes: Optional[int] = 0,
                          min_step_extent: int = 128) -> None:
    """Collective matmul (XLA's windowed einsum, JAX's collective matmul, torchtitan's async
    tensor parallelism) for the steps that follow; ``None`` turns it off (the default).

    A matmul whose activation the partitioner would all-gather first, or whose partial result
    it would reduce-scatter after, runs instead as one partial matmul per member of the group,
    with the operand's (or the running sum's) chunks passed around the group's ring by
    collective-permutes in both directions, each transfer overlapping a partial product.
    Applies to ``mm``, ``bmm`` and ``matmul`` where that collective moves at least
    ``threshold_bytes`` per device (0: every one), the windowed dim splits evenly and each
    step keeps at least ``min_step_extent`` of it (thinner partial products waste a matrix
    unit), and the gathered operand is not a weight (a parameter, cast or transposed, waits for
    no compute: its gather is issued ahead instead). The values are the same up to the order of
    the partial sums; programs compiled under each setting are cached separately. Plan mode
    turns it on for the duration of a plan on presets whose runtime does it (TPUs: XLA's async
    collective fusion and windowed einsums), see ``torch_spmd.plan.Plan``.
    """
    if isinstance(min_step_extent, bool) or not isinstance(min_step_extent, int) or \
            min_step_extent < 1:
        raise ValueError(f"set_collective_matmul: min_step_extent must be an int >= 1, got "
                         f"{min_step_extent!r}")
    if threshold_bytes is None:
        _C._set_collective_matmul(-1, min_step_extent)
        return
    if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or \
            threshold_bytes < 0:
        raise ValueError(f"set_collective_matmul: threshold_bytes must be None (off) or an int "
                         f">= 0, got {threshold_bytes!r}")
    _C._set_collective_matmul(threshold_bytes, min_step_extent)


def collective_matmul_threshold() -> Optional[int]:
    """The bytes from which collective matmul applies (``set_collective_matmul``); None: off."""
    b = _C._collective_matmul()[0]
    return None if b < 0 else b


@contextlib.contextmanager
def collective_matmul(threshold_bytes: Optional[int] = 0,
                      min_step_extent: int = 128) -> Iterator[None]:
    """``set_collective_matmul(threshold_bytes, min_step_extent)`` for the steps run inside
    the block."""
    previous, previous_extent = _C._collective_matmul()
    set_collective_matmul(threshold_bytes, min_step_extent)
    try:
        yield
    finally:
        _C._set_collective_matmul(previous, previous_extent)


_CONTEXT_PARALLEL_METHODS = ("auto", "ring", "all_to_all", "gather")


def set_context_parallel(method: str = "auto") -> None:
    """How attention over a sharded sequence runs in the steps that follow (context
    parallelism). Where the query rows and the key/value sequence of
    ``F.scaled_dot_product_attention`` are sharded over the same mesh axes (shard the
    sequence dim of the activations; nothing else to call):

    - ``"ring"``: ring attention. Keys and values stay sharded; each device computes its
      queries against one key/value tile per step while the next tile arrives from its ring
      neighbour (a collective-permute per tile per step), merging the blocks with an online
      softmax; the backward passes the key/value gradients' running sums around the ring too.
      Causal attention masks by global positions.
    - ``"all_to_all"``: the sequence axes move onto the key/value heads by all-to-alls before
      the kernel and back after it (DeepSpeed's Ulysses), where the kv heads split evenly over
      them; the ring elsewhere.
    - ``"auto"`` (the default): the all-to-all where the heads split evenly and it moves fewer
      bytes per device than the ring, the ring otherwise.
    - ``"gather"``: neither; the keys and values are all-gathered (each device holds the whole
      sequence's).

    The values equal the unsharded attention's up to the order of its sums; programs compiled
    under each setting are cached separately. ``last_step_stats()`` lists the collectives.
    """
    if method not in _CONTEXT_PARALLEL_METHODS:
        raise ValueError(f"set_context_parallel: method must be one of "
                         f"{', '.join(map(repr, _CONTEXT_PARALLEL_METHODS))}, got {method!r}")
    _C._set_context_parallel(_CONTEXT_PARALLEL_METHODS.index(method))


def context_parallel_method() -> str:
    """The method ``set_context_parallel`` set."""
    return _CONTEXT_PARALLEL_METHODS[_C._context_parallel()]


@contextlib.contextmanager
def context_parallel(method: str = "ring") -> Iterator[None]:
    """``set_context_parallel(method)`` for the steps run inside the block."""
    previous = context_parallel_method()
    set_context_parallel(method)
    try:
        yield
    finally:
        set_context_parallel(previous)


def set_fused_memory(on: bool) -> None:
    """Whether the memory figures of the steps that follow (``last_step_stats()``, plans) are
    a compiling runtime's (XLA on TPUs, ``torch.compile``'s Inductor): a value with one reader,
    made by a pointwise op or read by one, is computed inside a fusion and never held in device
    memory (the fp32 cast of the logits before a log-softmax, a loss gradient's one-hot, a
    weight's cast before its matmul). Off (the default): every value a program makes is held,
    as eager PyTorch holds it. The program and its values are the same either way; plan mode
    turns it on for presets whose runtime compiles (TPUs), see ``torch_spmd.plan.Plan``."""
    if not isinstance(on, bool):
        raise ValueError(f"set_fused_memory: expected True or False, got {on!r}")
    _C._set_fused_memory(on)


def fused_memory() -> bool:
    """Whether memory figures are a compiling runtime's (``set_fused_memory``)."""
    return _C._fused_memory()
