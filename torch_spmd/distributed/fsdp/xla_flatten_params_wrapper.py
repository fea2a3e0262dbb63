"""Flattening a module's parameters into one vector (PyTorch/XLA's
``XlaFlattenParamsWrapper``, itself from fairscale's ``FlattenParamsWrapper``).

``XlaFlattenParamsWrapper(module, param_list)`` concatenates each group of parameters in
``param_list`` into one ``FlatParameter`` (registered as ``flat_param_<i>``), removes the
originals from their modules and, before every forward, sets each original name to a view of
its slice of the flat vector. With ``flatten_parameters=True`` FSDP shards, gathers and
reduce-scatters that single vector instead of one tensor per parameter.

Views hold their own lazy values on the spmd device; ``_release_param_views`` drops them when
FSDP frees the full parameters, so that they neither keep the gathered values alive nor become
graph outputs at the next ``mark_step``.
"""
from contextlib import contextmanager
from itertools import chain
from typing import Any, Dict, Generator, Iterator, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn
from torch import Tensor


class FlatParameter(nn.Parameter):
    """A parameter made of several parameters, flattened and concatenated; ``get_param_views``
    cuts it back into views with the original shapes."""

    def __new__(cls, params: Sequence[nn.Parameter], requires_grad: bool = True):
        if not isinstance(params, (list, tuple)) or len(params) == 0:
            raise ValueError("An non-empty list or tuple argument is needed")
        if not all(isinstance(p, (nn.Parameter, Tensor)) for p in params):
            raise ValueError("List items need to be Parameter types")
        if any(isinstance(p, FlatParameter) for p in params):
            raise ValueError("Nesting FlatParameter is not supported")
        data = torch.cat([p.detach().reshape(-1) for p in params], 0)
        return super(FlatParameter, cls).__new__(cls, data, requires_grad=requires_grad)

    def __init__(self, params: Sequence[nn.Parameter], requires_grad: bool = True):
        self._param_numels = [p.numel() for p in params]
        assert self.numel() <= sum(self._param_numels)
        self._param_shapes = [p.size() for p in params]
        # Set by XlaFlattenParamsWrapper: (module name, module, param name) per parameter, and
        # the same for parameters shared with another module.
        self._param_infos: List[Tuple[str, nn.Module, str]] = []
        self._shared_param_infos: List[Tuple[str, str, nn.Module, str, nn.Module, str]] = []

    def get_param_views(self, external_data: Optional[Tensor] = None) -> Iterator[Tensor]:
        """Views of ``external_data`` (default: this parameter) with the original shapes."""
        data = external_data if external_data is not None else self
        if data.numel() != sum(self._param_numels):
            raise ValueError(f"Incorrect numel of supplied data: got {data.numel()} but "
                             f"expected {sum(self._param_numels)}")
        return (t.view(s) for t, s in zip(_split_tensor(data, self._param_numels),
                                           self._param_shapes))

    def metadata(self) -> Tuple[List[str], List[torch.Size], List[int]]:
        """(names, shapes, numels) of the original parameters."""
        names = [".".join([m, n]) if m else n for (m, _, n) in self._param_infos]
        return names, self._param_shapes, self._param_numels


