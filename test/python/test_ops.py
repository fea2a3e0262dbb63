"""Differential op coverage: every case runs one small program on CPU eager and on the spmd
device (lazily recorded, executed at sync) and compares outputs, the gradients of every input
that requires grad, and inputs mutated in place. Each case also names the ATen ops it is meant
to cover, and the test checks that the device really recorded (or eagerly ran) each of them.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Set

import pytest
import torch
import torch.nn.functional as F

from helpers import DEV, Host, Rng, check, check_factory, same_shape_dtype


@dataclass
class Case:
    name: str
    ops: List[str]          # base ATen op names that must show up on the device
    fn: Callable
    inputs: Callable        # Rng -> tuple of inputs (None: fn(device) is a factory program)
    kw: Dict = field(default_factory=dict)
    eager: Set[str] = field(default_factory=set)  # ops allowed to run eagerly on the host


CASES: List[Case] = []


def C(name, ops, fn, inputs, eager="", **kw):
    """A case. Every op runs lazily unless listed in `eager` (data-dependent output shapes)."""
    CASES.append(Case(name, ops.split(), fn, inputs, kw, set(eager.split())))


f32, f64, f16, bf16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
i32, i64, u8, b8 = torch.int32, torch.int64, torch.uint8, torch.bool

# ---- elementwise binary, broadcasting, scalars, type promotion --------------------------------
C("add_broadcast", "add", lambda a, b: a + b, lambda r: (r.g(3, 4), r.g(4)))
C("add_alpha", "add", lambda a, b: torch.add(a, b, alpha=2.5), lambda r: (r.g(3, 1), r.g(1, 4)))
C("sub_broadcast", "sub", lambda a, b: a - b, lambda r: (r.g(2, 3, 4), r.g(3, 1)))
C("rsub_scalar", "rsub", lambda a: 1.5 - a, lambda r: (r.g(3, 4),))
C("mul_broadcast", "mul", lambda a, b: a * b, lambda r: (r.g(2, 1, 4), r.g(3, 1)))
C("mul_pyscalar", "mul", lambda a: a * 2.5, lambda r: (r.g(3, 4),))
C("div", "div", lambda a, b: a / b, lambda r: (r.g(3, 4), r.g(4, low=0.5, high=2.0)))
C("div_pyscalar", "div", lambda a: a / 3, lambda r: (r.g(3, 4),))
C("div_floor", "div", lambda a, b: torch.div(a, b, rounding_mode="floor"),
  lambda r: (r(3, 4), r(3, 4, low=0.5, high=2.0)))
C("div_trunc_int", "div", lambda a, b: torch.div(a, b, rounding_mode="trunc"),
  lambda r: (r(3, 4, dtype=i64), r(3, 4, dtype=i64, low=1, high=4)))
C("true_div_int", "div", lambda a, b: a / b,
  lambda r: (r(3, 4, dtype=i64), r(3, 4, dtype=i64, low=1, high=4)))
C("pow_tensor", "pow", lambda a, b: a ** b, lambda r: (r.g(3, 4, low=0.5, high=2.0), r.g(4)))
C("pow_scalar_exp", "pow", lambda a: a ** 3, lambda r: (r.g(3, 4),))
C("pow_scalar_base", "pow", lambda a: 2 ** a, lambda r: (r.g(3, 4),))
C("pow_half_exp", "pow", lambda a: torch.pow(a, 0.5), lambda r: (r.g(3, 4, low=0.5, high=2.0),))
C("maximum_minimum", "maximum minimum", lambda a, b: (torch.maximum(a, b), torch.minimum(a, b)),
  lambda r: (r.g(3, 4), r.g(3, 4)))
C("atan2", "atan2", torch.atan2, lambda r: (r.g(3, 4), r.g(3, 4)))
C("remainder_fmod", "remainder fmod",
  lambda a, b: (torch.remainder(a, b), torch.fmod(a, b)),
  lambda r: (r(3, 4), r(3, 4, low=0.5, high=2.0)))
C("int_ops", "add mul remainder floor_divide",
  lambda a, b: (a + b, a * 3, a % b, a // b), lambda r: (r(3, 4, dtype=i64), r(4, dtype=i64, low=1, high=5)))
C("int_plus_float_scalar", "add", lambda a: a + 1.5, lambda r: (r(3, 4, dtype=i64),))
C("int_times_float_tensor", "mul", lambda a, b: a * b, lambda r: (r(3, 4, dtype=i32), r.g(3, 4)))
C("int32_plus_int64", "add", lambda a, b: a + b, lambda r: (r(3, 4, dtype=i32), r(4, dtype=i64)))
C("half_plus_float", "add", lambda a, b: a + b, lambda r: (r(3, 4, dtype=f16), r(3, 4)))
C("bool_plus_int", "add", lambda a, b: a + b, lambda r: (r(3, 4, dtype=b8), r(3, 4, dtype=i64)))
C("uint8_plus_int8_scalar", "add", lambda a: a + 3, lambda r: (r(3, 4, dtype=u8, low=0, high=200),))
C("float_plus_double_0dim_host", "add", lambda a, b: a + b,
  lambda r: (r.g(3, 4), Host(torch.tensor(2.5, dtype=f64))))
C("double_0dim_device_plus_float", "mul", lambda a, b: a * b,
  lambda r: (r.g(3, 4), torch.tensor(1.5, dtype=f64)))
C("wrapped_number_promotion", "mul add div",
  lambda h, i, b: (h * 2.5, h + 1, i * 2.5, i / 2, b + 1, b * 1.5, i + True, h / 3),
  lambda r: (r(3, 4, dtype=f16), r(3, 4, dtype=i32), r(3, 4, dtype=b8)))
C("zero_dim_device_promotion", "mul add",
  lambda a, s, i: (a * s, i + s, s * 3, a + i.sum()),
  lambda r: (r(3, 4, dtype=f16), torch.tensor(2.5, dtype=f64), r(3, dtype=i64)))
C("scalar_tensor_ops", "add mul",
  lambda a: (a.sum() * 2 + 1, torch.tensor(1.0, device=a.device) * a),
  lambda r: (r.g(3, 4),))
C("comparisons", "eq ne lt le gt ge",
  lambda a, b: (a == b, a != b, a < b, a <= 0.5, a > b, a >= b),
  lambda r: (r(3, 4, dtype=i64, low=0, high=3), r(4, dtype=i64, low=0, high=3)))
C("logical_bitwise", "logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not",
  lambda a, b, i, j: (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_not(a),
                      torch.logical_xor(a, b), a & b, i | j, i ^ j, ~i, ~a),
  lambda r: (r(3, 4, dtype=b8), r(3, 4, dtype=b8), r(3, 4, dtype=i64), r(3, 4, dtype=i64)))
C("where", "where", lambda c, a, b: torch.where(c, a, b),
  lambda r: (r(3, 4, dtype=b8), r.g(3, 4), r.g(4)))
C("where_scalar", "where", lambda c, a: torch.where(c, a, 0.0),
  lambda r: (r(3, 4, dtype=b8), r.g(3, 4)))
C("lerp", "lerp", lambda a, b: torch.lerp(a, b, 0.3), lambda r: (r.g(3, 4), r.g(3, 4)))
C("addcmul_addcdiv", "addcmul addcdiv",
  lambda a, b, c: (torch.addcmul(a, b, c, value=0.5), torch.addcdiv(a, b, c, value=2)),
  lambda r: (r.g(3, 4), r.g(3, 4), r.g(3, 4, low=0.5, high=2.0)))
C("clamp", "clamp", lambda a: (a.clamp(-0.5, 0.5), a.clamp(min=0.1), a.clamp(max=0.2)),
  lambda r: (r.g(4, 5),))
C("clamp_tensor", "clamp", lambda a, lo, hi: torch.clamp(a, lo, hi),
  lambda r: (r.g(4, 5), r(5, low=-1.0, high=-0.1), r(5, low=0.1, high=1.0)))
C("clamp_min_max", "clamp_min clamp_max",
  lambda a: (torch.clamp_min(a, 0.1), torch.clamp_max(a, -0.1)), lambda r: (r.g(4, 5),))

# ---- elementwise unary ----------------------------------------------------------------------
_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "atan": torch.atan, "sinh": torch.sinh,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sign": torch.sign, "frac": torch.frac, "square": torch.square,
}
for _name, _f in _UNARY.items():
    C(f"unary_{_name}", "pow" if _name == "square" else _name, _f, lambda r: (r.g(3, 5),))
_POSITIVE = {"sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "log": torch.log, "log2": torch.log2,
             "log1p": torch.log1p, "reciprocal": torch.reciprocal, "log10": torch.log10}
for _name, _f in _POSITIVE.items():
    C(f"unary_{_name}", _name, _f, lambda r: (r.g(3, 5, low=0.2, high=3.0),))
C("nan_to_num_isnan", "isnan nan_to_num",
  lambda a: (torch.isnan(a.log()), torch.nan_to_num(a.log(), nan=0.0)),
  lambda r: (r.g(3, 5),))

# ---- activations ----------------------------------------------------------------------------
C("relu", "relu", F.relu, lambda r: (r.g(4, 6),))
C("gelu", "gelu", F.gelu, lambda r: (r.g(4, 6),))
C("gelu_tanh", "gelu", lambda a: F.gelu(a, approximate="tanh"), lambda r: (r.g(4, 6),))
C("silu", "silu", F.silu, lambda r: (r.g(4, 6),))
C("leaky_relu", "leaky_relu", lambda a: F.leaky_relu(a, 0.1), lambda r: (r.g(4, 6),))
C("hardtanh", "hardtanh", lambda a: F.hardtanh(a, -0.5, 0.5), lambda r: (r.g(4, 6),))
C("relu6", "hardtanh", F.relu6, lambda r: (r.g(4, 6, low=-2.0, high=8.0),))
C("softplus", "softplus", lambda a: F.softplus(a, beta=2.0), lambda r: (r.g(4, 6),))
C("elu", "elu", F.elu, lambda r: (r.g(4, 6),))
C("mish_hardswish", "mish hardswish hardsigmoid",
  lambda a: (F.mish(a), F.hardswish(a), F.hardsigmoid(a)), lambda r: (r.g(4, 6),))
C("logsigmoid", "log_sigmoid_forward", F.logsigmoid, lambda r: (r.g(4, 6),))
C("relu_inplace", "relu", lambda a: F.relu(a.clone(), inplace=True), lambda r: (r.g(4, 6),))

# ---- reductions -----------------------------------------------------------------------------
C("sum_all", "sum", lambda a: a.sum(), lambda r: (r.g(3, 4, 5),))
C("sum_dims_keepdim", "sum", lambda a: (a.sum((0, 2)), a.sum(1, keepdim=True), a.sum(-1)),
  lambda r: (r.g(3, 4, 5),))
C("sum_int_dtype", "sum", lambda a: (a.sum(), a.sum(0), a.sum(dtype=torch.float32)),
  lambda r: (r(3, 4, dtype=i32),))
C("sum_bool", "sum", lambda a: (a.sum(), a.sum(1)), lambda r: (r(3, 4, dtype=b8),))
C("mean", "mean", lambda a: (a.mean(), a.mean(1), a.mean((0, 1), keepdim=True)),
  lambda r: (r.g(3, 4, 5),))
C("amax_amin", "amax amin", lambda a: (a.amax(1), a.amin((0, 2), keepdim=True), a.amax()),
  lambda r: (r.g(3, 4, 5),))
C("max_min_dim", "max min", lambda a: (a.max(1), a.min(0, keepdim=True)),
  lambda r: (r.g(3, 4, 5),))
# torch 1.13's evenly_distribute_backward (max()/min() without dim) and cumprod_backward call
# .item() unless the device is CUDA or the tensor subclass-like: a mid-backward sync is expected.
C("max_min_all", "max min", lambda a: (a.max(), a.min()), lambda r: (r.g(3, 4),), lazy=False)
C("argmax_argmin", "argmax argmin", lambda a: (a.argmax(1), a.argmin(), a.argmax(0, keepdim=True)),
  lambda r: (r(3, 4, 5),))
C("var_std", "var std",
  lambda a: (a.var(1), a.std(0, unbiased=False), a.var(), a.std((0, 2), keepdim=True)),
  lambda r: (r.g(3, 4, 5),))
C("var_mean", "var_mean", lambda a: torch.var_mean(a, 1), lambda r: (r.g(3, 4),))
C("norm", "linalg_vector_norm",
  lambda a: (a.norm(), a.norm(p=1, dim=1), torch.linalg.vector_norm(a, 3, dim=0)),
  lambda r: (r.g(3, 4),))
C("logsumexp", "logsumexp", lambda a: (a.logsumexp(1), a.logsumexp((0, 1), keepdim=True)),
  lambda r: (r.g(3, 4),))
# prod's backward looks for zeros with nonzero() (data-dependent shape): eager by design.
C("prod", "prod", lambda a: (a.prod(1), a.prod()), lambda r: (r.g(3, 4, low=0.5, high=1.5),),
  eager="nonzero")
C("cumsum_cumprod", "cumsum cumprod", lambda a: (a.cumsum(1), a.cumprod(0)),
  lambda r: (r.g(3, 4, low=0.5, high=1.5),), lazy=False)
C("cumsum_int", "cumsum", lambda a: a.cumsum(0), lambda r: (r(5, dtype=i32),))
C("all_any", "all any", lambda a: (a.all(), a.any(1), a.all(0)), lambda r: (r(3, 4, dtype=b8),))
C("softmax", "_softmax", lambda a: (F.softmax(a, -1), a.softmax(0)), lambda r: (r.g(3, 5),))
C("log_softmax", "_log_softmax", lambda a: F.log_softmax(a, 1), lambda r: (r.g(2, 5, 3),))
C("softmax_dtype", "_softmax _to_copy", lambda a: F.softmax(a, -1, dtype=torch.float64),
  lambda r: (r.g(3, 5),))

# ---- matmul family --------------------------------------------------------------------------
C("mm", "mm", torch.mm, lambda r: (r.g(3, 4), r.g(4, 5)))
C("bmm", "bmm", torch.bmm, lambda r: (r.g(2, 3, 4), r.g(2, 4, 5)))
C("matmul_broadcast", "mm _unsafe_view", lambda a, b: a @ b, lambda r: (r.g(2, 3, 4), r.g(4, 5)))
C("matmul_batched_broadcast", "bmm", lambda a, b: a @ b, lambda r: (r.g(2, 1, 3, 4), r.g(3, 4, 2)))
C("matmul_vec", "mv dot", lambda a, v, w: (a @ v, v @ w), lambda r: (r.g(3, 4), r.g(4), r.g(4)))
C("addmm", "addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
  lambda r: (r.g(5), r.g(3, 4), r.g(4, 5)))
C("addmv_outer", "addmv mul", lambda c, a, v: (torch.addmv(c, a, v), torch.outer(c, v)),
  lambda r: (r.g(3), r.g(3, 4), r.g(4)))
C("baddbmm", "baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5),
  lambda r: (r.g(2, 3, 5), r.g(2, 3, 4), r.g(2, 4, 5)))
C("einsum", "bmm permute", lambda a, b: (torch.einsum("bij,bjk->bik", a, b), torch.einsum("bij->j", a)),
  lambda r: (r.g(2, 3, 4), r.g(2, 4, 5)))
C("einsum_attention", "bmm", lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k),
  lambda r: (r.g(2, 2, 3, 4), r.g(2, 2, 5, 4)))
C("linear", "t addmm", F.linear, lambda r: (r.g(3, 4), r.g(5, 4), r.g(5)))
C("linear_nobias_3d", "t mm", lambda x, w: F.linear(x, w), lambda r: (r.g(2, 3, 4), r.g(5, 4)))

# ---- views, reshapes, indexing --------------------------------------------------------------
C("view_reshape", "view", lambda a: (a.view(4, 6), a.reshape(-1), a.view(2, 2, 6)),
  lambda r: (r.g(2, 3, 4),))
C("reshape_noncontig", "t clone view", lambda a: a.t().reshape(-1), lambda r: (r.g(3, 4),))
C("transpose_permute", "transpose permute", lambda a: (a.transpose(0, 2), a.permute(1, 2, 0)),
  lambda r: (r.g(2, 3, 4),))
C("t_contiguous", "t mul", lambda a: a.t().contiguous() * 2, lambda r: (r.g(3, 4),))
C("squeeze_unsqueeze", "squeeze unsqueeze",
  lambda a: (a.unsqueeze(0), a.unsqueeze(-1), a.squeeze(), a.squeeze(1)), lambda r: (r.g(3, 1, 4),))
C("flatten_unflatten", "view", lambda a: (a.flatten(), a.flatten(1), a.unflatten(1, (2, 2))),
  lambda r: (r.g(3, 4, 2),))
C("expand", "expand", lambda a: (a.expand(3, 4), a.expand_as(torch.empty(2, 3, 4))),
  lambda r: (r.g(1, 4),))
C("repeat", "repeat", lambda a: a.repeat(2, 1, 3), lambda r: (r.g(3, 4),))
C("getitem_int_slice", "select slice", lambda a: (a[1], a[:, 1:3], a[0, ::2], a[-1, -2]),
  lambda r: (r.g(4, 5),))
C("getitem_ellipsis_none", "unsqueeze select slice",
  lambda a: (a[..., 1], a[None, :, None], a[1, ..., None], a[:, None, 1:]),
  lambda r: (r.g(2, 3, 4),))
C("getitem_advanced", "index", lambda a, i: (a[i], a[:, i], a[i, i]),
  lambda r: (r.g(4, 5), torch.tensor([0, 2, 3, 2])))
C("getitem_list", "index", lambda a: (a[[1, 0]], a[:, [2, 0, 1]]), lambda r: (r.g(3, 4),))
C("narrow", "slice", lambda a: a.narrow(1, 1, 2), lambda r: (r.g(3, 4),))
C("index_select", "index_select", lambda a, i: (a.index_select(0, i), a.index_select(1, i)),
  lambda r: (r.g(4, 4), torch.tensor([3, 0, 0])))
C("gather", "gather", lambda a, i: torch.gather(a, 1, i),
  lambda r: (r.g(3, 4), torch.tensor([[0, 1], [3, 3], [2, 0]])))
C("scatter", "scatter", lambda a, i, s: (a.scatter(1, i, s), a.scatter(1, i, 2.5)),
  lambda r: (r.g(3, 4), torch.tensor([[0, 1], [3, 2], [2, 0]]), r.g(3, 2)))
C("scatter_add", "scatter_add", lambda a, i, s: a.scatter_add(0, i, s),
  lambda r: (r.g(3, 4), torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]), r.g(2, 4)))
C("index_add", "index_add", lambda a, i, s: a.index_add(0, i, s, alpha=2),
  lambda r: (r.g(4, 3), torch.tensor([0, 2, 0]), r.g(3, 3)))
C("index_put", "index_put", lambda a, i, v: a.index_put((i,), v),
  lambda r: (r.g(5, 3), torch.tensor([4, 0]), r.g(2, 3)))
C("index_put_accumulate", "index_put", lambda a, i, v: a.index_put((i,), v, accumulate=True),
  lambda r: (r.g(5, 3), torch.tensor([1, 1, 3]), r.g(3, 3)))
C("masked_fill", "masked_fill", lambda a, m: (a.masked_fill(m, -1.5), a.masked_fill(m, float("-inf")).exp()),
  lambda r: (r.g(3, 4), r(3, 4, dtype=b8)))
C("masked_fill_broadcast_mask", "masked_fill", lambda a, m: a.masked_fill(m, 0.0),
  lambda r: (r.g(3, 4), r(4, dtype=b8)))
C("diagonal", "diagonal", lambda a: (a.diagonal(), a.diagonal(1), torch.diag(a[0])),
  lambda r: (r.g(3, 3),))
C("cat_stack", "cat stack", lambda a, b: (torch.cat([a, b]), torch.cat([a, b], 1), torch.stack([a, b], 1)),
  lambda r: (r.g(2, 3), r.g(2, 3)))
C("cat_mixed_sizes", "cat", lambda a, b: torch.cat([a, b], 0), lambda r: (r.g(2, 3), r.g(4, 3)))
C("split_chunk_unbind", "split split_with_sizes unbind",
  lambda a: (a.split(2), a.split([1, 3], 1), a.chunk(2, 1), a.unbind(0)), lambda r: (r.g(4, 4),))
C("flip_roll", "flip roll", lambda a: (a.flip(0), a.flip((0, 1)), a.roll(1, 1), a.roll((1, -1), (0, 1))),
  lambda r: (r.g(3, 4),))
C("tril_triu", "tril triu", lambda a: (a.tril(), a.triu(1), a.tril(-1)), lambda r: (r.g(4, 4),))
C("movedim_unfold", "permute unfold", lambda a: (a.movedim(0, -1), a.unfold(1, 2, 1)),
  lambda r: (r.g(2, 4, 3),))

# ---- in-place writes, also through views ----------------------------------------------------
def _setitem_col(a):
    b = a.clone()
    b[:, 0] = 7
    return b


def _view_mul_(a):
    b = a.clone()
    b.view(-1).mul_(2)
    return b


def _t_add_(a):
    b = a.clone()
    b.t().add_(1)
    return b


def _diag_add_(a):
    b = a.clone()
    b.diagonal().add_(5)
    return b


def _slice_step_iadd(a, v):
    b = a.clone()
    b[1:3, ::2] += v
    return b


def _chained_view_write(a):
    b = a.clone()
    b[1][2:].zero_()
    b.t()[0].fill_(-1)
    b.unsqueeze(0).squeeze(0)[2, 1] = 3.5
    return b


def _setitem_tensor_index(a, i, v):
    b = a.clone()
    b[i] = v
    return b


def _setitem_mask(a, m):
    b = a.clone()
    b.masked_fill_(m, 0.25)
    return b


def _inplace_on_input(x):
    # x is a device leaf that does not require grad: mutate it through views directly.
    x[0, 1:] = 2
    x.t()[1].mul_(3)
    x.view(-1)[5] = -4
    return x.sum(0)


def _inplace_chain(a):
    b = a.clone()
    b.mul_(2).add_(1).clamp_(0.1, 3).sqrt_()
    return b


def _copy_into_view(a, s):
    b = a.clone()
    b[:, 1:3].copy_(s)
    return b


def _inplace_after_cast(a):
    b = a.double()
    b[0] = 1
    b.view(-1)[-1] = -2
    return b


def _outputs_alias(a):
    b = a.clone()
    v = b[1]
    v.mul_(10)  # b must see this
    return b, v


def _setitem_int_tensor(x):
    x[:, 0] = 7
    x[1] += 100
    return x * 1


C("setitem_column", "select select_scatter", _setitem_col, lambda r: (r.g(3, 4),))
C("view_mul_", "view mul", _view_mul_, lambda r: (r.g(3, 4),))
C("t_add_", "t add", _t_add_, lambda r: (r.g(3, 4),))
C("diagonal_add_", "diagonal add", _diag_add_, lambda r: (r.g(4, 4),))
C("slice_step_iadd", "slice add", _slice_step_iadd, lambda r: (r.g(4, 5), r.g(2, 3)))
C("chained_view_write", "select slice zero fill", _chained_view_write, lambda r: (r.g(3, 4),))
C("setitem_tensor_index", "index_put", _setitem_tensor_index,
  lambda r: (r.g(5, 3), torch.tensor([3, 1]), r.g(2, 3)))
C("masked_fill_", "masked_fill", _setitem_mask, lambda r: (r.g(3, 4), r(3, 4, dtype=b8)))
C("inplace_on_input", "select_scatter slice_scatter mul sum", _inplace_on_input, lambda r: (r(3, 4),))
C("inplace_chain", "mul add clamp sqrt", _inplace_chain, lambda r: (r.g(3, 4),))
C("copy_into_view", "slice slice_scatter", _copy_into_view, lambda r: (r.g(3, 4), r.g(3, 2)))
C("inplace_after_cast", "_to_copy select_scatter", _inplace_after_cast, lambda r: (r.g(3, 4),))
C("outputs_alias", "select mul", _outputs_alias, lambda r: (r.g(3, 4),))
C("setitem_int_tensor", "select_scatter add", _setitem_int_tensor, lambda r: (r(3, 4, dtype=i64),))

# ---- normalization, embedding, conv, pooling, dropout ---------------------------------------
C("layer_norm", "native_layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b),
  lambda r: (r.g(2, 3, 5), r.g(5), r.g(5)))
C("layer_norm_noaffine", "native_layer_norm", lambda x: F.layer_norm(x, (3, 5)),
  lambda r: (r.g(2, 3, 5),))


def _batch_norm_train(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)


def _batch_norm_eval(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=False)


C("batch_norm_train", "native_batch_norm", _batch_norm_train,
  lambda r: (r.g(4, 3, 2, 2), r.g(3), r.g(3), r(3), r(3, low=0.5, high=2.0)), grad_atol=1e-4)
C("batch_norm_eval", "native_batch_norm", _batch_norm_eval,
  lambda r: (r.g(4, 3, 2, 2), r.g(3), r.g(3), r(3), r(3, low=0.5, high=2.0)))
C("batch_norm_1d_train", "native_batch_norm", _batch_norm_train,
  lambda r: (r.g(6, 3), r.g(3), r.g(3), r(3), r(3, low=0.5, high=2.0)), grad_atol=1e-4)


def _batch_norm_16bit(training, params_dtype):
    """Batch norm of bf16 input with params in `params_dtype`: the output and the updated
    running statistics (the CPU kernel keeps its statistics in the parameters' dtype)."""
    def fn(x, w, b, rm, rv):
        rm, rv = rm.to(params_dtype), rv.to(params_dtype)
        out = F.batch_norm(x.to(bf16), rm, rv, w.to(params_dtype), b.to(params_dtype),
                           training=training, momentum=0.2)
        return out, rm, rv
    return fn


for _training in (True, False):
    for _params in (bf16, f32):
        C(f"batch_norm_bf16_{'train' if _training else 'eval'}_{str(_params)[6:]}_params",
          "native_batch_norm", _batch_norm_16bit(_training, _params),
          lambda r: (r(4, 3, 2, 2), r(3), r(3), r(3), r(3, low=0.5, high=2.0)),
          rtol=1.6e-2, atol=1e-2)


def _embedding_bag(mode, weights=False, last_offset=False):
    def fn(w, psw):
        idx = torch.tensor([1, 2, 4, 5, 4], device=w.device)
        offsets = torch.tensor([0, 3, 5] if last_offset else [0, 3], device=w.device)
        return F.embedding_bag(idx, w, offsets, mode=mode, include_last_offset=last_offset,
                               per_sample_weights=psw if weights else None)
    return fn


# The CPU kernel's auxiliary results (offset2bag, bag_size, max_indices) depend on the mode,
# the dtype and include_last_offset; the backward reads them.
for _mode, _weights, _last in (("sum", True, False), ("sum", False, True), ("mean", False, False),
                               ("mean", False, True), ("max", False, False)):
    C(f"embedding_bag_{_mode}{'_weights' if _weights else ''}{'_last_offset' if _last else ''}",
      "_embedding_bag", _embedding_bag(_mode, _weights, _last),
      lambda r: (r.g(6, 3), r.g(5)))
C("group_norm", "native_group_norm", lambda x, w, b: F.group_norm(x, 2, w, b),
  lambda r: (r.g(2, 4, 3, 3), r.g(4), r.g(4)), grad_atol=1e-4)
C("embedding", "embedding", lambda w, i: F.embedding(i, w),
  lambda r: (r.g(6, 3), torch.tensor([[0, 2, 5], [2, 2, 1]])))
C("embedding_padding_idx", "embedding", lambda w, i: F.embedding(i, w, padding_idx=2),
  lambda r: (r.g(6, 3), torch.tensor([[0, 2, 5], [2, 2, 1]])))
C("conv2d", "convolution", lambda x, w, b: F.conv2d(x, w, b),
  lambda r: (r.g(2, 3, 6, 6), r.g(4, 3, 3, 3), r.g(4)), grad_atol=1e-4)
C("conv2d_stride_pad_nobias", "convolution", lambda x, w: F.conv2d(x, w, stride=2, padding=1),
  lambda r: (r.g(2, 3, 7, 7), r.g(4, 3, 3, 3)), grad_atol=1e-4)
C("conv2d_groups_dilation", "convolution",
  lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2, groups=2),
  lambda r: (r.g(1, 4, 6, 6), r.g(6, 2, 3, 3), r.g(6)), grad_atol=1e-4)
