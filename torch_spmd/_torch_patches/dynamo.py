"""torch.compile of programs on spmd tensors: fake tensors, the ``openxla`` and ``spmd`` dynamo
backends, and ``torch.ops.xla.dynamo_mark_sharding``.

- **Fake tensors.** Dynamo traces with fake tensors made from the real ones
  (``torch._subclasses.meta_utils``). spmd tensors are functionalization wrappers (like xla and
  lazy tensors), which meta_utils unwraps to fakify, except for the ``xla`` and ``lazy`` device
  types, which it fakifies from their metadata as plain device tensors. Unwrapped, an spmd
  tensor's fake came out a non-leaf where the real one is a leaf (an AssertionError inside
  dynamo). spmd tensors are fakified as xla's are: the describer sees them as not functional.
- **Backends.** ``openxla`` (PyTorch/XLA's name) and ``spmd`` hand dynamo's graph to
  AOTAutograd, which splits it into forward and backward graphs of ATen ops. ``openxla`` runs
  each graph's outputs at the call (a program per graph, as PyTorch/XLA's backend executes the
  graphs it compiled); ``spmd`` leaves them pending, so the call joins the step's one program
  (what a training step wants: forward, backward and optimizer partitioned together). Graph
  breaks run as ordinary lazy code. Recompiles follow dynamo's guards.
- **Replay** (``_Replayer``, csrc/aten/graph_template.h). A graph's first call records its ops
  inside a capture; later calls instantiate the recorded nodes on the new inputs in one C++
  call instead of running the graph's ops through Python and the dispatcher.
- **Lean calls** (``_Region``, ``_LeanFunction``). Once a training graph's forward and backward
  are both captured, and AOTAutograd's runtime would only call them, one autograd function
  calls the two templates directly, the activations passing between them as IR values.
- **Compiled optimizer steps** run the capturable algorithm on spmd parameters (as dynamo makes
  them on CUDA), so their graphs replay.
- **dynamo_mark_sharding.** ``torch.ops.xla.dynamo_mark_sharding(t, device_ids, mesh_shape,
  axis_names, partition_spec)``: ``mark_sharding`` as an op dynamo keeps in the graph (axis
  names and the spec as Python literals in strings, as PyTorch/XLA's). Other devices' tensors
  pass through.
"""
import ast
import functools
import warnings
from typing import List, NamedTuple, Tuple

import torch

from .. import _C

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


