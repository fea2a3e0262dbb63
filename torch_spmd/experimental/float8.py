"""Float8 training without torchao: ``Float8Linear`` computes a linear layer as torchao's
``Float8Linear`` does with dynamic scaling (each scale from an amax), three ``torch._scaled_mm``
per step (the output, the input's gradient, the weight's), in one of torchao's recipes:

- ``"tensorwise"`` (the default): one scale per tensor; E4M3 for the input and the weight,
  E5M2 for the gradient;
- ``"rowwise"``: a scale per row of each matmul operand along its contraction (the input per
  row, the weight per output feature; backward, the gradient per row and the weight per input
  feature, and for the weight's gradient the gradient per output feature and the input per
  input feature), every cast E4M3, each recast from the high-precision tensors.

``convert_to_float8_training`` swaps a model's ``nn.Linear`` layers for it, as
``torchao.float8.convert_to_float8_training`` does. Under FSDP the weight's cast runs on its
shards (its amax reduced across them), so its all-gathers move FP8 bytes: what torchao's
``enable_fsdp_float8_all_gather`` asks for.

For planning a Float8 run (plan mode prices the FP8 matmuls at the chip's FP8 rate) and for
training where torchao is not installed. With torchao installed, its own modules run on the
spmd device through the same ``_scaled_mm`` rule. Needs a torch whose CPU build has
``torch._scaled_mm`` for real (not planned) steps.
"""
from typing import Callable, Optional

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _to_float8(t: torch.Tensor, dtype: torch.dtype):
    """``t`` scaled into ``dtype``'s range by its amax, and the inverse scale."""
    amax = t.abs().max().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).to(dtype), scale.reciprocal()


class _Float8Matmul(torch.autograd.Function):
    """``x @ w.t()`` for 2-D ``x`` [m, k] and ``w`` [n, k], in FP8."""

    @staticmethod
    def forward(ctx, x, w, out_dtype):
        x8, sx = _to_float8(x, E4M3)
        w8, sw = _to_float8(w, E4M3)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.dtypes = (x.dtype, w.dtype)
        return torch._scaled_mm(x8, w8.t(), sx, sw, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = _to_float8(grad, E5M2)
        grad_x = torch._scaled_mm(g8, w8.to(E5M2), sg, sw, out_dtype=ctx.dtypes[0])
        grad_w = torch._scaled_mm(g8.t().contiguous(), x8.to(E5M2), sg, sx,
                                  out_dtype=ctx.dtypes[1])
        return grad_x, grad_w, None


def _to_float8_axiswise(t: torch.Tensor, dtype: torch.dtype, dim: int):
    """``t`` scaled into ``dtype``'s range by the amax of each of its slices along ``dim``
    (kept, of size 1), and the float32 inverse scales."""
    amax = t.abs().amax(dim=dim, keepdim=True).float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).to(dtype), scale.reciprocal()


class _Float8MatmulRowwise(torch.autograd.Function):
    """``x @ w.t()`` for 2-D ``x`` [m, k] and ``w`` [n, k], in FP8 with rowwise scales."""

    @staticmethod
    def forward(ctx, x, w, out_dtype):
        x8, sx = _to_float8_axiswise(x, E4M3, -1)   # [m, 1]
        w8, sw = _to_float8_axiswise(w, E4M3, -1)   # [n, 1]
        ctx.save_for_backward(x, w)
        return torch._scaled_mm(x8, w8.t(), sx, sw.t(), out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g8, sg = _to_float8_axiswise(grad, E4M3, -1)      # [m, 1]: along n
        wc8, swc = _to_float8_axiswise(w, E4M3, 0)        # [1, k]: along n
        grad_x = torch._scaled_mm(g8, wc8, sg, swc, out_dtype=x.dtype)
        gt8, sgt = _to_float8_axiswise(grad.t(), E4M3, -1)  # [n, 1]: along m
        xc8, sxc = _to_float8_axiswise(x, E4M3, 0)          # [1, k]: along m
        grad_w = torch._scaled_mm(gt8.contiguous(), xc8, sgt, sxc, out_dtype=w.dtype)
        return grad_x, grad_w, None


RECIPES = {"tensorwise": _Float8Matmul, "rowwise": _Float8MatmulRowwise}


def _recipe(recipe: str):
    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe must be one of {', '.join(map(repr, RECIPES))}, "
                         f"got {recipe!r}")
    return RECIPES[recipe]


def float8_matmul(x: torch.Tensor, w: torch.Tensor, out_dtype: Optional[torch.dtype] = None,
                  recipe: str = "tensorwise") -> torch.Tensor:
    """``x @ w.t()`` in FP8 with dynamic scaling (``recipe``: ``"tensorwise"`` or
    ``"rowwise"``), differentiable in both; ``x`` may have leading batch dims. ``out_dtype``:
    the result's (default ``x``'s)."""
    fn = _recipe(recipe)
    lead = x.shape[:-1]
    out = fn.apply(x.reshape(-1, x.shape[-1]), w, out_dtype or x.dtype)
    return out.reshape(*lead, w.shape[0])


class Float8Linear(nn.Linear):
    """``nn.Linear`` whose matmul runs in FP8 (``float8_matmul`` in its ``recipe``); the bias
    is added in the output dtype. Weights stay in their own dtype (the master copy)."""

    recipe = "tensorwise"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = float8_matmul(x, self.weight, recipe=self.recipe)
        return y + self.bias if self.bias is not None else y

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str = "tensorwise") -> "Float8Linear":
        _recipe(recipe)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.recipe = recipe
        return new


def convert_to_float8_training(
        module: nn.Module,
        module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
        recipe: str = "tensorwise") -> nn.Module:
    """Swaps every ``nn.Linear`` of ``module`` (for which ``module_filter_fn(linear, fqn)`` is
    true, when given) for a ``Float8Linear`` in ``recipe`` sharing its parameters, in place;
    returns ``module``. torchao's function of the same name does the same with its own module
    (its recipe from ``Float8LinearConfig.from_recipe_name``)."""
    _recipe(recipe)
    for fqn, child in list(module.named_modules()):
        for name, sub in list(child.named_children()):
            full = f"{fqn}.{name}" if fqn else name
            if type(sub) is nn.Linear and (module_filter_fn is None or module_filter_fn(sub, full)):
                setattr(child, name, Float8Linear.from_linear(sub, recipe))
    return module