C("conv2d_input_only_grad", "convolution", lambda x, w: F.conv2d(x, w, padding=1),
  lambda r: (r.g(1, 2, 5, 5), r(3, 2, 3, 3)), grad_atol=1e-4)
C("conv2d_weight_only_grad", "convolution", lambda x, w: F.conv2d(x, w, padding=1),
  lambda r: (r(1, 2, 5, 5), r.g(3, 2, 3, 3)), grad_atol=1e-4)
C("conv1d", "convolution", lambda x, w, b: F.conv1d(x, w, b, padding=1),
  lambda r: (r.g(2, 3, 8), r.g(4, 3, 3), r.g(4)), grad_atol=1e-4)
C("max_pool2d", "max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2),
  lambda r: (r.g(2, 3, 6, 6),))
C("max_pool2d_stride_pad", "max_pool2d_with_indices",
  lambda x: F.max_pool2d(x, 3, stride=2, padding=1), lambda r: (r.g(1, 2, 7, 7),))
C("avg_pool2d", "avg_pool2d", lambda x: (F.avg_pool2d(x, 2), F.avg_pool2d(x, 3, 2, 1)),
  lambda r: (r.g(2, 3, 6, 6),))
C("adaptive_avg_pool2d", "_adaptive_avg_pool2d mean",
  lambda x: (F.adaptive_avg_pool2d(x, (2, 3)), F.adaptive_avg_pool2d(x, 1)),
  lambda r: (r.g(2, 3, 6, 6),))