class _Replayer:
    """One AOTAutograd graph (a forward, a backward or an inference graph), called boxed: the
    first call with given non-tensor arguments runs the graph's ops (recording them, as any
    lazy code) inside a capture (``_C._TemplateCapture``, csrc/aten/graph_template.h); later
    calls instantiate the captured template on the new inputs in one C++ call. A graph whose
    run cannot be replayed (an eager fallback, a sync, a read to the host, a CPU tensor input)
    runs its ops every call; ``why_not`` says why."""

    _MAX_TEMPLATES = 8  # per non-tensor arguments (different input shapes, dynamic shapes)
    _MAX_KEYS = 16      # distinct non-tensor arguments (a scalar new at every call: no replay)

    def __init__(self, gm: torch.fx.GraphModule, run_outputs: bool):
        import os
        self.gm = gm
        self.run_outputs = run_outputs
        # Tensor constants the graph holds (get_attr: tensors a traced program made on the
        # device): the template takes them as inputs, so it reads their values at each call.
        self.constants = []
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = functools.reduce(getattr, node.target.split("."), gm)
                if isinstance(value, torch.Tensor) and value.device.type == "spmd":
                    self.constants.append(value)
        self.templates = {}  # non-tensor arguments -> [(template, output plan)]
        self._keeping = {}   # (id(template), first_kept) -> instantiate_keeping's references
        # SPMD_COMPILE_REPLAY=0 runs every call's ops (to compare, or to rule replay out)
        self.why_not = ("SPMD_COMPILE_REPLAY=0" if os.environ.get("SPMD_COMPILE_REPLAY", "1") == "0"
                        else None)

    def __call__(self, args):
        tensors, key, replayable = list(self.constants), [], True
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.device.type == "spmd":
                    tensors.append(a)
                    key.append(None)
                else:
                    replayable = False
            else:
                key.append(a)
        key = tuple(key)
        try:
            bucket = self.templates.get(key, ())
        except TypeError:  # (an unhashable argument)
            replayable = False
        if not replayable:
            return self._run(args)
        for tmpl, plan in bucket:
            made = tmpl.instantiate(tensors)
            if made is not None:  # (None: the inputs are not the captured kind)
                return self._finish(self._assemble(plan, args, made))
        if self.why_not is not None or (not bucket and len(self.templates) >= self._MAX_KEYS):
            return self._run(args)
        capture = _C._TemplateCapture(tensors)
        try:
            outputs = self.gm(*args)
        except BaseException:
            capture.finish([])
            raise
        plan, new = self._output_plan(args, outputs)
        tmpl, why_not = capture.finish(new)
        if plan is None:
            tmpl, why_not = None, "an output is a tensor off the spmd device"
        if tmpl is None:
            self.why_not = why_not
        else:
            bucket = self.templates.setdefault(key, [])
            if len(bucket) < self._MAX_TEMPLATES:
                identity = plan == [("new", j) for j in range(len(plan))]
                bucket.append((tmpl, None if identity else plan))
        return self._finish(outputs)

    def replay_keeping(self, args: list, first_kept: int):
        """For a lean forward (``_LeanFunction``; arguments all spmd tensors, no constants):
        ``(outputs[:first_kept], the rest as _C._KeptValues)``: the activations stay IR values
        for the backward, never becoming tensors."""
        for tmpl, plan in self.templates.get((None,) * len(args), ()):
            refs = self._keeping_refs(tmpl, plan, first_kept)
            if refs is None:
                continue
            made = tmpl.instantiate_keeping(args, refs)
            if made is not None:
                outputs, kept = made
                if self.run_outputs:
                    # The kept values become the computed data: kept as the nodes that compute
                    # them, the backward's program would compute the forward again.
                    activations = kept.tensors()
                    _C._sync_tensors(outputs + activations)
                    kept = _C._KeptValues(activations)
                return outputs, kept
        outputs = self(args)
        return outputs[:first_kept], _C._KeptValues(outputs[first_kept:])

    def _keeping_refs(self, tmpl, plan, first_kept: int):
        """The output plan as instantiate_keeping's _KeepingRefs, once per template; None
        where a returned output is not the template's own or a kept one is not a tensor."""
        key = (id(tmpl), first_kept)
        if key not in self._keeping:
            entries = plan if plan is not None else [("new", j) for j in range(tmpl.num_outputs)]
            resolved = []
            for kind, x in entries:
                resolved.append(resolved[x] if kind == "out" else (kind, x))
            returned = [x for kind, x in resolved[:first_kept] if kind == "new"]
            kept = [(0 if kind == "new" else 1, x) for kind, x in resolved[first_kept:]
                    if kind in ("new", "arg")]
            ok = len(returned) == first_kept and len(kept) == len(resolved) - first_kept
            self._keeping[key] = _C._KeepingRefs(returned, kept) if ok else None
        return self._keeping[key]

    def replay_after(self, kept, args: list):
        """For a lean backward: ``self([*kept, *args])`` with the forward's kept values."""
        for tmpl, plan in self.templates.get((None,) * (len(kept) + len(args)), ()):
            made = tmpl.instantiate_after(kept, args)
            if made is not None:
                return self._finish(self._assemble(plan, args, made))
        return self([*kept.tensors(), *args])

    def _run(self, args):
        return self._finish(self.gm(*args))

    @staticmethod
    def _output_plan(args, outputs):
        """How to rebuild the outputs: ("arg", i) an input tensor itself, ("out", k) an
        earlier output, ("new", j) the template's j-th output, ("const", v) anything else
        that is not a tensor. None when an output is a tensor off the spmd device."""
        plan, new = [], []
        by_id = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        seen = {}
        for k, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                plan.append(("const", out))
            elif id(out) in by_id:
                plan.append(("arg", by_id[id(out)]))
            elif id(out) in seen:
                plan.append(("out", seen[id(out)]))
            elif out.device.type != "spmd":
                return None, []
            else:
                seen[id(out)] = k
                plan.append(("new", len(new)))
                new.append(out)
        return plan, new

    @staticmethod
    def _assemble(plan, args, made):
        if plan is None:  # (the outputs are the template's, in order)
            return made
        outputs = []
        for kind, x in plan:
            outputs.append(made[x] if kind == "new" else args[x] if kind == "arg"
                           else outputs[x] if kind == "out" else x)
        return outputs

    def _finish(self, outputs):
        if self.run_outputs:
            flat = [t for t in outputs if isinstance(t, torch.Tensor) and t.device.type == "spmd"]
            if flat:  # (the tensors themselves: a detached view would be a copy of its own)
                _C._sync_tensors(flat)
        return outputs


