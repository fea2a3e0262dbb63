"""``torch_xla._XLAC`` under ``torch_spmd.xla.install()``: the few functions of PyTorch/XLA's C++
module that have an honest meaning on torch_spmd.

Only what torch_spmd can answer truthfully is here. Functions whose result is XLA's own
artifacts (``OpSharding``, ``_xla_mark_sharding`` with an OpSharding, the ``_xla_spmd_*``
collectives) are deliberately missing, so code calling them fails with an AttributeError
instead of getting a fake answer. ``_get_xla_tensors_hlo`` answers with torch_spmd's own
program text (no XLA instruction names), its shardings written as XLA's ``sharding={...}``
attribute: code checking which sharding a value carries works, code matching XLA's
instructions does not. ``_get_xla_tensor_debug_info`` lays out what torch_spmd knows of a
tensor in PyTorch/XLA's fields (device, shape, sharding, the node or the data behind it).
``lowering.LoweringContext`` names the device data a pending graph reads, without running it.
"""
import re
import types
from typing import Dict, List, Optional, Sequence

import torch

from torch_spmd import _C
from torch_spmd._impl import device as _device
from torch_spmd import debug as _debug
from torch_spmd import runtime as _xr
from torch_spmd.core import xla_model as _xm
from torch_spmd.distributed.spmd._sharding_type import sharding_type_of_spec
from torch_spmd.distributed.spmd.xla_sharded_tensor import XLAShardedTensor


def _plain(t):
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def _get_xla_sharding_spec(t: torch.Tensor) -> str:
    """The sharding of ``t`` in XLA text form (``{devices=[4,2]0,1,...}``), ``""`` if none."""
    return _C._get_sharding_spec(_plain(t))


def _get_xla_sharding_specs(tensors: Sequence[torch.Tensor]) -> List[str]:
    """``_get_xla_sharding_spec`` of each tensor."""
    return list(_C._get_sharding_specs([_plain(t) for t in tensors]))


def _get_xla_sharding_type(t: torch.Tensor) -> Optional[int]:
    """The ``ShardingType`` value of ``t``'s sharding, None if it has none."""
    kind = sharding_type_of_spec(_get_xla_sharding_spec(t))
    return None if kind is None else int(kind)


def _get_xla_tensors_text(tensors: Sequence[torch.Tensor]) -> str:
    """The pending IR of the tensors in torch_spmd's text form (not PyTorch/XLA's IR text)."""
    return _debug.graph_text([_plain(t) for t in tensors])


_SHARDING_AT_END = re.compile(r" (\{[^{}]*\})$", re.MULTILINE)


def _get_xla_tensors_hlo(tensors: Sequence[torch.Tensor]) -> str:
    """The pending IR of the tensors in torch_spmd's text form (not HLO), each value's sharding
    written as XLA writes an instruction's: ``, sharding={devices=[1,8]0,1,...}``."""
    return _SHARDING_AT_END.sub(r", sharding=\1", _get_xla_tensors_text(tensors))