C("dropout_p0_train", "mul", lambda x: F.dropout(x, 0.0, training=True) * 2,
  lambda r: (r.g(3, 4),))
C("dropout_eval", "mul", lambda x: F.dropout(x, 0.5, training=False) * 2, lambda r: (r.g(3, 4),))

# ---- losses -------------------------------------------------------------------------------
C("mse_loss", "mse_loss", lambda a, b: (F.mse_loss(a, b), F.mse_loss(a, b, reduction="none")),
  lambda r: (r.g(3, 4), r.g(3, 4)))
C("l1_smooth_l1", "sgn smooth_l1_loss huber_loss",
  lambda a, b: (F.l1_loss(a, b), F.smooth_l1_loss(a, b, beta=0.5), F.huber_loss(a, b)),
  lambda r: (r.g(3, 4), r.g(3, 4)))
C("cross_entropy", "_log_softmax nll_loss_forward", F.cross_entropy,
  lambda r: (r.g(5, 4), torch.tensor([0, 3, 1, 1, 2])))
C("cross_entropy_ignore_index", "nll_loss_forward",
  lambda a, t: F.cross_entropy(a, t, ignore_index=1),
  lambda r: (r.g(5, 4), torch.tensor([0, 3, 1, 1, 2])))
# torch 1.13's label smoothing path uses masked_select (data-dependent shape): eager by design.
C("cross_entropy_label_smoothing", "nll_loss_forward",
  lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1, ignore_index=3),
  lambda r: (r.g(5, 4), torch.tensor([0, 3, 1, 1, 2])), eager="masked_select")