class XlaFlattenParamsWrapper(nn.Module):
    """Wraps ``module`` and flattens the parameters of each group in ``param_list`` (default:
    all parameters, one group). ``state_dict()`` is the flat one unless
    ``auto_unflatten_state_dict``; FSDP uses the flat one and records the layout in its shard
    metadata for consolidation."""

    def __init__(self, module: nn.Module, param_list=None,
                 flat_param_names: Optional[List[str]] = None,
                 auto_unflatten_state_dict: Optional[bool] = True):
        super().__init__()
        self._fpw_module = module
        self.is_flattened = False
        if param_list is None:
            param_list = list(module.parameters())
        if len(param_list) > 0 and isinstance(param_list[0], nn.Parameter):
            param_list = [param_list]
        self.num_params_managed = 0
        self._param_sets = []
        overall: Set[nn.Parameter] = set()
        for p_list in param_list:
            p_set = set(p_list)
            self.num_params_managed += len(p_set)
            overall |= p_set
            # (module, name) pairs survive parameter objects being replaced later.
            named = {(m, n) for m in self.modules() for n, p in m.named_parameters(recurse=False)
                     if p in p_set}
            if named:
                self._param_sets.append(named)
        if len(overall) != self.num_params_managed:
            raise ValueError(
                f"Incorrect param groups {len(overall)} vs {self.num_params_managed}")
        if flat_param_names is None:
            flat_param_names = [f"{i}" for i, _ in enumerate(self._param_sets)]
        if len(flat_param_names) != len(self._param_sets):
            raise ValueError("Names and number of param lists must be equal")
        if len(flat_param_names) != len(set(flat_param_names)):
            raise ValueError("Each flat param must be given a unique name")
        self.flat_param_names = [f"flat_param_{n}" for n in flat_param_names]
        flat_params = []
        for p_set in self._param_sets:
            params, infos, shared_infos = self._init_flatten_params(p_set)
            flat_param = FlatParameter(params, params[0].requires_grad)
            flat_param._param_infos = infos
            flat_param._shared_param_infos = shared_infos
            flat_params.append(flat_param)
        self._flatten_params(flat_params)
        # state_dict keys without the "_fpw_module." level (and back when loading).
        self._register_state_dict_hook(_post_state_dict_hook)
        self._register_load_state_dict_pre_hook(_pre_load_state_dict_hook)
        self._auto_unflatten_state_dict = auto_unflatten_state_dict

    @property
    def module(self) -> nn.Module:
        return self._fpw_module

    @property
    def flat_params(self) -> List[nn.Parameter]:
        if not self.is_flattened:
            return []
        return [getattr(self, n) for n in self.flat_param_names]

    @property
    def flat_param(self) -> nn.Parameter:
        assert len(self.flat_params) == 1, (
            f"Incorrect access to flat_param: len(self.flat_params)={len(self.flat_params)}")
        return self.flat_params[0]

    def _init_flatten_params(self, p_set):
        params, infos, shared_infos, memo = [], [], [], {}
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if p is None or (m, n) not in p_set:
                    continue
                if p in memo:
                    mname, shared_m, shared_n = memo[p]
                    shared_infos.append((module_name, mname, m, n, shared_m, shared_n))
                else:
                    memo[p] = (module_name, m, n)
                    infos.append((module_name, m, n))
                    params.append(p)
        assert len({p.dtype for p in params}) == 1, "expects all parameters to have same dtype"
        assert len({p.requires_grad for p in params}) == 1, (
            "expects all parameters to have same requires_grad")
        return params, infos, shared_infos

    @property
    def _param_infos(self):
        return chain(*[p._param_infos for p in self.flat_params])

    @property
    def _shared_param_infos(self):
        return chain(*[p._shared_param_infos for p in self.flat_params])

    def _flatten_params(self, flat_params) -> None:
        assert not self.is_flattened
        self.is_flattened = True
        for n, flat_param in zip(self.flat_param_names, flat_params):
            self.register_parameter(n, flat_param)
        for _, m, n in self._param_infos:
            delattr(m, n)
        for _, _, m, n, _, _ in self._shared_param_infos:
            delattr(m, n)
        self._unflatten_params_as_views()

    def _unflatten_params(self, external_data=None) -> None:
        assert self.is_flattened or external_data is not None
        self.is_flattened = False
        ps = self.get_param_views(external_data)
        for (_, m, n), p in zip(self._param_infos, ps):
            if hasattr(m, n):
                delattr(m, n)
            m.register_parameter(n, nn.Parameter(p))
        for (_, _, m, n, shared_m, shared_n) in self._shared_param_infos:
            if hasattr(m, n):
                delattr(m, n)
            m.register_parameter(n, getattr(shared_m, shared_n))
        if hasattr(self._fpw_module, "_unflattened_param_views"):
            delattr(self._fpw_module, "_unflattened_param_views")
        for n in self.flat_param_names:
            delattr(self, n)

    def _unflatten_params_as_views(self) -> None:
        """Sets every original parameter name to a view of the flat parameter(s)."""
        assert self.is_flattened
        views = []
        for (_, m, n), p in zip(self._param_infos, self.get_param_views()):
            setattr(m, n, p)
            views.append(p)
        setattr(self._fpw_module, "_unflattened_param_views", views)
        for (_, _, m, n, shared_m, shared_n) in self._shared_param_infos:
            setattr(m, n, getattr(shared_m, shared_n))

    def _release_param_views(self, placeholder: Tensor) -> None:
        """Points every original parameter name at ``placeholder`` (the full flat parameters
        were freed). The views held the gathered values; the next forward recreates them."""
        if not self.is_flattened:
            return
        for _, m, n in self._param_infos:
            setattr(m, n, placeholder)
        for _, _, m, n, _, _ in self._shared_param_infos:
            setattr(m, n, placeholder)
        if hasattr(self._fpw_module, "_unflattened_param_views"):
            delattr(self._fpw_module, "_unflattened_param_views")

    @contextmanager
    def unflatten_params(self, flat_params: Optional[List[Tensor]] = None) -> Generator:
        """Temporarily restores the original parameters (optionally from ``flat_params``)."""
        assert flat_params is None or self.is_flattened, (
            "Unflattening with external flat_param requires current instance to be flattened")
        orig_flattened = self.is_flattened
        if orig_flattened:
            orig_flat_params = self.flat_params
            self._unflatten_params(flat_params)
        try:
            yield
        finally:
            if orig_flattened:
                self._flatten_params(orig_flat_params)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        return self.module.__getitem__(key)

    def state_dict(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        if self.is_flattened and self._auto_unflatten_state_dict:
            with self.unflatten_params():
                return super().state_dict(*args, **kwargs)
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        if self.is_flattened and "flat_param_0" not in state_dict:
            with self.unflatten_params():
                return super().load_state_dict(state_dict, strict)
        if "flat_param" in state_dict:
            state_dict["flat_param_0"] = state_dict.pop("flat_param")
        return super().load_state_dict(state_dict, strict)

    def forward(self, *inputs: Any, **kwinputs: Any) -> Any:
        self._unflatten_params_as_views()
        return self.module(*inputs, **kwinputs)

    def get_param_views(self, external_data_list=None) -> Iterator[Tensor]:
        params = self.flat_params
        if external_data_list is None:
            external_data_list = [None] * len(params)
        assert len(external_data_list) == len(params)
        return chain(*[p.get_param_views(d) for p, d in zip(params, external_data_list)])

    def metadata(self, flat_param_idx: int):
        """(names, shapes, numels) of the parameters in flat parameter ``flat_param_idx``."""
        return self.flat_params[flat_param_idx].metadata()


def _post_state_dict_hook(module, state_dict, prefix: str, *args: Any):
    replace_by_prefix_(state_dict, prefix + "_fpw_module.", prefix)
    return state_dict


def _pre_load_state_dict_hook(state_dict, prefix: str, *args: Any) -> None:
    replace_by_prefix_(state_dict, prefix, prefix + "_fpw_module.")
    flat_param_key = prefix + "_fpw_module.flat_param"
    for k in list(state_dict.keys()):
        if k.startswith(flat_param_key):
            last_part = k.split(".")[-1]
            assert last_part.startswith("flat_param_"), last_part
            replace_by_prefix_(state_dict, k, prefix + last_part)


def replace_by_prefix_(state_dict, old_prefix: str, new_prefix: str) -> None:
    """Renames (in place) every key starting with ``old_prefix`` to start with ``new_prefix``."""
    if old_prefix == new_prefix:
        raise ValueError("old_prefix and new_prefix must be distinct")
    for key in list(state_dict.keys()):
        if key.startswith(old_prefix):
            state_dict[new_prefix + key[len(old_prefix):]] = state_dict.pop(key)


def _split_tensor(t: Tensor, sizes: List[int]) -> List[Tensor]:
    """Consecutive slices of a 1-D tensor (slices rather than torch.split: plain view ops)."""
    out, b = [], 0
    for s in sizes:
        out.append(t[b:b + s])
        b += s
    return out