def _get_xla_tensor_debug_info(t: torch.Tensor) -> str:
    """PyTorch/XLA's per-tensor debug text, with torch_spmd's facts: the device, the global
    shape, the sharding (``None`` when it has none: an unannotated upload), then one of: the
    pending op that computes it (``IR:``); its data on the devices (``IR: xla::device_data()``,
    ``XLAShardedData`` / ``XLAData`` with its layout and the number of device shards); or, for
    a tensor moved to the device and not used or annotated yet, ``Tensor on host: with size
    [...]`` (held on the host, as PyTorch/XLA's SPMD virtual device holds it)."""
    t = _plain(t)
    lines = _get_xla_tensors_text([t]).splitlines()
    output = lines[-1].split(": ", 1)[1].split(",")[0].strip()
    node = next(line for line in lines if line.startswith(output + " = "))
    shape = _SHARDING_AT_END.sub("", node.rsplit(" : ", 1)[1])
    spec = _C._get_sharding_spec(t) or None
    device = f"SPMD:{_device.device().index or 0}"
    info = ["XLATensor {", f"Device: {device}", f"XLA Shape: {shape}", f"ShardingSpec: {spec}"]
    on_host = "None"
    if _C._held_on_host(t):
        info += ["IR: None", "XLAData: None"]
        on_host = "with size [" + ", ".join(str(d) for d in t.shape) + "]"
    elif "= spmd::device_data()" in node:
        kind = "XLAShardedData" if spec else "XLAData"
        info += ["IR: xla::device_data()", f"{kind}: ", f"  Data Device: {device}",
                 f"  Data Shape: {shape}", f"  OpSharding: {spec or '{replicated}'}",
                 f"  NumShards: {_xr.global_runtime_device_count()}"]
    else:
        info += [f"IR: {node.split(' = ', 1)[1]}", "XLAData: None"]
    info += [f"Tensor on host: {on_host}", "}"]
    return "\n".join(info) + "\n"


def _xla_sync_multi(tensors: Sequence[torch.Tensor], devices=(), wait: bool = True,
                    sync_xla_data: bool = True) -> None:
    """Computes the pending values of ``tensors`` (one graph), leaving other work pending."""
    _C._sync_tensors([_plain(t).detach() for t in tensors])


def _get_graph_hash(tensors: Sequence[torch.Tensor]) -> int:
    """The key of the graph computing ``tensors`` (equal keys: the same program), with
    auto-sharding's part: it changes when ``use_spmd(auto=True)`` or ``XLA_AUTO_SPMD_MESH``
    does, as PyTorch/XLA's."""
    return _C._get_graph_hash([_plain(t) for t in tensors])


def _xla_get_auto_sharding() -> bool:
    """Whether ``use_spmd(auto=True)`` is on."""
    return _C._auto_sharding()


def _xla_set_auto_sharding() -> None:
    """Turns auto-sharding on (``use_spmd(auto=True)`` with the default hardware)."""
    _xr.use_spmd(auto=True)


def _xla_step_marker(device: str = "", devices=(), wait: bool = True,
                     reset_scope: bool = True) -> None:
    """Runs everything pending as one graph (``torch_xla.sync`` without the step closures)."""
    _C._mark_step()


def _xla_get_default_device() -> str:
    return str(_device.device())


def _xla_real_devices(devices=None) -> List[str]:
    return [a["name"] for a in _xr.global_runtime_device_attributes()]


def _xla_get_all_devices() -> List[str]:
    return _xla_real_devices()


def _xla_num_devices() -> int:
    return _xr.global_runtime_device_count()


def _xla_metrics_report() -> str:
    return _C._metrics_report()


def _xla_counter_value(name: str):
    return _C._counter_value(name)


def _xla_get_replication_devices_count() -> int:
    """Replicas of the (multi-process) world; 0 when not replicated, as upstream."""
    count = _xm.xrt_world_size()
    return count if count > 1 else 0


_coordinator = {}