C("cross_entropy_label_smoothing_mean", "nll_loss_forward _log_softmax",
  lambda a, t: F.cross_entropy(a, t, label_smoothing=0.2),
  lambda r: (r.g(5, 4), torch.tensor([0, 3, 1, 1, 2])), eager="masked_select")
C("cross_entropy_probs_and_3d", "nll_loss2d_forward",
  lambda a, t, p: (F.cross_entropy(a, t), F.cross_entropy(a[:, :, 0], p)),
  lambda r: (r.g(2, 4, 3), torch.tensor([[0, 1, 3], [2, 2, 0]]), r(2, 4).softmax(1)))
C("nll_loss_weights", "nll_loss_forward",
  lambda a, t, w: (F.nll_loss(a.log_softmax(1), t, weight=w), F.nll_loss(a, t, reduction="sum")),
  lambda r: (r.g(5, 4), torch.tensor([0, 3, 1, 1, 2]), r(4, low=0.5, high=1.5)))
C("bce_with_logits", "binary_cross_entropy_with_logits",
  lambda a, t, pw: (F.binary_cross_entropy_with_logits(a, t),
                    F.binary_cross_entropy_with_logits(a, t, pos_weight=pw)),
  lambda r: (r.g(3, 4), r(3, 4, low=0.0, high=1.0), r(4, low=0.5, high=2.0)))