def _backend(run_outputs: bool):
    """A dynamo backend: AOTAutograd splits each captured graph into forward and backward
    graphs of ATen ops, and each is replayed (``_Replayer``); a training graph whose calls
    AOTAutograd's runtime only forwards is then called through ``_Region``'s own lean
    autograd function."""
    from torch._dynamo.backends.common import aot_autograd

    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        _read_annotated_values(gm)
        region = _Region(run_outputs)
        # keep_inference_input_mutations: updates of inputs that autograd does not see
        # (BatchNorm's running stats) stay in the graph as copy_ into the input, which replay
        # writes again, as aot_eager and inductor keep them. Left to AOTAutograd's epilogue,
        # the forward saved the stats for the backward and the epilogue's update then failed
        # the backward's version check under activation checkpointing.
        compiled = aot_autograd(fw_compiler=region.compile_forward,
                                bw_compiler=region.compile_backward,
                                inference_compiler=region.compile_inference,
                                keep_inference_input_mutations=True)(gm, example_inputs)
        if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
            return compiled  # (inputs flattened by dynamo's wrapper: AOTAutograd's runtime)
        region.aot = compiled
        return region

    return compile_fn


class _Region:
    """One dynamo graph compiled through AOTAutograd. Calls go through AOTAutograd's runtime
    until its forward and backward graphs have both been captured for replay; from then on, a
    training graph whose runtime has nothing to do but call them (no input mutation, no output
    aliasing an input or another output, no symbolic sizes saved, no RNG or effect tokens: see
    ``_lean_plan``) is called through ``_LeanFunction``, one autograd function that runs the
    forward template and saves its activations, and whose backward runs the backward
    template: AOTAutograd's wrappers cost as much host time per call as the replay itself.
    ``SPMD_COMPILE_LEAN=0`` keeps AOTAutograd's runtime."""

    def __init__(self, run_outputs: bool):
        import os
        self.run_outputs = run_outputs
        self.aot = None
        self.forward = self.backward = None
        self.meta = None
        self.num_forward_inputs = self.num_forward_outputs = -1
        self.num_backward_inputs = self.num_backward_outputs = -1
        self.lean = None if os.environ.get("SPMD_COMPILE_LEAN", "1") != "0" else False

    def _replayer(self, gm):
        replay = _Replayer(gm, self.run_outputs)
        replay._boxed_call = True
        return replay

    @staticmethod
    def _placeholders(gm) -> int:
        return sum(1 for node in gm.graph.nodes if node.op == "placeholder")

    @staticmethod
    def _outputs(gm) -> int:
        out = next(node for node in gm.graph.nodes if node.op == "output").args[0]
        return len(out) if isinstance(out, (list, tuple)) else -1

    def compile_forward(self, gm, example_inputs):
        self.forward = self._replayer(gm)
        self.num_forward_inputs = self._placeholders(gm)
        self.num_forward_outputs = self._outputs(gm)
        self.meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        return self.forward

    def compile_backward(self, gm, example_inputs):
        self.backward = self._replayer(gm)
        self.num_backward_inputs = self._placeholders(gm)
        self.num_backward_outputs = self._outputs(gm)
        return self.backward

    def compile_inference(self, gm, example_inputs):
        self.lean = False  # (an inference graph: AOTAutograd's runtime is thin there)
        return self._replayer(gm)

    def __call__(self, *args):
        if self.lean is None and self.backward is not None and self.backward.templates:
            self.lean = _lean_plan(self, args)
        if self.lean and torch.is_grad_enabled():
            out = _lean_apply(self, args)
            return out if isinstance(out, tuple) else (out,)
        return self.aot(*args)


