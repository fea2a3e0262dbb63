"""Sharding, gathering and freeing an FSDP instance's parameters (a mixin of
``XlaFullyShardedDataParallel``).

A parameter is flattened (or kept by rows with ``shard_param_on_dim_0``), zero-padded to a
multiple of ``world_size * _shard_size_multiple`` elements and cut into equal slices; the rank's
slice is a new ``nn.Parameter`` registered on the FSDP instance. The original parameter object
stays on its module, holding a one-element placeholder while "freed" and the all-gathered full
value while gathered: ``_C._replace_data`` swaps its data in place (also where a shape or
dtype change would make ``.data =`` refuse), so autograd, which saved that object, sees
whichever is current.
"""
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parameter import Parameter

from ... import _C
from .xla_flatten_params_wrapper import FlatParameter

# Sharded parameters are registered as "_fsdp_shard." + original name, with every "." replaced
# by this separator (module attribute names cannot contain dots).
_FSDP_SHARD_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"


class _ParamShardingMixin:
    """Creates the shards, gathers full parameters from them and frees them again."""

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
            if isinstance(p, FlatParameter):  # keep its layout and view-making methods
                full.__class__ = FlatParameter
                full.__dict__.update(p.__dict__)
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
            if module is not self and isinstance(module, _ParamShardingMixin):
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
                freed_flat = freed_flat or isinstance(p, FlatParameter)
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