C("bce", "binary_cross_entropy", lambda a, t: F.binary_cross_entropy(a.sigmoid(), t),
  lambda r: (r.g(3, 4), r(3, 4, low=0.0, high=1.0)))
C("kl_div", "xlogy exp", lambda a, t: (F.kl_div(a.log_softmax(1), t, reduction="batchmean"),
                                    F.kl_div(a, t.log(), log_target=True, reduction="sum")),
  lambda r: (r.g(3, 4), r(3, 4).softmax(1)))

# ---- dtype casts --------------------------------------------------------------------------
C("casts_float", "_to_copy",
  lambda a: (a.half(), a.bfloat16(), a.double(), a.int(), a.long(), a.bool(), a.to(torch.float16)),
  lambda r: (r(3, 4, low=-3.0, high=3.0),))
C("casts_grad", "_to_copy", lambda a: (a.double() * 2).float() + a.half().float(),
  lambda r: (r.g(3, 4),), atol=1e-3)
C("casts_int", "_to_copy", lambda a: (a.float(), a.to(torch.int8), a.bool(), a.double()),
  lambda r: (r(3, 4, dtype=i64),))
C("half_math", "add mul", lambda a, b: (a * b + a).float(),
  lambda r: (r(3, 4, dtype=f16), r(3, 4, dtype=f16)))