def _lean_plan(region: _Region, args) -> object:
    """What ``_LeanFunction`` needs to call the region's graphs as AOTAutograd's runtime would,
    or False where that runtime does more than call them."""
    meta = region.meta
    try:
        outputs = list(meta.output_info)
        saved = meta.tensors_saved_for_backwards_slice
        simple = (meta.num_mutated_inp_runtime_indices == 0 and meta.num_intermediate_bases == 0
                  and not meta.is_rng_op_functionalized and not meta.tokens
                  and not getattr(meta, "num_backward_tokens", 0)
                  and meta.symints_saved_for_backwards_slice == slice(0, 0)
                  and not getattr(meta, "num_opaque_objects_saved_for_bw", 0)
                  and all(o.output_type.name == "non_alias" for o in outputs)
                  and meta.num_forward_returns == len(outputs) == meta.num_outputs)
    except (AttributeError, AssertionError, TypeError):
        return False  # (another torch's metadata)
    if (not simple or not region.forward.templates or region.forward.constants
            or region.backward.constants):
        return False
    grads = tuple(bool(getattr(o, "requires_grad_for_backward", o.requires_grad)) for o in outputs)
    # The activations: every forward output after the user's (kept for the backward as values).
    num_saved = region.num_forward_outputs - len(outputs)
    if (saved.indices(region.num_forward_outputs)[:2] != (len(outputs), region.num_forward_outputs)
            or len(args) != region.num_forward_inputs or region.num_backward_outputs != len(args)
            or region.num_backward_inputs != num_saved + sum(grads)
            or not all(isinstance(a, torch.Tensor) for a in args)):
        return False
    return _LeanPlan(num_outputs=len(outputs), tangents=grads,
                     differentiable=tuple(bool(o.requires_grad) for o in outputs))


class _LeanPlan(NamedTuple):
    num_outputs: int               # the user's outputs, first among the forward graph's
    tangents: Tuple[bool, ...]     # per user output: the backward graph takes its gradient
    differentiable: Tuple[bool, ...]  # per user output: autograd may differentiate it


def _without_autocast(fn, *args):
    """``fn(*args)`` with autocast off: the graphs were traced with it applied."""
    if not torch._C._is_any_autocast_enabled():
        return fn(*args)
    with torch._C._DisableAutocast():
        return fn(*args)


class _LeanFunction(torch.autograd.Function):
    """A region's forward template and backward template as one autograd function (see
    ``_Region``): the forward graph's outputs are the user's outputs and then the activations
    the backward graph takes before the gradients of the outputs that need them; the backward
    graph returns a gradient (or None) per forward input."""

    @staticmethod
    def forward(ctx, region, *args):
        plan = region.lean
        user, ctx.kept = _without_autocast(region.forward.replay_keeping, list(args),
                                           plan.num_outputs)
        ctx.region = region
        ctx.mark_non_differentiable(*[o for o, d in zip(user, plan.differentiable)
                                      if not d and isinstance(o, torch.Tensor)])
        return tuple(user)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        region, kept = ctx.region, ctx.kept
        if kept is None:
            raise RuntimeError(_BACKWARD_TWICE)
        tangents = [g.contiguous() for g, t in zip(grads, region.lean.tangents) if t]
        out = (None, *_without_autocast(region.backward.replay_after, kept, tangents))
        # As the engine frees saved tensors: the activations (and through them the step's
        # inputs, old parameter buffers included) would otherwise live as long as the graph's
        # output, until the next step's forward replaces it.
        if not _C._graph_task_keeps_graph():
            ctx.kept = None
        return out


# autograd's own apply (C++), which Function.apply calls after its Python prologue
_AUTOGRAD_APPLY = super(torch.autograd.Function, _LeanFunction).apply


def _lean_apply(region: _Region, args):
    """``_LeanFunction.apply(region, *args)``. Outside functorch transforms, Function.apply's
    Python prologue only unwraps dead functorch wrappers among the arguments (a compiled
    region's are dynamo's graph inputs; a wrapper would not match the template, and the
    forward would run the graph instead); skipping it saves ~30 us a call on the benchmark
    GPT (30 arguments)."""
    if torch._C._are_functorch_transforms_active():
        return _LeanFunction.apply(region, *args)
    return _AUTOGRAD_APPLY(region, *args)


_BACKWARD_TWICE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


