"""``XlaFullyShardedDataParallel``: PyTorch/XLA's FSDP (ZeRO-2, or ZeRO-3 when nested) in
multi-process mode (one process per device, ``xmp.spawn``).

Each wrapped module's parameters are flattened, zero-padded and split across the ranks; a rank
keeps (and its optimizer updates) only its slice. Forward all-gathers the full parameters
(``xm.all_gather``), backward gathers them again where they were freed after forward, and
reduce-scatters the gradients into the slices (``xm.reduce_scatter``). All of it is recorded in
the lazy graph and runs at ``mark_step``; the collectives go over gloo between the processes.

How this maps onto our lazy runtime (see docs/fsdp.md):

- Freeing a full parameter means swapping its data for a one-element placeholder
  (``_C._replace_data``, our ``_replace_xla_tensor``): the parameter object stays (autograd
  holds it), the gathered value loses its last Python reference, and the executor frees its
  buffer after its last use in the step's program.
- The backward re-gather is a new ``xm::all_gather`` node. Our graph never merges equal
  subexpressions, so nothing keeps the forward gather alive until backward; the optimization
  barriers XLA needs against that are kept as calls to the (no-op) ``xm.optimization_barrier_``.
- Anything still referencing a gathered value at ``mark_step`` would become a graph output and
  stay on the device: full parameters, their views (flattened mode) and full gradients are all
  released by the end of backward.

Use ``optimizer.step()`` on the wrapped model's parameters, not ``xm.optimizer_step`` (that
would all-reduce the already reduced gradient shards).

This file holds the constructor, forward and the public methods; the parameter sharding,
gathering and freeing live in ``_param_sharding.py``, the autograd hooks in
``_backward_hooks.py`` (mixins of the class).
"""
import contextlib
import functools
import gc
import time
import traceback
from itertools import chain
from math import inf
from typing import Any, Callable, Dict, Generator, List, Optional, Union

import torch
import torch.nn as nn
from torch.nn.parameter import Parameter

from ..._impl.device import device as _spmd_device
from ... import runtime as xr
from ...core import xla_model as xm
from ...utils.checkpoint import chkpt_status
from ._backward_hooks import TrainingState, _BackwardHooksMixin
from ._init_utils import _materialize_module
from ._param_sharding import _ParamShardingMixin
from ._tree import cast_floating_tensors, collect_tensors
from .utils import (BucketizedReduceScatter, DummyReduceScatter, apply_xla_patch_to_nn_linear,
                    dummy_all_gather, dummy_all_reduce)
from ..wrap import check_wrappable, recursive_wrap
from .xla_flatten_params_wrapper import XlaFlattenParamsWrapper

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