C("bf16_matmul", "mm", lambda a, b: a.bfloat16() @ b.bfloat16(), lambda r: (r(3, 4), r(4, 2)))
C("type_as", "_to_copy", lambda a, b: a.type_as(b), lambda r: (r(3, dtype=i64), r(2)))

# ---- factories on the device --------------------------------------------------------------
C("zeros_ones_full", "zeros ones full",
  lambda d: (torch.zeros(2, 3, device=d), torch.ones(4, device=d, dtype=torch.int32),
             torch.full((2, 2), 3.5, device=d), torch.full((3,), 7, device=d)), None)
C("arange", "arange",
  lambda d: (torch.arange(4., device=d), torch.arange(5, device=d), torch.arange(1, 10, 2, device=d),
             torch.arange(0, 1, 0.25, device=d), torch.arange(3, device=d, dtype=torch.float32)), None)
C("eye_linspace", "eye linspace",
  lambda d: (torch.eye(3, device=d), torch.eye(2, 4, device=d), torch.linspace(0, 1, 5, device=d)),
  None)
C("empty_randn_shape_dtype", "empty randn rand randint",
  lambda d: (torch.empty(2, 3, device=d).zero_(), torch.randn(3, 4, device=d),
             torch.randn(2, device=d, dtype=torch.float64), torch.rand(5, device=d),
             torch.randint(0, 4, (3,), device=d)),
  None, compare=same_shape_dtype)
C("like_factories", "zeros_like ones_like full_like",
  lambda a: (torch.zeros_like(a), torch.ones_like(a, dtype=torch.int64), torch.full_like(a, 2.0),
             a.new_zeros(2), a.new_ones((1, 2)), a.new_full((2,), 4.0)),
  lambda r: (r(3, 4),))
C("factories_in_math", "arange mul add",
  lambda a: a + torch.arange(4, device=a.device) * 0.5 + torch.ones(4, device=a.device),
  lambda r: (r.g(3, 4),))
# (torch.tensor(data, device=...) is device data at once: its lift_fresh records nothing, as
# lift_fresh_copy and detach_copy do not; the product with it is what runs on the device.)
C("tensor_literal", "mul",
  lambda a: a * torch.tensor([1.0, 2.0, 3.0, 4.0], device=a.device), lambda r: (r.g(3, 4),))

# ---- sorting and selection ----------------------------------------------------------------
C("topk", "topk", lambda a: (a.topk(2), a.topk(2, dim=0, largest=False)), lambda r: (r.g(4, 5),))
C("sort_argsort", "sort", lambda a: (a.sort(1), a.sort(0, descending=True), a.argsort(1)),
  lambda r: (r.g(4, 5),))
C("kthvalue_median", "kthvalue median", lambda a: (a.kthvalue(2, 1), a.median(1)), lambda r: (r.g(3, 5),))


# ---- more in-place / aliasing semantics ---------------------------------------------------
def _detach_root_aliases(x):
    x.detach().mul_(2)          # clip_grad_norm_ does this to grads
    x.data.add_(1)
    return x * 1


def _detach_mutated_view(a):
    b = a.clone()
    v = b[1]
    v.mul_(10)
    return v.detach() + 0, b


def _view_after_base_mutation(a):
    b = a.clone()
    v = b[:, 1]
    b.mul_(2)                   # v must be regenerated from the mutated base
    v.add_(1)
    return b, v * 1


def _inplace_view_ops(a):
    b = a.clone()
    v = b[1:]
    v.t_()
    v.mul_(3)
    w = b[0]
    w.unsqueeze_(0)
    w.add_(1)
    return b, v * 1, w * 1


def _chunk_write(a):
    b = a.clone()
    b.chunk(2)[1].zero_()
    b.split(1, 1)[2].fill_(5)
    b.unbind(0)[0].neg_()
    return b


def _copy_from_host_into_view(a, h):
    b = a.clone()
    b[:, 0].copy_(h.to(torch.float64))
    b[1].copy_(torch.arange(4))
    return b


def _masked_fill_device_scalar(a, m, v):
    b = a.clone()
    b.masked_fill_(m, v)
    return b


def _index_put_accumulate_view(a, i, v):
    b = a.clone()
    b[1:].index_put_((i,), v, accumulate=True)
    return b