def _read_annotated_values(gm: torch.fx.GraphModule) -> None:
    """``dynamo_mark_sharding(t, ...)`` annotates ``t`` in place and returns it; a program
    calls it for that effect and goes on using ``t``. AOTAutograd's functional graphs would
    drop the call as dead code (nothing reads its result), so later readers of ``t`` are made
    to read the call's result: the annotated value, which is what they read in eager."""
    marks = (torch.ops.xla.dynamo_mark_sharding, torch.ops.xla.dynamo_mark_sharding.default)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in marks:
            continue
        annotated = node.args[0]
        if isinstance(annotated, torch.fx.Node):
            annotated.replace_all_uses_with(
                node, delete_user_cb=lambda user, at=order[node]: order[user] > at)
            changed = True
    if changed:
        gm.recompile()


def _register_backends() -> None:
    """Registers ``spmd``, and ``openxla`` unless a real torch_xla is on the path (torch's own
    ``openxla`` entry imports torch_xla's dynamo bridge: it stays where that exists). Run at the
    first ``torch.compile`` naming one of them: importing dynamo costs most of a second, which
    a program that never compiles should not pay."""
    import importlib.util
    import sys
    from torch._dynamo.backends import registry
    registry._lazy_import()  # torch's own backends first ("openxla" among them)
    from .. import xla
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
    _capturable_optimizers_on_spmd()


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
            from ..distributed.spmd import Mesh, mark_sharding
            mesh = Mesh(device_ids, tuple(mesh_shape), ast.literal_eval(axis_names))
            mark_sharding(input, mesh, ast.literal_eval(partition_spec))
        # (A copy: a custom op's result may not alias its input. The copy of the annotated
        # value has its sharding; a compiled graph's later readers read it, see
        # _read_annotated_values.)
        return input.clone()

    def below_autograd(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.xla.dynamo_mark_sharding(*args)

    library.impl("dynamo_mark_sharding", dynamo_mark_sharding, "CompositeExplicitAutograd")
    # (torch < 2.8 has no autograd fallback for a custom op's explicit kernel: without this,
    # a call on a tensor of an autograd backend is "not available for Autograd<device>". The
    # op is an annotation: it has no derivative of its own. The kernel dispatches on, so that
    # tracers below autograd, AOTAutograd's among them, see the op.)
    library.impl("dynamo_mark_sharding", below_autograd, "Autograd")
    _define_dynamo_mark_sharding.library = library  # (kept alive: it owns the registration)


def _refuse_inductor_on_spmd_tensors() -> None:
    """Inductor generates code per device type and has none for spmd (it failed with
    ``KeyError: 'spmd'`` deep in its code generation): a graph on spmd tensors sent to it
    raises an error naming the backends that run it."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None:
        return
    call = wrapper.__call__

    def checked(self, model_, inputs_):
        if any(isinstance(t, torch.Tensor) and t.device.type == "spmd" for t in inputs_):
            raise RuntimeError(
                "torch.compile's default backend (inductor) generates no code for the spmd "
                "device: compile with backend=\"openxla\" (PyTorch/XLA's name) or "
                "backend=\"spmd\" (docs/user_guide.md, section 12)")
        return call(self, model_, inputs_)

    wrapper.__call__ = checked


def _capturable_optimizers_on_spmd() -> None:
    """A compiled optimizer step on spmd parameters runs the capturable algorithm, as dynamo
    makes it run on CUDA: its step counts are then spmd tensors, so the step's graph replays
    (a 0-dim CPU step count is an input the template cannot take: the graph's ops ran at every
    call, 3x slower than the lazy step). Set, as torch sets it, only on parameter groups whose
    state is not initialized yet and only where the optimizer has the option."""
    from torch._dynamo.variables import optimizer
    set_capturable = optimizer.OptimizerVariable._set_capturable

    def spmd_capturable(self, tx, *args, **kwargs):
        for group in self.value.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params and
                    all(p.device.type == "spmd" and p not in self.value.state for p in params)):
                group["capturable"] = True
        return set_capturable(self, tx, *args, **kwargs)

    optimizer.OptimizerVariable._set_capturable = spmd_capturable


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _fakify_like_xla()
    _refuse_inductor_on_spmd_tensors()
    torch.compile = _compile_registering_backends(torch.compile)
    # A compiled module warns at every call when global module hooks exist. torch_spmd's own
    # (the module scopes of its reports, debug/module_scope.py) fire once more for the
    # OptimizedModule, which adds an unnamed scope and nothing else: not the user's concern.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there "
                            r"are global hooks on modules")
    _define_dynamo_mark_sharding()