class XlaFullyShardedDataParallel(_ParamShardingMixin, _BackwardHooksMixin, nn.Module):
    """Shards ``module``'s parameters across the data-parallel ranks (see the module docstring).

    Wrapping once gives ZeRO-2 (gradients and optimizer state sharded, full parameters gathered
    for the whole forward and backward); wrapping submodules first (or ``auto_wrap_policy``) and
    then the whole model gives ZeRO-3 (each inner instance frees its full parameters after its
    forward and gathers them again in backward). The optimizer must be created after wrapping.

    Arguments, defaults and semantics are PyTorch/XLA's. Accepted but without effect here:
    ``pin_layout_in_collective_ops`` (host buffers have no layout), the optimization barrier
    options (our graph has no CSE to guard against), ``coalesce_all_gather_ops`` (gathers run
    one per parameter), ``_debug_dummy_optimization_barrier_op``.
    """

    def __init__(
        self,
        module: nn.Module,
        reshard_after_forward: bool = True,
        flatten_parameters: bool = False,
        execute_sharding_on_init: bool = True,
        optimization_barrier_in_forward: bool = True,
        optimization_barrier_in_backward: bool = True,
        sync_on_finalization: bool = False,
        disable_reshard_on_root: bool = True,
        compute_dtype: Optional[torch.dtype] = None,
        buffer_dtype: Optional[torch.dtype] = None,
        fp32_reduce_scatter: bool = False,
        sharding_groups: Optional[List[List[int]]] = None,
        sharding_rank: Optional[int] = None,
        sharding_world_size: Optional[int] = None,
        shard_param_on_dim_0: bool = False,
        pin_layout_in_collective_ops: bool = True,
        reduce_scatter_bucket_size_mb: Optional[int] = 0,
        coalesce_all_gather_ops: bool = False,
        auto_wrap_policy: Optional[Callable] = None,
        auto_wrapper_callable: Optional[Callable] = None,
        param_init_fn: Optional[Callable[[nn.Module], None]] = None,
        _shard_size_multiple: int = 128,
        _use_xla_patched_linear: bool = True,
        _debug_dummy_forward_pass: bool = False,
        _debug_msg: str = "xla_fsdp",
        _debug_print: bool = False,
        _debug_dummy_all_gather_op: bool = False,
        _debug_dummy_all_reduce_op: bool = False,
        _debug_dummy_reduce_scatter_op: bool = False,
        _debug_dummy_optimization_barrier_op: bool = False,
    ):
        check_wrappable(module, XlaFullyShardedDataParallel)
        super().__init__()

        wrapper_cls = auto_wrapper_callable or XlaFullyShardedDataParallel
        if auto_wrap_policy is not None:
            # As in PyTorch/XLA, reduce_scatter_bucket_size_mb and coalesce_all_gather_ops are
            # not passed on to the auto-wrapped children.
            fsdp_kwargs = dict(
                reshard_after_forward=reshard_after_forward,
                flatten_parameters=flatten_parameters,
                execute_sharding_on_init=execute_sharding_on_init,
                optimization_barrier_in_forward=optimization_barrier_in_forward,
                optimization_barrier_in_backward=optimization_barrier_in_backward,
                sync_on_finalization=sync_on_finalization,
                disable_reshard_on_root=disable_reshard_on_root,
                compute_dtype=compute_dtype, buffer_dtype=buffer_dtype,
                fp32_reduce_scatter=fp32_reduce_scatter, sharding_groups=sharding_groups,
                sharding_rank=sharding_rank, sharding_world_size=sharding_world_size,
                shard_param_on_dim_0=shard_param_on_dim_0,
                pin_layout_in_collective_ops=pin_layout_in_collective_ops,
                param_init_fn=param_init_fn, _shard_size_multiple=_shard_size_multiple,
                _use_xla_patched_linear=_use_xla_patched_linear,
                _debug_dummy_forward_pass=_debug_dummy_forward_pass, _debug_msg=_debug_msg,
                _debug_print=_debug_print, _debug_dummy_all_gather_op=_debug_dummy_all_gather_op,
                _debug_dummy_all_reduce_op=_debug_dummy_all_reduce_op,
                _debug_dummy_reduce_scatter_op=_debug_dummy_reduce_scatter_op,
                _debug_dummy_optimization_barrier_op=_debug_dummy_optimization_barrier_op)
            self._auto_wrap(module, auto_wrap_policy, wrapper_cls, fsdp_kwargs)

        self.reshard_after_forward = self._orig_reshard_after_forward = reshard_after_forward
        self.disable_reshard_on_root = disable_reshard_on_root
        self.flatten_parameters = flatten_parameters
        self.optimization_barrier_in_forward = optimization_barrier_in_forward
        self.optimization_barrier_in_backward = optimization_barrier_in_backward
        self.sync_on_finalization = sync_on_finalization
        if compute_dtype is not None and compute_dtype not in FLOAT_DTYPES:
            raise ValueError(f"compute_dtype must be one of {FLOAT_DTYPES}, not {compute_dtype}")
        self.compute_dtype = compute_dtype or torch.float32
        if buffer_dtype is not None and buffer_dtype not in FLOAT_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {FLOAT_DTYPES}, not {buffer_dtype}")
        self.buffer_dtype = buffer_dtype or self.compute_dtype
        self.fp32_reduce_scatter = fp32_reduce_scatter
        # Shards are padded to a multiple of 128 elements (TPU-friendly gathers in XLA); rows
        # are the unit when sharding on dim 0.
        self._shard_size_multiple = _shard_size_multiple if not shard_param_on_dim_0 else 1
        self._use_xla_patched_linear = _use_xla_patched_linear
        self._shard_param_on_dim_0 = shard_param_on_dim_0 and not flatten_parameters
        self.sharding_groups = sharding_groups
        if sharding_groups is None:
            self.rank = xr.global_ordinal()
            self.world_size = xr.world_size()
        else:
            if sharding_rank is None or sharding_world_size is None:
                raise ValueError("sharding_rank and sharding_world_size must be provided when "
                                 "sharding_groups is specified")
            self.rank = sharding_rank
            self.world_size = sharding_world_size
        self.coalesce_all_gather_ops = coalesce_all_gather_ops
        self.all_gather_op = (dummy_all_gather if _debug_dummy_all_gather_op else
                              functools.partial(xm.all_gather,
                                                pin_layout=pin_layout_in_collective_ops))
        self.all_reduce_op = (dummy_all_reduce if _debug_dummy_all_reduce_op else
                              functools.partial(xm.all_reduce,
                                                pin_layout=pin_layout_in_collective_ops))
        if _debug_dummy_reduce_scatter_op:
            self.reduce_scatter_op = DummyReduceScatter(shard_count=self.world_size)
        else:
            self.reduce_scatter_op = BucketizedReduceScatter(
                reduce_scatter_bucket_size_mb, shard_count=self.world_size,
                groups=self.sharding_groups, pin_layout=pin_layout_in_collective_ops)
        self.optimization_barrier_op = ((lambda *args: None)
                                        if _debug_dummy_optimization_barrier_op
                                        else xm.optimization_barrier_)
        self._debug_dummy_forward_pass = _debug_dummy_forward_pass
        self._debug_msg = _debug_msg
        self._debug_print = _debug_print
        self.gradient_predivide_factor: float = self._get_gradient_predivide_factor(
            self.world_size)
        self.gradient_postdivide_factor: float = (self.world_size /
                                                  self.gradient_predivide_factor)
        self._tstart = time.time()

        if self._use_xla_patched_linear:
            module = apply_xla_patch_to_nn_linear(module)
        _materialize_module(module, param_init_fn, set(),
                            deferred_init_check_fn=lambda k: not isinstance(k, wrapper_cls))

        # Parameters of inner FSDP instances are sharded already; this one takes the rest.
        params = [p for p in module.parameters() if not hasattr(p, "_is_sharded")]
        if self.flatten_parameters:
            # Trainable and frozen parameters go to separate flat vectors.
            trainable = [p for p in params if p.requires_grad]
            frozen = [p for p in params if not p.requires_grad]
            to_be_flatten_params = [trainable] + ([frozen] if frozen else [])
            non_flatten_params = []
        else:
            to_be_flatten_params = [[]]
            non_flatten_params = params
        # The state dict stays flat (no automatic unflattening): get_shard_metadata() records
        # what consolidation needs to undo it.
        self._fsdp_wrapped_module: nn.Module = XlaFlattenParamsWrapper(
            module, param_list=to_be_flatten_params, auto_unflatten_state_dict=False)
        del module
        params_to_shard = list(self._fsdp_wrapped_module.flat_params) + non_flatten_params

        self.xla_device = _spmd_device()
        self._shard_parameters_(params_to_shard)
        self._cast_buffers(self.buffer_dtype)
        for n, p in self.named_parameters():
            assert hasattr(p, "_is_sharded"), f"found unsharded parameter: {n} ; {p.size()}"

        self._reset_lazy_init()
        self._require_backward_grad_sync: bool = True  # False inside no_sync()
        self.training_state = TrainingState.IDLE
        self.has_full_params: bool = False
        self._pre_backward_hook_has_run = False
        if execute_sharding_on_init:
            gc.collect()
            xm.mark_step()

    # ------------------------------------------------------------------------------------------
    # Construction helpers.

    def _auto_wrap(self, module, auto_wrap_policy, wrapper_cls, fsdp_kwargs) -> None:
        for module_name, m in module.named_modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                raise ValueError(f"Expected {module_name} to NOT be FullyShardedDataParallel "
                                 "if using an `auto_wrap_policy`")
        recursive_wrap(module=module, auto_wrap_policy=auto_wrap_policy,
                       wrapper_cls=wrapper_cls, ignored_modules=[], ignored_params=[],
                       only_wrap_children=True, **fsdp_kwargs)

    @staticmethod
    def _get_gradient_predivide_factor(world_size: int) -> float:
        # Divide partly before and partly after the reduction: keeps fp16/bf16 sums in range.
        factor: int = 1
        while world_size % factor == 0 and world_size / factor > factor:
            factor *= 2
        return float(factor)


    # ------------------------------------------------------------------------------------------
    # Public API.

    def set_gradient_divide_factors(self, pre: float, post: float, recursive: bool) -> None:
        """Gradients are divided by ``pre`` before the reduce-scatter and by ``post`` after it
        (defaults: ``pre * post == world_size``, i.e. the mean over ranks). ``(1, 1)`` makes
        the reduce-scatter itself scale by 1/world_size."""
        self.assert_state(TrainingState.IDLE)
        if recursive:
            for module in self.modules():
                if isinstance(module, XlaFullyShardedDataParallel) and module is not self:
                    module.set_gradient_divide_factors(pre, post, False)
        self.gradient_predivide_factor = pre
        self.gradient_postdivide_factor = post
        self.reduce_scatter_op.scale = 1.0 / self.world_size if (pre, post) == (1, 1) else 1.0

    @property
    def module(self) -> XlaFlattenParamsWrapper:
        """The wrapped module (inside its ``XlaFlattenParamsWrapper``), as DDP's ``.module``."""
        assert isinstance(self._fsdp_wrapped_module, XlaFlattenParamsWrapper)
        return self._fsdp_wrapped_module

    @property
    def params_with_grad(self) -> List[Parameter]:
        return [p for p in self.parameters() if p.grad is not None]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: Union[float, int], norm_type: Union[float, int] = 2.0,
                        groups: Optional[List[List[int]]] = None) -> torch.Tensor:
        """Clips the gradients of all ranks together by their global ``norm_type`` norm, as
        if concatenated into one vector: local norm of this rank's shards, all-reduced (sum of
        p-th powers, or max), then every shard gradient times
        ``clip(max_norm / (total + 1e-6), 0, 1)``. Root instance only; every rank must call it.
        Returns the total norm."""
        assert self._is_root, "clip_grad_norm should only be called on the root (parent) instance"
        self.assert_state(TrainingState.IDLE)
        max_norm = float(max_norm)
        norm_type = float(norm_type)
        params_with_grad = self.params_with_grad
        local_norm = _calc_grad_norm(params_with_grad, norm_type, self.xla_device)
        if norm_type == inf:
            total_norm = self.all_reduce_op(xm.REDUCE_MAX, local_norm, groups=groups)
        else:
            total_norm = self.all_reduce_op(xm.REDUCE_SUM, local_norm**norm_type, groups=groups)
            total_norm = total_norm**(1.0 / norm_type)
        clip_coef = torch.clip(max_norm / (total_norm + 1e-6), 0.0, 1.0)
        for p in params_with_grad:
            p.grad.detach().mul_(clip_coef)
        return total_norm

    @contextlib.contextmanager
    def no_sync(self) -> Generator:
        """Gradient accumulation without reduce-scatter: inside the context, full gradients
        accumulate on the full parameters (more memory); the first backward after it
        reduce-scatters the sum. Root instance only."""
        self._lazy_init()
        assert self._is_root, "no_sync on inner FSDP is not supported"
        self.assert_state(TrainingState.IDLE)
        old_flags = []
        for m in self.modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                old_flags.append((m, m._require_backward_grad_sync))
                m._require_backward_grad_sync = False
        try:
            yield
        finally:
            for m, old_flag in old_flags:
                assert m._require_backward_grad_sync is False
                m._require_backward_grad_sync = old_flag

    def get_original_names_and_sharded_parameters(self):
        """``(original name, sharded parameter)`` pairs, like ``named_parameters()`` but named
        after the unwrapped module's parameters."""
        out = []
        for module_name, m in self.named_modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                prefix = "" if module_name == "" else module_name + "."
                for p in m.sharded_params:
                    n = (prefix + p._orig_name).replace("_fsdp_wrapped_module.",
                                                        "").replace("_fpw_module.", "")
                    out.append((n, p))
        return out

    def get_shard_metadata(self) -> Dict[str, Any]:
        """What ``consolidate_sharded_state_dicts`` needs besides the sharded state dicts:
        ``shard_info`` (per FSDP module: sharded name -> original name and size),
        ``flatten_info`` (per flat parameter: names, shapes, numels), ``buffer_info``
        (buffers' original dtypes), ``world_size`` and ``rank``."""
        shard_info, flatten_info, buffer_info = {}, {}, {}
        for module_name, m in self.named_modules(remove_duplicate=False):
            # state_dict() drops "_fpw_module." (the flatten wrapper's hook): so do we.
            module_name = module_name.replace("_fpw_module.", "")
            if isinstance(m, XlaFullyShardedDataParallel):
                shard_info[module_name] = {
                    p._name: {"_orig_size": p._orig_size, "_orig_name": p._orig_name}
                    for p in m.sharded_params}
            if isinstance(m, XlaFlattenParamsWrapper):
                for i in range(len(m.flat_params)):
                    name = f"flat_param_{i}"
                    if module_name != "":
                        name = module_name + "." + name
                    flatten_info[name] = m.metadata(i)
        for name, buf in self.named_buffers():
            if buf is not None and hasattr(buf, "_orig_dtype"):
                # Named as in state_dict() (without "_fpw_module."), so that consolidation
                # finds them; PyTorch/XLA keeps the level and never casts buffers back.
                buffer_info[name.replace("_fpw_module.", "")] = {"_orig_dtype": buf._orig_dtype}
        return {"shard_info": shard_info, "flatten_info": flatten_info,
                "buffer_info": buffer_info, "world_size": self.world_size, "rank": self.rank}

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, rank={self.rank}, "
                f"compute_dtype={self.compute_dtype}, buffer_dtype={self.buffer_dtype}, "
                f"flatten_parameters={self.flatten_parameters}, "
                f"reshard_after_forward={self.reshard_after_forward}, "
                f"sharding_groups={self.sharding_groups}")

    def __getattr__(self, name: str) -> Union[torch.Tensor, nn.Module]:
        """Unknown attributes come from the wrapped module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Indexing reaches the wrapped module (e.g. an ``nn.Sequential``)."""
        return self.module.__getitem__(key)

    # ------------------------------------------------------------------------------------------
    # Root detection (lazily, at the first forward: only then is the hierarchy final).

    def _reset_lazy_init(self) -> None:
        self._is_root: Optional[bool] = None
        self._all_sharded_params: Optional[List[Parameter]] = None
        self._output_pre_backward_hook_registered: Optional[set] = None
        self._backward_opt_barrier_tensors: Optional[List] = None
        self._backward_opt_barrier_tensor_ids: Optional[set] = None
        self.reshard_after_forward = self._orig_reshard_after_forward

    def _lazy_init(self) -> None:
        if self._is_root is None:
            self._set_is_root()
            self._setup_output_hook_and_backward_opt_barrier_lists()
        if self._is_root and self.disable_reshard_on_root:
            # The root's parameters are needed again right at the start of backward.
            self.reshard_after_forward = False

    def _set_is_root(self) -> None:
        if self._is_root is not None:
            return
        self._is_root = True
        self._all_sharded_params = list(self.parameters())
        if self._debug_print:
            xm.master_print(f"root FSDP got {len(self._all_sharded_params)} total params "
                            f"(_debug_msg: {self._debug_msg}).", flush=True)
        self.assert_state(TrainingState.IDLE)
        for n, m in self.named_modules():
            if n != "" and isinstance(m, XlaFullyShardedDataParallel):
                assert m._is_root is None or not m._is_root
                if m._is_root is None:
                    m._is_root = False

    def _setup_output_hook_and_backward_opt_barrier_lists(self) -> None:
        assert self._is_root, "This should only be called on the root"
        self._output_pre_backward_hook_registered = set()
        self._backward_opt_barrier_tensors = []
        self._backward_opt_barrier_tensor_ids = set()
        for n, m in self.named_modules():
            if n != "" and isinstance(m, XlaFullyShardedDataParallel):
                m._output_pre_backward_hook_registered = self._output_pre_backward_hook_registered
                m._backward_opt_barrier_tensors = self._backward_opt_barrier_tensors
                m._backward_opt_barrier_tensor_ids = self._backward_opt_barrier_tensor_ids

    # ------------------------------------------------------------------------------------------
    # Forward.

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._lazy_init()
        self.training_state = TrainingState.FORWARD
        if self.compute_dtype != torch.float32:
            args, kwargs = cast_floating_tensors(self.compute_dtype, *args, **kwargs)
        input_opt_barrier_tensors = []
        if self.optimization_barrier_in_forward:
            input_opt_barrier_tensors = collect_tensors((args, kwargs))
        self._rebuild_full_params(dependency_tensors=input_opt_barrier_tensors,
                                  apply_opt_barrier=self.optimization_barrier_in_forward)
        self._register_post_backward_hooks()
        if not self._debug_dummy_forward_pass:
            outputs = self.module(*args, **kwargs)
        else:
            outputs = self._dummy_forward(*args, **kwargs)
        # A forward recomputed for a checkpointed backward keeps its parameters: its backward
        # follows immediately and would otherwise gather them again.
        if self.reshard_after_forward and not chkpt_status.in_chkpt_bwd:
            output_opt_barrier_tensors = []
            if self.optimization_barrier_in_forward:
                output_opt_barrier_tensors = collect_tensors(outputs)
            self._free_full_params(dependency_tensors=output_opt_barrier_tensors,
                                   apply_opt_barrier=self.optimization_barrier_in_forward)
        outputs = self._register_pre_backward_hooks(outputs)
        if self.optimization_barrier_in_backward:
            self._register_grad_opt_barrier_hooks(
                input_opt_barrier_tensors or collect_tensors((args, kwargs)))
        self.training_state = TrainingState.IDLE
        return outputs

    def _dummy_forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Sums the inputs and full parameters instead of running the module: shows the
        parameter-only memory footprint (``_debug_dummy_forward_pass``)."""
        recursive = kwargs.pop("_xla_fsdp_dummy_forward_resursive", True)
        outputs = torch.zeros(1, device=self.xla_device)
        for t in chain(args, kwargs.values(), self.full_params):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                outputs = outputs + t.mean()
        if recursive:
            assert self._is_root
            for m in self.modules():
                if isinstance(m, XlaFullyShardedDataParallel) and m is not self:
                    orig = m._debug_dummy_forward_pass
                    m._debug_dummy_forward_pass = True
                    outputs = m(outputs, _xla_fsdp_dummy_forward_resursive=False)
                    m._debug_dummy_forward_pass = orig
        return outputs



    def assert_state(self, state: Union[TrainingState, List[TrainingState]]) -> None:
        """Raises ValueError unless in ``state`` (one of a list)."""
        if isinstance(state, TrainingState):
            state = [state]
        if self.training_state not in state:
            msg = (f"expected to be in states {state} but current state "
                   f"is {self.training_state}")
            if self.rank == 0:
                print(f"Asserting FSDP instance is: {self}")
                print(f"ERROR: {msg}")
                traceback.print_stack()
            raise ValueError(msg)

    def _print_r0(self, msg: str, restart: bool = False) -> None:
        """Debugging: device memory in use on rank 0."""
        if restart:
            self._tstart = time.time()
        if self.rank == 0:
            info = xm.get_memory_info(0)
            print(f"{msg} used={info['bytes_used'] / 2**30: .4f} GiB, "
                  f"peak={info['peak_bytes_used'] / 2**30: .4f} GiB, "
                  f"t={time.time() - self._tstart: .1f}")


def _calc_grad_norm(parameters: List[Parameter], p: float, device) -> torch.Tensor:
    """The ``p``-norm of all gradients of ``parameters`` together."""
    if len(parameters) == 0:
        return torch.tensor(0.0, device=device)
    if p == inf:
        return torch.stack([par.grad.detach().abs().max() for par in parameters]).max()
    return torch.norm(torch.stack([torch.norm(par.grad.detach(), p) for par in parameters]), p)
