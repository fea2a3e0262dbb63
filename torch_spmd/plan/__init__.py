"""Plan mode: a pod-sized training step analysed on one machine.

  >>> with torch_spmd.plan.Plan(num_devices=64, hardware="tpu-v4") as p:
  ...     with torch.device("spmd"):
  ...         model = GPT(cfg)                          # no memory is allocated
  ...     model = SpmdFullyShardedDataParallel(model, mesh=xs.get_1d_mesh("fsdp"))
  ...     opt = torch.optim.AdamW(model.parameters())
  ...     loss = model(idx).mean(); loss.backward(); opt.step()
  ...     xm.mark_step()                              # partitioned and analysed, not run
  ...     print(p.report())

Inside a plan, spmd tensors hold shape, dtype and sharding but no data: factories, uploads and
``to_empty`` allocate nothing, and ``mark_step`` records, propagates and partitions the step as
usual (the same compiler, the same cache) but executes nothing; its outputs become data-less
tensors in the layouts the program would produce. Reading values (``.cpu()``, ``.item()``,
``local_shards``) raises a RuntimeError naming the plan. ``p.report()`` describes the last
planned step: per-device peak and resident bytes, FLOPs, every collective with its bytes, the
predicted step time (and where it goes) and MFU on ``hardware`` (see
``torch_spmd.plan.hardware``), and the assumptions behind them. See docs/plan_mode.md.
"""
import contextlib
from typing import Iterator, Optional, Sequence, Union

from .. import _C
from .. import runtime as xr
from .hardware import PRESETS, measure_host, resolve  # noqa: F401
from .report import ASSUMPTIONS, PlanReport, build_report  # noqa: F401

__all__ = ["Plan", "PlanReport", "PRESETS", "resolve", "measure_host", "report_last_step",
           "as_runtime"]

_ACTIVE = []  # the plans entered, innermost last (plans do not nest: at most one)


def _active_hardware():
    """The active plan's hardware, or None outside a plan."""
    return _ACTIVE[-1].hardware if _ACTIVE else None


def _collective_matmul_bytes(setting, hardware: dict) -> Optional[int]:
    """Plan's ``collective_matmul`` as set_collective_matmul's threshold (None: off)."""
    if setting is None:
        return hardware.get("collective_matmul_bytes")
    if setting is True:
        return 0
    if setting is False:
        return None
    if isinstance(setting, int) and setting >= 0:
        return setting
    raise ValueError(f"collective_matmul must be None, True, False or a threshold in bytes "
                     f"(an int >= 0), got {setting!r}")


