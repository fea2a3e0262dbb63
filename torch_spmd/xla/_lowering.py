"""``torch_xla._XLAC.lowering``: PyTorch/XLA's ``LoweringContext``, which lowers the pending
work of some tensors into one computation without running it, and tells which device data
that computation reads (its parameters).

Here the computation is torch_spmd's graph of those tensors: its text stands where XLA gives
HLO (``hlo_text``, ``hlo``; the same text as ``_XLAC._get_xla_tensors_hlo``, each value's
sharding written as XLA's ``sharding={...}`` attribute, XLA's instruction names absent), and
its parameters are the device data the graph reads, in the graph's order, handed back as
tensors on the device that share that data (nothing is copied or transferred).
"""
from typing import Dict, List, Sequence

import torch

from torch_spmd import _C


class LoweringContext:
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
        from . import _XLAC
        tensors = [_XLAC._plain(t) for t in tensors]
        bad = [i for i, t in enumerate(tensors)
               if not isinstance(t, torch.Tensor) or t.device.type != "spmd"]
        if bad:
            raise ValueError(f"LoweringContext.build: tensors[{bad[0]}] is "
                             f"{_describe(tensors[bad[0]])}; expected tensors on the spmd device")
        self._text = _XLAC._get_xla_tensors_hlo(tensors)
        self._params = _C._pending_graph_parameters(tensors)

    def _built(self, what: str) -> None:
        if self._text is None:
            raise RuntimeError(f"LoweringContext.{what}: call build(tensors) first")

    def hlo_text(self) -> str:
        """The computation's text (torch_spmd's graph, see the module's docstring)."""
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
        from . import _XLAC
        return _C._pending_graph_parameter_index(self._params, _XLAC._plain(tensor))


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor on {x.device}"
    return f"a {type(x).__name__}"