def _expand_then_inplace_on_copy(a):
    e = a.expand(3, 4).clone()
    e[0, 0] = 0
    return e


C("detach_root_aliases", "mul add", _detach_root_aliases, lambda r: (r(3, 4),))
C("detach_mutated_view", "mul select_scatter", _detach_mutated_view, lambda r: (r.g(3, 4),))
C("view_after_base_mutation", "mul select add", _view_after_base_mutation, lambda r: (r.g(3, 4),))
C("inplace_view_ops", "t unsqueeze mul add", _inplace_view_ops, lambda r: (r.g(3, 4),))
C("inplace_view_ops_values", "t unsqueeze mul add", _inplace_view_ops, lambda r: (r(3, 4),))
# (no grad: autograd forbids in-place writes to outputs of multi-view ops such as chunk)
C("chunk_split_unbind_write", "slice_scatter zero fill neg", _chunk_write, lambda r: (r(4, 4),))
C("copy_from_host_into_view", "select_scatter", _copy_from_host_into_view,
  lambda r: (r.g(3, 4), Host(torch.arange(3.0))))
C("masked_fill_device_scalar", "masked_fill", _masked_fill_device_scalar,
  lambda r: (r.g(3, 4), r(3, 4, dtype=b8), torch.tensor(-2.0)))
C("index_put_accumulate_view", "index_put slice_scatter", _index_put_accumulate_view,
  lambda r: (r.g(5, 3), torch.tensor([1, 1, 0]), r.g(3, 3)))
C("expand_clone_setitem", "expand clone", _expand_then_inplace_on_copy, lambda r: (r.g(1, 4),))

# ---- data-dependent output shapes (run eagerly on the host, by design) ---------------------
C("nonzero", "nonzero", lambda a: (a.nonzero(), torch.nonzero(a, as_tuple=True)),
  lambda r: (r(3, 4, dtype=i64, low=0, high=2),), eager="nonzero")
C("masked_select", "masked_select", lambda a, m: a.masked_select(m),
  lambda r: (r.g(3, 4), r(3, 4, dtype=b8)), eager="masked_select")
C("bool_mask_getitem", "index", lambda a, m: a[m] * 2, lambda r: (r.g(3, 4), r(3, 4, dtype=b8)),
  eager="nonzero index")
C("bool_mask_setitem", "index_put", lambda a, m: a.clone().index_put((m,), torch.tensor(0.5)),
  lambda r: (r.g(3, 4), r(3, 4, dtype=b8)), eager="nonzero index_put _index_put_impl")
C("where_one_arg", "nonzero", lambda a: torch.where(a > 0), lambda r: (r(3, 4),), eager="nonzero")
C("repeat_interleave_tensor", "repeat_interleave",
  lambda a, n: a.repeat_interleave(n, dim=0), lambda r: (r.g(3, 2), torch.tensor([1, 0, 2])),
  eager="repeat_interleave")

# ---- more ops -------------------------------------------------------------------------------
C("std_mean", "std_mean", lambda a: torch.std_mean(a, 0), lambda r: (r.g(4, 3),))
C("normalize_cosine", "linalg_vector_norm clamp_min div",
  lambda a, b: (F.normalize(a, dim=1), F.cosine_similarity(a, b)), lambda r: (r.g(3, 4), r.g(3, 4)))
C("pad_constant_reflect", "constant_pad_nd reflection_pad2d",
  lambda x: (F.pad(x, (1, 2, 0, 1), value=0.5), F.pad(x, (1, 1, 1, 1), mode="reflect")),
  lambda r: (r.g(1, 2, 4, 4),))
C("interpolate_nearest_bilinear", "upsample_nearest2d upsample_bilinear2d",
  lambda x: (F.interpolate(x, scale_factor=2, mode="nearest"),
             F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False)),
  lambda r: (r.g(1, 2, 3, 4),))
