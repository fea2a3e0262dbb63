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
"""
import contextlib
import functools
import gc
import time
import traceback
from enum import Enum, auto
from itertools import chain
from math import inf
from typing import Any, Callable, Dict, Generator, List, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable
from torch.nn.parameter import Parameter

from ... import _C
from ..._device import device as _spmd_device
from ... import runtime as xr
from ...core import xla_model as xm
from ...utils.checkpoint import chkpt_status
from ._init_utils import _materialize_module
from ._tree import apply_to_tensors, cast_floating_tensors, collect_tensors
from .utils import (BucketizedReduceScatter, DummyReduceScatter, apply_xla_patch_to_nn_linear,
                    dummy_all_gather, dummy_all_reduce)
from .wrap import recursive_wrap
from .xla_flatten_params_wrapper import XlaFlattenParamsWrapper

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Sharded parameters are registered as "_fsdp_shard." + original name, with every "." replaced
# by this separator (module attribute names cannot contain dots).
_FSDP_SHARD_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"


class TrainingState(Enum):
    """Where an FSDP instance is in its forward/backward cycle (checked by the hooks)."""
    IDLE = auto()
    FORWARD = auto()
    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


class XlaFullyShardedDataParallel(nn.Module):
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
        if isinstance(module, XlaFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, "
                "first wrap the inner child modules before wrapping the outer parent module.")
        is_forward_defined = (hasattr(module, "forward") and hasattr(module.forward, "__func__")
                              and module.forward.__func__ != torch.nn.Module.forward)
        if not is_forward_defined:
            raise RuntimeError(
                "The module wrapped by FSDP *must define a `forward` method and call it "
                "during the module's forward pass for FSDP to work correctly.* "
                "Hence, do not wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP "
                "(since they don't have `forward` defined), "
                "and do not perform the forward pass in other ways apart from the `forward` "
                "method. (i.e. you should directly call the FSDP-wrapped module itself in your "
                "code, instead of using any of its submodules or its weights).")
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

    @torch.no_grad()
    def _shard_parameters_(self, params_to_shard) -> None:
        """Replaces each full parameter by this rank's padded 1-D slice (``rows`` with
        ``shard_param_on_dim_0``), registered on this instance; the full parameter object
        stays on its module as a plain attribute holding a placeholder until gathered."""
        if params_to_shard:
            # The data of every freed full parameter: one element, shared.
            self._dummy_data_placeholder = torch.zeros(1, dtype=self.compute_dtype,
                                                       device=self.xla_device)
        params_to_shard_set = set(params_to_shard)
        assert len(params_to_shard_set) == len(params_to_shard), (
            "params_to_shard should not have dups")
        full_param_infos, shared_full_param_infos, full_params, memo = [], [], [], {}
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if p.dtype != torch.float32:
                    raise TypeError("only fp32 parameters are supported")
                if p not in params_to_shard_set:
                    continue
                if p in memo:
                    mname, shared_m, shared_n = memo[p]
                    shared_full_param_infos.append((module_name, mname, m, n, shared_m,
                                                    shared_n))
                else:
                    memo[p] = (module_name, m, n)
                    full_param_infos.append((module_name, m, n))
                    full_params.append(p)
        assert len(full_params) == len(params_to_shard_set), (
            "there are parameters in params_to_shard not belonging to this module.")
        self.full_params = full_params
        self.full_param_infos = full_param_infos
        self.shared_full_param_infos = shared_full_param_infos

        self.sharded_params = []
        for idx, (module_name, m, n) in enumerate(self.full_param_infos):
            p = self.full_params[idx]
            assert not hasattr(p, "_is_sharded")
            p_shard = nn.Parameter(self._get_shard(p).to(self.xla_device),
                                   requires_grad=p.requires_grad)
            p_shard._is_sharded = True
            p_shard._orig_size = p.size()
            p_shard._orig_name = f"{module_name}.{n}"
            p_shard._name = f"_fsdp_shard.{p_shard._orig_name}".replace(".",
                                                                         _FSDP_SHARD_SEPARATOR)
            self.register_parameter(p_shard._name, p_shard)
            self.sharded_params.append(p_shard)
            # The full parameter object autograd will see: born freed (on the device, holding
            # the placeholder), so the full data never has to fit on the device at once.
            full = nn.Parameter(torch.zeros(1, dtype=self.compute_dtype, device=self.xla_device),
                                requires_grad=p.requires_grad)
            _C._replace_data(full, self._dummy_data_placeholder)
            if isinstance(p, nn.Parameter) and hasattr(p, "_param_numels"):  # a FlatParameter
                full.__class__ = p.__class__
                full.__dict__.update({k: v for k, v in p.__dict__.items()})
            full._sharded_param = p_shard
            full._has_full_param = False
            self.full_params[idx] = full
            # Deregister the full parameter: only shards show in parameters()/state_dict().
            assert n in m._parameters
            m._parameters.pop(n)
            object.__setattr__(m, n, full)
        for _, _, m, n, shared_m, shared_n in self.shared_full_param_infos:
            assert n in m._parameters
            m._parameters.pop(n)
            object.__setattr__(m, n, getattr(shared_m, shared_n))
        assert len(self.sharded_params) == len(self.full_params)

    def _get_shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full tensor, flattened (or by rows) and zero-padded."""
        tensor = self._flatten_and_pad_to_world_size(tensor.detach(),
                                                     self.world_size * self._shard_size_multiple)
        local_size = tensor.size(0) // self.world_size
        begin = self.rank * local_size
        return tensor[begin:begin + local_size].clone()

    def _flatten_and_pad_to_world_size(self, tensor: torch.Tensor,
                                       world_size: int) -> torch.Tensor:
        """``tensor`` flattened (rows kept with ``shard_param_on_dim_0``) and zero-padded so
        that dim 0 divides by ``world_size``."""
        if self._shard_param_on_dim_0:
            if tensor.size(0) % world_size != 0:
                pad_size = world_size - tensor.size(0) % world_size
                tensor = F.pad(tensor, [0, 0] * (tensor.dim() - 1) + [0, pad_size])
            return tensor
        tensor = tensor.flatten()
        if tensor.numel() % world_size != 0:
            tensor = F.pad(tensor, [0, world_size - tensor.numel() % world_size])
        return tensor

    @torch.no_grad()
    def _cast_buffers(self, dtype: Optional[torch.dtype] = None, memo=None) -> None:
        """Moves buffers to the device in ``dtype`` (default ``buffer_dtype``); inner FSDP
        instances cast their own. The original dtype is kept for consolidation."""
        if memo is None:
            memo = set()
        for module in self.modules():
            if module is not self and isinstance(module, XlaFullyShardedDataParallel):
                module._cast_buffers(dtype=dtype, memo=memo)
            elif module not in memo:
                memo.add(module)
                for name, buf in module.named_buffers(recurse=False):
                    if buf is None:
                        continue
                    if torch.is_floating_point(buf):
                        orig_dtype = buf.dtype
                        cast_dtype = dtype or self.buffer_dtype
                        if orig_dtype != cast_dtype:
                            buf = buf.to(cast_dtype)
                            buf._orig_dtype = orig_dtype
                    if buf.device != self.xla_device:
                        orig = getattr(buf, "_orig_dtype", None)
                        buf = buf.to(self.xla_device)
                        if orig is not None:
                            buf._orig_dtype = orig
                    setattr(module, name, buf)

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

    # ------------------------------------------------------------------------------------------
    # Backward hooks.

    def _try_adding_to_backward_opt_barrier_lists(self, tensor: torch.Tensor) -> None:
        if id(tensor) not in self._backward_opt_barrier_tensor_ids:
            self._backward_opt_barrier_tensor_ids.add(id(tensor))
            self._backward_opt_barrier_tensors.append(tensor)

    def _clear_backward_opt_barrier_lists(self) -> None:
        self._backward_opt_barrier_tensors.clear()
        self._backward_opt_barrier_tensor_ids.clear()

    def _register_grad_opt_barrier_hooks(self, dependency_tensors: List[torch.Tensor]) -> None:
        if not torch.is_grad_enabled():
            return

        def _grad_opt_barrier_hook(t_grad: torch.Tensor):
            self._try_adding_to_backward_opt_barrier_lists(t_grad)
            self.optimization_barrier_op([t_grad])
            return t_grad

        for t in dependency_tensors:
            if t.requires_grad:
                t.register_hook(_grad_opt_barrier_hook)

    def _register_pre_backward_hooks(self, outputs: Any) -> Any:
        """Hooks on the outputs' gradients: gather the full parameters again (if freed after
        forward) before this module's backward starts."""
        if not torch.is_grad_enabled():
            return outputs
        if self._is_root:
            self._post_backward_callback_queued = False

        def _pre_backward_hook(t_grad: torch.Tensor) -> None:
            if self._is_root:
                self._queue_wait_for_post_backward()
            if self.optimization_barrier_in_backward:
                self._try_adding_to_backward_opt_barrier_lists(t_grad)
            if self.reshard_after_forward and not chkpt_status.in_chkpt_bwd:
                dependency_tensors = []
                if self.optimization_barrier_in_backward:
                    dependency_tensors = self._backward_opt_barrier_tensors
                self._rebuild_full_params(dependency_tensors=dependency_tensors,
                                          apply_opt_barrier=self.optimization_barrier_in_backward)
                self._clear_backward_opt_barrier_lists()
            if not self._pre_backward_hook_has_run:
                self._pre_backward_hook_has_run = True
                self.assert_state([TrainingState.IDLE, TrainingState.BACKWARD_PRE])
                for p, p_shard in zip(self.full_params, self.sharded_params):
                    if p.grad is not None:
                        assert p.grad.device == p_shard.device
                        assert p.grad.size() == p_shard._orig_size
            if self.training_state == TrainingState.IDLE:
                self.training_state = TrainingState.BACKWARD_PRE
            self.assert_state([TrainingState.BACKWARD_PRE, TrainingState.BACKWARD_POST])
            if self.optimization_barrier_in_backward:
                self._try_adding_to_backward_opt_barrier_lists(t_grad)
                self.optimization_barrier_op([t_grad])
            return t_grad

        registered = 0

        def _register_hook(t: torch.Tensor) -> torch.Tensor:
            # An output an inner FSDP already hooked is only hooked again if it is the first.
            nonlocal registered
            if t.requires_grad and (registered == 0 or
                                    id(t) not in self._output_pre_backward_hook_registered):
                t.register_hook(_pre_backward_hook)
                self._output_pre_backward_hook_registered.add(id(t))
                registered += 1
            return t

        return apply_to_tensors(_register_hook, outputs)

    def _register_post_backward_hooks(self) -> None:
        """A hook on each full parameter's gradient accumulator: fires once the parameter's
        gradient is complete, to reduce-scatter it into the shard."""
        if not torch.is_grad_enabled():
            return
        self._post_backward_hooks_to_call = 0
        for p in self.full_params:
            if p.requires_grad:
                if hasattr(p, "_shard_bwd_hook"):
                    continue
                p_tmp = p.expand_as(p)  # a grad_fn whose next function is p's accumulator
                assert p_tmp.grad_fn is not None
                grad_acc = p_tmp.grad_fn.next_functions[0][0]
                handle = grad_acc.register_hook(functools.partial(self._post_backward_hook, p))
                p._shard_bwd_hook = (grad_acc, handle)
                self._post_backward_hooks_to_call += 1

    @torch.no_grad()
    def _post_backward_hook(self, param: Parameter, *unused: Any) -> None:
        """``param.grad`` holds the full local gradient: free the full parameter, then
        reduce-scatter the gradient (divided by the pre/post factors) and accumulate this
        rank's slice into the sharded parameter's ``.grad``."""
        self.assert_state([TrainingState.BACKWARD_PRE, TrainingState.BACKWARD_POST])
        self.training_state = TrainingState.BACKWARD_POST
        self._post_backward_hooks_to_call -= 1
        if param.grad is None:
            if self._post_backward_hooks_to_call == 0:
                self.reduce_scatter_op.flush()
            return
        if param.grad.requires_grad:
            raise RuntimeError("FSDP only works with gradients that don't require gradients")
        grad = param.grad
        if self._require_backward_grad_sync or self.reshard_after_forward:
            # Inside no_sync() the full parameters stay (they do not change before the next
            # forward), unless resharding is asked for anyway.
            self._free_full_params([param], dependency_tensors=[grad],
                                   apply_opt_barrier=self.optimization_barrier_in_backward)
        if not self._require_backward_grad_sync:
            if self._post_backward_hooks_to_call == 0:
                self.reduce_scatter_op.flush()
            return
        predivide = 1.0
        if self.gradient_predivide_factor > 1:
            if grad.dtype == torch.float16 and not self.fp32_reduce_scatter:
                # fp16 sums travel as fp16: divide first, as XLA does, to stay in range.
                grad.div_(self.gradient_predivide_factor)
            else:
                # Folded into the reduce-scatter's scale: the same result (the factor is a
                # power of two and the sum runs in fp32), without a gradient-sized quotient.
                predivide = self.gradient_predivide_factor
        param.grad = None
        grad_flat = self._flatten_and_pad_to_world_size(
            grad, self.world_size * self._shard_size_multiple)
        if self.optimization_barrier_in_backward:
            self.optimization_barrier_op([grad_flat])
        if grad_flat.dtype != torch.float32 and self.fp32_reduce_scatter:
            grad_flat = grad_flat.to(torch.float32)

        def reduce_scatter_done(reduced_grad):
            if reduced_grad.dtype != torch.float32:
                reduced_grad = reduced_grad.to(torch.float32)
            if self.optimization_barrier_in_backward:
                self.optimization_barrier_op([reduced_grad])
            if self.gradient_postdivide_factor > 1:
                reduced_grad.div_(self.gradient_postdivide_factor)
            self._try_adding_to_backward_opt_barrier_lists(reduced_grad)
            p_shard = param._sharded_param
            if p_shard.grad is None:
                p_shard.grad = reduced_grad
            else:
                assert p_shard.grad.shape == reduced_grad.shape
                p_shard.grad += reduced_grad

        # Not grad_flat.detach(): in torch 1.13 a detached copy of a functional *view* (flatten
        # returns one when no padding is needed) of a tensor mutated in place (the predivide
        # above) regenerates from the view's base without the view, i.e. with the wrong shape.
        # Under no_grad, with a gradient that does not require grad, there is nothing to detach.
        self.reduce_scatter_op(grad_flat, reduce_scatter_done, predivide)
        if self._post_backward_hooks_to_call == 0:
            self.reduce_scatter_op.flush()

    def _queue_wait_for_post_backward(self) -> None:
        """Root only: run ``_wait_for_post_backward`` once the whole backward is done."""
        assert self._is_root
        if not self._post_backward_callback_queued:
            self.assert_state([TrainingState.IDLE])
            self._post_backward_callback_queued = True
            Variable._execution_engine.queue_callback(self._try_wait_for_post_backward)

    def _try_wait_for_post_backward(self) -> None:
        # Exceptions raised in an autograd callback lose their message; print it first.
        try:
            self._wait_for_post_backward()
        except Exception as e:
            print(f"Exception below occurred in post-backward (_debug_msg: {self._debug_msg}). "
                  f"This is often due to some inner FSDP modules not being used "
                  f"in an outer FSDP module's forward pass. Please make sure that all inner "
                  f"FSDP modules participate in the forward pass when using nested FSDP.\n"
                  f"{type(e).__name__}: {e}")
            raise

    @torch.no_grad()
    def _wait_for_post_backward(self) -> None:
        """End of backward (root): remove the hooks, free what is still gathered (frozen
        parameters, modules whose backward did not run), reset every instance's state."""
        assert self._is_root
        if any(p.requires_grad for p in self.full_params):
            self.assert_state(TrainingState.BACKWARD_POST)
        else:
            self.assert_state(TrainingState.BACKWARD_PRE)

        def _finalize_parameters(fsdp_module) -> None:
            frozen_params = []
            for p in fsdp_module.full_params:
                if not p.requires_grad:
                    frozen_params.append(p)
                if hasattr(p, "_shard_bwd_hook"):
                    assert len(p._shard_bwd_hook) == 2, len(p._shard_bwd_hook)
                    p._shard_bwd_hook[1].remove()
                    delattr(p, "_shard_bwd_hook")
            if frozen_params:
                fsdp_module._free_full_params(
                    frozen_params, apply_opt_barrier=self.optimization_barrier_in_backward)

        for m in self.modules():
            if not isinstance(m, XlaFullyShardedDataParallel):
                continue
            _finalize_parameters(m)
            if not m._pre_backward_hook_has_run:
                m.assert_state(TrainingState.IDLE)
                m._free_full_params(m.full_params,
                                    apply_opt_barrier=self.optimization_barrier_in_backward)
            elif any(p.requires_grad for p in m.parameters()):
                if any(p.requires_grad for p in m.full_params):
                    m.assert_state(TrainingState.BACKWARD_POST)
                else:
                    m.assert_state(TrainingState.BACKWARD_PRE)
            else:
                m.assert_state([TrainingState.BACKWARD_PRE, TrainingState.IDLE])
            m.training_state = TrainingState.IDLE
            m._pre_backward_hook_has_run = False
            if m._is_root:
                self._post_backward_callback_queued = False
                self._output_pre_backward_hook_registered.clear()
                if self.optimization_barrier_in_backward:
                    params_with_grad = [p for p in self._all_sharded_params
                                        if p.grad is not None]
                    self.optimization_barrier_op(params_with_grad +
                                                 [p.grad for p in params_with_grad] +
                                                 self._backward_opt_barrier_tensors)
                self._clear_backward_opt_barrier_lists()
        if self.sync_on_finalization:
            if self._debug_print:
                xm.master_print("`xm.mark_step()` called in FSDP _wait_for_post_backward "
                                f"(_debug_msg: {self._debug_msg})", flush=True)
            xm.mark_step()

    # ------------------------------------------------------------------------------------------
    # Gathering and freeing the full parameters.

    @torch.no_grad()
    def _rebuild_full_params(self, dependency_tensors: Optional[List[torch.Tensor]] = None,
                             apply_opt_barrier: bool = True) -> None:
        """All-gathers every freed full parameter from the shards (cast to compute_dtype
        first). Idempotent."""
        if self.has_full_params:
            return
        if dependency_tensors is None:
            dependency_tensors = []
        if apply_opt_barrier:
            self._apply_opt_barrier_to_params_and_tensors(
                [p for p in self.full_params if p._has_full_param], self.sharded_params,
                dependency_tensors)
        for p, p_shard in zip(self.full_params, self.sharded_params):
            if p._has_full_param:
                continue
            p_shard_data = p_shard.detach()
            if apply_opt_barrier:
                self.optimization_barrier_op([p_shard_data])
            if p_shard_data.dtype != self.compute_dtype:
                p_shard_data = p_shard_data.to(self.compute_dtype)
            if self._shard_param_on_dim_0 or self._shard_size_multiple == 1:
                p_padded = self.all_gather_op(p_shard_data, groups=self.sharding_groups)
            else:
                # Gathered as rows of _shard_size_multiple elements (XLA: TPU-friendly).
                p_shard_2d = p_shard_data.view(-1, self._shard_size_multiple)
                p_padded = self.all_gather_op(p_shard_2d,
                                              groups=self.sharding_groups).flatten()
            if apply_opt_barrier:
                self.optimization_barrier_op([p_padded])
            if self._shard_param_on_dim_0:
                full = p_padded[:p_shard._orig_size[0]]
            else:
                full = p_padded[:p_shard._orig_size.numel()].view(p_shard._orig_size)
            _C._replace_data(p, full)
            p._has_full_param = True
        self.has_full_params = True

    @torch.no_grad()
    def _free_full_params(self, params: Optional[List[Parameter]] = None,
                          dependency_tensors: Optional[List[torch.Tensor]] = None,
                          apply_opt_barrier: bool = True) -> None:
        """Points the full parameters (default: all of this instance's) at the placeholder,
        dropping their gathered values; in flattened mode also drops the views handed to the
        module (they would keep the gathered values alive)."""
        if params is None:
            full_params, sharded_params = self.full_params, self.sharded_params
        else:
            full_params = params
            sharded_params = [p._sharded_param for p in params if hasattr(p, "_sharded_param")]
        if dependency_tensors is None:
            dependency_tensors = []
        self.has_full_params = False
        freed_flat = False
        for p in full_params:
            if p._has_full_param:
                _C._replace_data(p, self._dummy_data_placeholder)
                p._has_full_param = False
                freed_flat = freed_flat or hasattr(p, "_param_numels")
        if freed_flat:
            self._fsdp_wrapped_module._release_param_views(self._dummy_data_placeholder)
        if apply_opt_barrier:
            self._apply_opt_barrier_to_params_and_tensors(
                [p for p in full_params if p._has_full_param], sharded_params,
                dependency_tensors)

    def _apply_opt_barrier_to_params_and_tensors(self, p_list, p_shard_list,
                                                 dependency_tensors) -> None:
        if len(p_list) + len(p_shard_list) + len(dependency_tensors) == 0:
            return
        self.optimization_barrier_op(p_list + p_shard_list + dependency_tensors)

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