def _ensure_xla_coordinator_initialized(global_rank: int, world_size: int, master_addr: str,
                                        master_port: Optional[int] = None) -> None:
    """PyTorch/XLA starts its runtime's distributed coordinator here (multi-host TPU pods).
    torch_spmd's devices live in this process and its cross-process work goes over
    torch.distributed, so there is nothing to start: the arguments are checked and kept
    (``_is_xla_coordinator_initialized``)."""
    for name, value in (("global_rank", global_rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"_ensure_xla_coordinator_initialized: {name} must be an int >= 0, "
                             f"got {value!r}")
    if global_rank >= world_size:
        raise ValueError(f"_ensure_xla_coordinator_initialized: global_rank {global_rank} is "
                         f"not below world_size {world_size}")
    _coordinator.setdefault("args", (global_rank, world_size, master_addr, master_port))


def _is_xla_coordinator_initialized() -> bool:
    return "args" in _coordinator


def _activate_preemption_sync_manager() -> None:
    """SIGTERM becomes a preemption notice (torch_spmd.distributed.preemption)."""
    from ..distributed import preemption
    preemption.activate()


def _deactivate_preemption_sync_manager() -> None:
    from ..distributed import preemption
    preemption.deactivate()


def _sync_point_reached(step: int) -> bool:
    from ..distributed import preemption
    return preemption.sync_point_reached(step)


def _spmd_full_to_shard_shape(t: torch.Tensor) -> torch.Tensor:
    """Each device's shard of the sharded ``t`` as a ``{manual}`` tensor of the shard shape."""
    return _C._spmd_full_to_shard_shape(_plain(t))


def _sharding_args_from_text(text: str, rank: int) -> tuple:
    """``_C`` sharding arguments (device ids, mesh shape, axis names, dim axes) of an XLA text
    sharding of a rank-``rank`` tensor: ``{devices=[a,b(,r)]ids... (last_tile_dim_replicate)}``
    gives a mesh shaped like the tile assignment, tensor dim d tiled by mesh axis d;
    ``{replicated}`` (what a one-device mesh gives every spec) tiles no dim."""
    if text.strip() == "{replicated}":
        n = _xr.global_runtime_device_count()
        return list(range(n)), [n], [], [[] for _ in range(rank)]
    m = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}", text.strip())
    if not m:
        raise ValueError(f"expected a tiled sharding like '{{devices=[1,8]0,...,7}}', got {text!r}")
    dims = [int(d) for d in m.group(1).split(",")]
    ids = [int(d) for d in m.group(2).split(",")]
    tensor_dims = len(dims) - (1 if m.group(3) else 0)
    return ids, dims, [], [[d] for d in range(tensor_dims)]