C("unfold_im2col", "im2col", lambda x: F.unfold(x, 2, stride=1), lambda r: (r.g(1, 2, 4, 4),))
C("pixel_shuffle", "pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), lambda r: (r.g(1, 8, 2, 3),))
C("pool1d", "max_pool2d_with_indices avg_pool2d _adaptive_avg_pool2d",
  lambda x: (F.max_pool1d(x, 2), F.avg_pool1d(x, 3, 1, 1), F.adaptive_avg_pool1d(x, 3)),
  lambda r: (r.g(2, 3, 6),))
C("adaptive_max_pool2d", "adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (2, 3)),
  lambda r: (r.g(1, 2, 5, 6),))
C("instance_norm", "native_batch_norm", lambda x: F.instance_norm(x), lambda r: (r.g(2, 3, 4, 4),),
  grad_atol=1e-4)
C("layer_norm_bf16", "native_layer_norm", lambda x: F.layer_norm(x.bfloat16(), (4,)).float(),
  lambda r: (r.g(3, 4),), atol=1e-2, rtol=1e-2)
C("softmax_masked_inf", "_softmax masked_fill",
  lambda a, m: F.softmax(a.masked_fill(m, float("-inf")), -1),
  lambda r: (r.g(3, 4), torch.tensor([[False, True, False, True]] * 3)))
C("addbmm_tensordot_trace", "addbmm mm trace",
  lambda c, a, b, m: (torch.addbmm(c, a, b), torch.tensordot(a, b, dims=([0, 2], [0, 1])),
                      torch.trace(m)),
  lambda r: (r.g(3, 5), r.g(2, 3, 4), r.g(2, 4, 5), r.g(4, 4)))
C("cross_kron", "linalg_cross mul",
  lambda a, b: (torch.cross(a, b, dim=1), torch.kron(a[0], b[0])), lambda r: (r.g(2, 3), r.g(2, 3)))
C("logaddexp_heaviside", "logaddexp heaviside",
  lambda a, b, c, d: (torch.logaddexp(a, b), torch.heaviside(c, d)),
  lambda r: (r.g(3, 4), r.g(3, 4), r(3, 4), r(4)))
C("int_unary", "abs neg sign clamp", lambda a: (a.abs(), -a, a.sign(), a.clamp(-2, 2), a.amax(1)),
  lambda r: (r(3, 4, dtype=i32),))
C("half_reductions", "sum mean", lambda a: (a.sum(1), a.mean(), a.float().sum()),
  lambda r: (r(3, 4, dtype=f16),), atol=1e-2, rtol=1e-3)
C("cummax_logcumsumexp", "cummax logcumsumexp",
  lambda a: (torch.cummax(a, 1), torch.logcumsumexp(a, 0)), lambda r: (r.g(3, 4),))
C("triu_tril_indices", "triu_indices tril_indices",
  lambda d: (torch.triu_indices(3, 4, device=d), torch.tril_indices(4, 3, 1, device=d)), None)
C("full_like_int_fill", "full",
  lambda d: (torch.full((2,), True, device=d), torch.full((2, 2), 3, device=d, dtype=torch.float64)),
  None)
# one_hot and gaussian_nll_loss read values with .item() (a sync) on 1.13.
C("one_hot", "zeros scatter", lambda t: F.one_hot(t, 5), lambda r: (torch.tensor([0, 3, 1, 4]),),
  lazy=False)
C("embedding_max_norm_free", "embedding", lambda w, i: F.embedding(i, w, scale_grad_by_freq=True),
  lambda r: (r.g(6, 3), torch.tensor([[0, 2, 5], [2, 2, 1]])))
C("multi_dot_chain", "mm", lambda a, b, c: torch.linalg.multi_dot([a, b, c]),
  lambda r: (r.g(2, 3), r.g(3, 4), r.g(4, 2)))
C("glu_prelu_selu", "glu _prelu_kernel elu",
  lambda a, w: (F.glu(a, -1), F.prelu(a, w), F.selu(a), F.celu(a)),
  lambda r: (r.g(3, 4), r.g(1)))
C("softsign_tanhshrink_threshold", "div tanh threshold",
  lambda a: (F.softsign(a), F.tanhshrink(a), F.threshold(a, 0.1, -1.0), F.hardshrink(a)),
  lambda r: (r.g(3, 4),))
C("margin_losses", "clamp_min",
  lambda a, b, t: (F.margin_ranking_loss(a, b, t), F.hinge_embedding_loss(a, t),
                   F.soft_margin_loss(a, t)),
  lambda r: (r.g(6), r.g(6), torch.tensor([1., -1., 1., 1., -1., -1.])))
C("poisson_gaussian_nll", "exp log",
  lambda a, t, v: (F.poisson_nll_loss(a, t), F.gaussian_nll_loss(a, t, v)),
  lambda r: (r.g(3, 4), r(3, 4, low=0.0, high=3.0), r(3, 4, low=0.5, high=2.0)), lazy=False)


# ---- autograd patterns, empty and 0-dim tensors --------------------------------------------
def _double_backward(x, w):
    y = (x * w).tanh().sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return (g ** 2).sum() + y


def _grad_hook(x):
    x = x * 1
    x.register_hook(lambda g: g * 3)
    return x.pow(2)


def _manual_sgd(w, x):
    loss = (x @ w).pow(2).mean()
    (g,) = torch.autograd.grad(loss, w)
    with torch.no_grad():
        w2 = w.detach().clone()
        w2 -= 0.1 * g
        w2[:, 0] = 0
    return w2, loss.detach()


def _detach_inplace_nonleaf(a):
    b = a * 2
    c = b + 1
    b.detach_()
    return b, c


C("double_backward", "tanh mul pow", _double_backward, lambda r: (r.g(3, 4), r.g(3, 4)),
  grad_atol=1e-5)
C("tensor_grad_hook", "pow mul", _grad_hook, lambda r: (r.g(3, 4),))
C("manual_sgd_no_grad_update", "mm sub select_scatter", _manual_sgd, lambda r: (r.g(4, 3), r(5, 4)))
C("detach_inplace_nonleaf", "mul add", _detach_inplace_nonleaf, lambda r: (r.g(3, 4),))
C("empty_tensors", "cat sum mean add",
  lambda a, e: (torch.cat([a, e]), e.sum(), e.sum(0), a[:0] + 1, e.mean(1), torch.cat([e, e], 1)),
  lambda r: (r.g(2, 3), r.g(0, 3)))
C("zero_dim_tensors", "mul add sum",
  lambda a, b: (a * b, (a + 1).sum(), a.unsqueeze(0), torch.stack([a, b])),
  lambda r: (r.g(), r.g()))


def _ids(cases):
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    return names


# Known torch limitations, each checked to still fail (strict): if torch fixes one, the case
# passes and this list must shrink.
TORCH_LIMITS = {
    # Autograd through an in-place *view* op (t_, unsqueeze_) applied to a view, on a device
    # without as_strided (functional tensors, as XLA's): torch 2.x does not add the in-place
    # view to the view's replay function (pytorch/pytorch#49825), so backward fails with a
    # shape error. The values are right (inplace_view_ops_values); torch 1.13 replayed views
    # with as_strided and did not hit this.
    "inplace_view_ops": "pytorch/pytorch#49825: in-place view ops on views under view replay",
}


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_op(case, request):
    if case.name in TORCH_LIMITS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=TORCH_LIMITS[case.name]))
    if case.inputs is None:
        # A factory program: the same code with the device as its argument.
        result = check_factory(case.fn, **case.kw)
    else:
        result = check(case.fn, *case.inputs(Rng(case.name)), **case.kw)
    missing = set(case.ops) - result.ops
    assert not missing, (f"ops not seen on the device: {sorted(missing)}; "
                         f"seen: {sorted(result.ops)}")
    unexpected = result.eager - case.eager
    assert not unexpected, f"ran eagerly on the host instead of being recorded: {unexpected}"


def test_op_coverage():
    """At least 80 distinct ATen ops are covered by the cases above."""
    ops = {op for c in CASES for op in c.ops}
    assert len(ops) >= 80, sorted(ops)



def test_histc_counts_integers_as_cuda_does():
    # CPU's histc takes floating inputs only, CUDA's integers too (Hugging Face's MoE routing
    # counts tokens per expert with histc on int32 ids off CPU): the device counts them, in the
    # input's dtype; floating input is unchanged.
    import numpy as np
    import torch_spmd.distributed.spmd as xs
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (40,), generator=g)
    want = torch.histc(ids.float(), bins=4, min=0, max=3)
    for dtype in (torch.int32, torch.int64, torch.uint8):
        x = ids.to(dtype).to(DEV)
        mesh = xs.Mesh(np.arange(8), (8,), ("x",))
        xs.mark_sharding(x, mesh, ("x",))
        got = torch.histc(x, bins=4, min=0, max=3).cpu()
        assert got.dtype == dtype and torch.equal(got, want.to(dtype)), (dtype, got)
    floats = torch.rand(30, generator=g)
    torch.testing.assert_close(torch.histc(floats.to(DEV), bins=5).cpu(), torch.histc(floats, bins=5))