class Plan:
    """Context manager for plan mode (see the module docstring).

    Args:
        num_devices: devices of the planned pod (default: the current device count,
            ``SPMD_NUM_DEVICES``). The emulated device set is resized for the plan and restored
            after it, which needs no live device buffers when the count changes.
        hardware: a preset name (``'tpu-v4'``, ``'tpu-v5e'``, ``'tpu-v5p'``, ``'tpu-v6e'``,
            ``'a100-40gb'``, ``'a100-80gb'``, ``'h100-80gb'``, ``'h100-96gb'``, ``'h200'``,
            ``'host'``) or a dict of numbers (``torch_spmd.plan.hardware``).
        mesh_shape: if given, a mesh of that shape over all devices becomes the global mesh
            (``xs.get_global_mesh()``), with ``axis_names`` if given.
        collective_matmul: whether the planned runtime overlaps tensor-parallel collectives
            with their matmuls (``torch_spmd.runtime.set_collective_matmul``): None (default)
            as the hardware's ``collective_matmul_bytes`` says (TPU presets: on, GPU presets:
            off), True (every one), False (off) or a threshold in bytes. Set for the steps
            planned inside the plan; the session's setting is restored after it.
        fused_memory: whether the planned runtime fuses elementwise ops, so that the values
            they make and read once are never held (``torch_spmd.runtime.set_fused_memory``):
            None (default) as the hardware's ``fused_memory`` says (TPU presets: XLA, on; GPU
            presets: eager PyTorch, off; pass True for torch.compile), True or False.
    """

    def __init__(self, num_devices: Optional[int] = None, hardware: Union[str, dict] = "tpu-v4",
                 mesh_shape: Optional[Sequence[int]] = None,
                 axis_names: Optional[Sequence[str]] = None,
                 collective_matmul: Union[None, bool, int] = None,
                 fused_memory: Optional[bool] = None):
        if num_devices is not None and (isinstance(num_devices, bool) or
                                        not isinstance(num_devices, int) or num_devices < 1):
            raise ValueError(f"num_devices must be a positive int, got {num_devices!r}")
        self.num_devices = num_devices
        self.hardware = resolve(hardware)
        self.mesh_shape = tuple(mesh_shape) if mesh_shape is not None else None
        self.axis_names = tuple(axis_names) if axis_names is not None else None
        self.mesh = None
        self._restore = None
        self._previous_mesh = None
        self.collective_matmul = _collective_matmul_bytes(collective_matmul, self.hardware)
        self._previous_collective_matmul = None
        if fused_memory is not None and not isinstance(fused_memory, bool):
            raise ValueError(f"fused_memory must be None, True or False, got {fused_memory!r}")
        self.fused_memory = bool(self.hardware.get("fused_memory", False)) \
            if fused_memory is None else fused_memory
        self._previous_fused_memory = None

    def __repr__(self) -> str:
        n = self.num_devices if self.num_devices is not None else "current"
        return f"torch_spmd.plan.Plan(num_devices={n}, hardware={self.hardware['name']!r})"

    def __enter__(self) -> "Plan":
        if _C._planning():
            raise RuntimeError(f"{self!r}: plans do not nest (another plan is active)")
        current = xr.global_runtime_device_count()
        n = self.num_devices if self.num_devices is not None else current
        limit = _C._memory_info(0)["bytes_limit"]
        capacity = int(self.hardware["hbm_bytes"])
        # Only the device count matters to a plan (nothing is allocated; the report checks the
        # hardware's capacity itself), so the device set is rebuilt only when it changes.
        if n != current:
            try:
                xr.configure_devices(n, capacity)
            except RuntimeError as e:
                raise RuntimeError(
                    f"{self!r} needs {n} devices of {capacity} bytes, but the device set "
                    f"({current} devices) cannot be reconfigured while device buffers are live: "
                    f"{e}. Enter the plan before creating real spmd tensors, or plan with "
                    f"num_devices={current}.") from None
            self._restore = (current, limit)
        self.num_devices = n
        self._previous_collective_matmul = _C._collective_matmul()
        xr.set_collective_matmul(self.collective_matmul, self._previous_collective_matmul[1])
        self._previous_fused_memory = xr.fused_memory()
        xr.set_fused_memory(self.fused_memory)
        _C._set_planning(True, repr(self))
        _ACTIVE.append(self)
        if self.mesh_shape is not None:
            import numpy as np
            from ..distributed.spmd import mesh as mesh_mod
            self._previous_mesh = mesh_mod.get_global_mesh()
            self.mesh = mesh_mod.Mesh(np.arange(n), self.mesh_shape, self.axis_names)
            mesh_mod.set_global_mesh(self.mesh)
        return self

    def __exit__(self, *exc) -> None:
        _C._set_planning(False, "")
        if self._previous_collective_matmul is not None:
            _C._set_collective_matmul(*self._previous_collective_matmul)
        if self._previous_fused_memory is not None:
            xr.set_fused_memory(self._previous_fused_memory)
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self.mesh is not None:
            from ..distributed.spmd import mesh as mesh_mod
            mesh_mod.set_global_mesh(self._previous_mesh)
        if self._restore is not None:
            n, limit = self._restore
            self._restore = None
            try:
                xr.configure_devices(n, limit)
            except RuntimeError:
                # Real buffers were made inside the plan (not through the recorder); the
                # plan's device set stays until they are freed.
                pass

    def report(self) -> PlanReport:
        """The last planned step's report (per-device memory, FLOPs, collectives, predicted
        step time and MFU on this plan's hardware)."""
        return build_report(self.num_devices or xr.global_runtime_device_count(), self.hardware)


@contextlib.contextmanager
def as_runtime(hardware: Union[str, dict], collective_matmul: Union[None, bool, int] = None,
               fused_memory: Optional[bool] = None) -> Iterator[None]:
    """Executes the steps inside the block as the runtime of ``hardware`` compiles them, with
    the partitioning and memory options a plan on it uses (collective matmul and fused memory:
    ``Plan``'s arguments of those names), so that a step executed here and one planned on
    ``hardware`` are the same program (``report_last_step(hardware)`` then prices what the plan
    predicts). The session's settings are restored after the block."""
    hw = resolve(hardware)
    if fused_memory is not None and not isinstance(fused_memory, bool):
        raise ValueError(f"fused_memory must be None, True or False, got {fused_memory!r}")
    previous_cm, previous_fused = _C._collective_matmul(), xr.fused_memory()
    xr.set_collective_matmul(_collective_matmul_bytes(collective_matmul, hw), previous_cm[1])
    xr.set_fused_memory(bool(hw.get("fused_memory", False)) if fused_memory is None
                        else fused_memory)
    try:
        yield
    finally:
        _C._set_collective_matmul(*previous_cm)
        xr.set_fused_memory(previous_fused)


def report_last_step(hardware: Union[str, dict] = "host") -> PlanReport:
    """The same report for the last *executed* step, on ``hardware`` (outside any plan)."""
    return build_report(xr.global_runtime_device_count(), resolve(hardware), planned=False)


from .auto_shard import AutoShardResult, Layout, auto_shard, plan_layouts  # noqa: E402,F401

__all__ += ["auto_shard", "plan_layouts", "AutoShardResult", "Layout"]
