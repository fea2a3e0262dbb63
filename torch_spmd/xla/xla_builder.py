"""``torch_xla.core.xla_builder`` under ``torch_spmd.xla.install()``: the two functions that
read a lowered computation back as text (PyTorch/XLA's tests read ``LoweringContext``'s
computation this way). The rest of PyTorch/XLA's module builds XLA HLO op by op, which
torch_spmd has no use for: those names raise AttributeError saying so.
"""


class Computation:
    """A lowered computation (``_XLAC.lowering.LoweringContext.hlo()``) and its name."""

    def __init__(self, name: str, text: str):
        self.name, self.text = name, text


def computation_from_module_proto(name: str, proto) -> Computation:
    """The computation ``LoweringContext.hlo()`` serialized (torch_spmd's graph text)."""
    if not isinstance(proto, (bytes, bytearray)):
        raise TypeError(f"computation_from_module_proto: proto is a {type(proto).__name__}; "
                        "expected the bytes LoweringContext.hlo() returns")
    return Computation(name, bytes(proto).decode())


def get_computation_hlo(computation: Computation) -> str:
    """The computation's text."""
    if not isinstance(computation, Computation):
        raise TypeError(f"get_computation_hlo: expected a computation from "
                        f"computation_from_module_proto, got a {type(computation).__name__}")
    return computation.text


def __getattr__(name: str):
    raise AttributeError(
        f"torch_xla.core.xla_builder.{name}: torch_spmd does not build XLA HLO op by op; "
        "only computation_from_module_proto and get_computation_hlo (reading back a "
        "LoweringContext's computation) are implemented (see docs/xla_compat.md)")
