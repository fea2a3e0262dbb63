"""torch.compile of programs on spmd tensors: fake tensors, the ``openxla`` and ``spmd`` dynamo
backends, and ``torch.ops.xla.dynamo_mark_sharding``.

- **Fake tensors.** Dynamo traces with fake tensors made from the real ones
  (``torch._subclasses.meta_utils``). spmd tensors are functionalization wrappers (like xla and
  lazy tensors), which meta_utils unwraps to fakify, except for the ``xla`` and ``lazy`` device
  types, which it fakifies from their metadata as plain device tensors. Unwrapped, an spmd
  tensor's fake came out a non-leaf where the real one is a leaf (an AssertionError inside
  dynamo). spmd tensors are fakified as xla's are: the describer sees them as not functional.
- **Backends.** ``openxla`` (PyTorch/XLA's name) runs the captured FX graph on the device and
  runs its outputs at once (one program per call, as PyTorch/XLA's backend executes the graph
  it compiled); ``spmd`` runs it lazily, so the call joins the step's one program (what a
  training step wants: forward and backward partitioned together). Both run the graph with
  autograd, so a backward works as in eager. Graph breaks run as ordinary lazy code.
  Recompiles follow dynamo's guards; programs are the compile cache's (an unchanged graph with
  the same input layouts is a cache hit). Left out: replaying a recorded program without
  running the FX graph's ops through the dispatcher again.
- **dynamo_mark_sharding.** ``torch.ops.xla.dynamo_mark_sharding(t, device_ids, mesh_shape,
  axis_names, partition_spec)``: ``mark_sharding`` as an op dynamo keeps in the graph (axis
  names and the spec as Python literals in strings, as PyTorch/XLA's). Other devices' tensors
  pass through.
"""
import ast
import warnings
from typing import List

import torch

_installed = False


def _fakify_like_xla() -> None:
    from torch._subclasses import meta_utils
    describe = meta_utils.MetaTensorDescriber.describe_tensor
    is_functional = torch._is_functional_tensor

    def not_functional_on_spmd(t):
        return False if t.device.type == "spmd" else is_functional(t)

    def describe_tensor(self, t, *args, **kwargs):
        if not isinstance(t, torch.Tensor) or t.device.type != "spmd":
            return describe(self, t, *args, **kwargs)
        # (meta_utils reads torch._is_functional_tensor from the torch module; dynamo traces
        # on one thread.)
        torch._is_functional_tensor = not_functional_on_spmd
        try:
            return describe(self, t, *args, **kwargs)
        finally:
            torch._is_functional_tensor = is_functional

    meta_utils.MetaTensorDescriber.describe_tensor = describe_tensor


def _backend(run_outputs: bool):
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        def run(*args):
            outputs = gm(*args)
            if run_outputs:
                from . import _C
                flat = [t for t in torch.utils._pytree.tree_leaves(outputs)
                        if isinstance(t, torch.Tensor) and t.device.type == "spmd"]
                if flat:
                    _C._sync_tensors([t.detach() for t in flat])
            return outputs
        return run
    return compile_fn


def _register_backends() -> None:
    """Registers ``spmd``, and ``openxla`` unless a real torch_xla is on the path (torch's own
    ``openxla`` entry imports torch_xla's dynamo bridge: it stays where that exists). Run at the
    first ``torch.compile`` naming one of them: importing dynamo costs most of a second, which
    a program that never compiles should not pay."""
    import importlib.util
    import sys
    from torch._dynamo.backends import registry
    registry._lazy_import()  # torch's own backends first ("openxla" among them)
    from . import xla
    # (Under torch_spmd.xla.install(), `torch_xla` resolves to torch_spmd's own modules, and
    # install() refuses to run where a real torch_xla exists.)
    real_torch_xla = not xla.is_installed() and (
        "torch_xla" in sys.modules or importlib.util.find_spec("torch_xla") is not None)
    for name, run_outputs in (("openxla", True), ("spmd", False)):
        if name == "openxla" and real_torch_xla:
            continue
        registry._BACKENDS[name] = None
        registry._COMPILER_FNS[name] = _backend(run_outputs)
        registry._COMPILER_FNS[name]._tags = ()


def _compile_registering_backends(compile_fn):
    registered = []

    def compile(*args, **kwargs):
        if not registered and kwargs.get("backend") in ("openxla", "spmd"):
            _register_backends()
            registered.append(True)
        return compile_fn(*args, **kwargs)

    compile.__doc__ = compile_fn.__doc__
    compile.__wrapped__ = compile_fn
    return compile


def _define_dynamo_mark_sharding() -> None:
    library = torch.library.Library("xla", "FRAGMENT")
    try:
        library.define("dynamo_mark_sharding(Tensor input, int[] device_ids, int[] mesh_shape, "
                       "str axis_names, str partition_spec) -> Tensor")
    except RuntimeError:
        return  # defined by a real torch_xla in this process

    def dynamo_mark_sharding(input: torch.Tensor, device_ids: List[int], mesh_shape: List[int],
                             axis_names: str, partition_spec: str) -> torch.Tensor:
        from torch._subclasses.fake_tensor import is_fake
        if input.device.type == "spmd" and not is_fake(input):
            from .distributed.spmd import Mesh, mark_sharding
            mesh = Mesh(device_ids, tuple(mesh_shape), ast.literal_eval(axis_names))
            mark_sharding(input, mesh, ast.literal_eval(partition_spec))
        return input

    library.impl("dynamo_mark_sharding", dynamo_mark_sharding, "CompositeExplicitAutograd")
    # (torch < 2.8 has no autograd fallback for a custom op's explicit kernel: without this,
    # a call on a tensor of an autograd backend is "not available for Autograd<device>". The
    # op is an annotation: it has no derivative of its own.)
    library.impl("dynamo_mark_sharding", dynamo_mark_sharding, "Autograd")
    _define_dynamo_mark_sharding.library = library  # (kept alive: it owns the registration)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _fakify_like_xla()
    torch.compile = _compile_registering_backends(torch.compile)
    # A compiled module warns at every call when global module hooks exist. torch_spmd's own
    # (the module scopes of its reports, debug/module_scope.py) fire once more for the
    # OptimizedModule, which adds an unnamed scope and nothing else: not the user's concern.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there "
                            r"are global hooks on modules")
    _define_dynamo_mark_sharding()