def _global_tensor_from_cpu_shards(shards: Sequence[torch.Tensor], sharding: str,
                                   global_shape=None) -> torch.Tensor:
    """A tensor laid out as ``sharding`` (XLA text form, what ``Mesh.get_op_sharding`` returns
    here) from each device's host shard, ``shards[d]`` for device d, as PyTorch/XLA's. Shards
    are padded tiles: every shard has the tile shape ceil(global / tiles) per dim, and
    ``global_shape`` (default: the tiles' total, no padding) must give exactly that shape.
    RuntimeError otherwise, naming the mismatch."""
    from torch_spmd.distributed.checkpoint import _layout
    n = _xr.global_runtime_device_count()
    if len(shards) != n:
        raise RuntimeError(f"_global_tensor_from_cpu_shards: {len(shards)} shards given, one "
                           f"per device expected ({n})")
    shard_shape = tuple(shards[0].shape)
    if any(tuple(s.shape) != shard_shape for s in shards):
        raise RuntimeError("_global_tensor_from_cpu_shards: the shards' shapes differ: "
                           f"{sorted({tuple(s.shape) for s in shards})}")
    rank = len(shard_shape)
    text = sharding.strip()
    tiles = [1] * rank if text == "{replicated}" else \
        list(_C._parse_sharding_spec(text)["dims"])[:rank]
    if len(tiles) != rank:
        raise RuntimeError(f"_global_tensor_from_cpu_shards: sharding {text} does not fit "
                           f"shards of rank {rank}")
    shape = (tuple(s * t for s, t in zip(shard_shape, tiles)) if global_shape is None
             else tuple(int(d) for d in global_shape))
    padded = tuple(-(-d // t) for d, t in zip(shape, tiles))
    if len(shape) != rank or padded != shard_shape:
        raise RuntimeError(f"_global_tensor_from_cpu_shards: a global shape {list(shape)} laid "
                           f"out as {text} has shards of shape {list(padded)}, the shards "
                           f"given are {list(shard_shape)}")
    host = torch.empty(shape, dtype=shards[0].dtype)
    if text == "{replicated}":
        host.copy_(shards[0])
    else:
        for s in _layout.device_shards(text, shape):
            (offsets, lengths) = s.box
            into = tuple(slice(o, o + k) for o, k in zip(offsets, lengths))
            host[into] = shards[s.device][tuple(slice(0, k) for k in lengths)]
    t = host.to(_device.device())
    _C._mark_sharding(t, *_sharding_args_from_text(text, rank))
    return t


def _spmd_shard_to_full_shape(t: torch.Tensor, sharding: str, full_shape, dtype=None) -> torch.Tensor:
    """The ``{manual}`` tensors ``t`` as the shards of a ``full_shape`` tensor laid out as
    ``sharding`` (XLA text form, what ``Mesh.get_op_sharding`` returns here)."""
    return _C._spmd_shard_to_full_shape(_plain(t), *_sharding_args_from_text(sharding, len(full_shape)),
                                        [int(d) for d in full_shape])


class LoweringContext:
    """``_XLAC.lowering.LoweringContext``: lowers the pending work of some tensors into one
    computation without running it, and tells which device data that computation reads (its
    parameters).

    Here the computation is torch_spmd's graph of those tensors: its text stands where XLA gives
    HLO (``hlo_text``, ``hlo``; the same text as ``_XLAC._get_xla_tensors_hlo``, each value's
    sharding written as XLA's ``sharding={...}`` attribute, XLA's instruction names absent), and
    its parameters are the device data the graph reads, in the graph's order, handed back as
    tensors on the device that share that data (nothing is copied or transferred).
    """

    def __init__(self, name: str = "LoweringContext"):
        self._name = name
        self._text = None
        self._params: List[torch.Tensor] = []

    def set_name_string(self, name: str) -> None:
        self._name = name

    def get_name_string(self) -> str:
        return self._name

    def build(self, tensors: Sequence[torch.Tensor]) -> None:
        """Lowers the pending work that computes ``tensors`` (nothing runs)."""
        tensors = [_plain(t) for t in tensors]
        bad = [i for i, t in enumerate(tensors)
               if not isinstance(t, torch.Tensor) or t.device.type != "spmd"]
        if bad:
            raise ValueError(f"LoweringContext.build: tensors[{bad[0]}] is "
                             f"{_describe_value(tensors[bad[0]])}; expected tensors on the spmd device")
        self._text = _get_xla_tensors_hlo(tensors)
        self._params = _C._pending_graph_parameters(tensors)

    def _built(self, what: str) -> None:
        if self._text is None:
            raise RuntimeError(f"LoweringContext.{what}: call build(tensors) first")

    def hlo_text(self) -> str:
        """The computation's text (torch_spmd's graph, see the class docstring)."""
        self._built("hlo_text")
        return f"HloModule {self._name}\n\n{self._text}"

    def hlo(self) -> bytes:
        """What XLA serializes as an HloModuleProto: here the same text, encoded."""
        return self.hlo_text().encode()

    def device_parameter_id_tensor_mapping(self) -> Dict[int, torch.Tensor]:
        """Parameter number -> a tensor on the device holding that parameter's data."""
        self._built("device_parameter_id_tensor_mapping")
        return dict(enumerate(self._params))

    def parameter_id_tensor_mapping(self) -> Dict[int, torch.Tensor]:
        """Parameter number -> the parameter's value on the host (a transfer, as XLA's)."""
        self._built("parameter_id_tensor_mapping")
        return {i: t.cpu() for i, t in enumerate(self._params)}

    def tensor_parameter_id(self, tensor: torch.Tensor) -> int:
        """The parameter number of the data ``tensor`` holds, -1 if the computation does not
        read it (or ``tensor`` is pending: its value is computed, not a parameter)."""
        self._built("tensor_parameter_id")
        return _C._pending_graph_parameter_index(self._params, _plain(tensor))


def _describe_value(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor on {x.device}"
    return f"a {type(x).__name__}"


# PyTorch/XLA's submodule _XLAC.lowering
lowering = types.SimpleNamespace(LoweringContext=LoweringContext)
