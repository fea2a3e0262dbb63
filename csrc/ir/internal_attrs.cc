#include "ir/internal_attrs.h"

#include <string>

#include "core/error.h"
#include "ir/internal_ops.h"
#include "sharding/tiling.h"

namespace spmd::ir {

namespace {

int64_t IntOf(const std::string& name, const Arg& a) {
  SPMD_CHECK_VALUE(a.kind == Arg::Kind::kInt, "spmd op attribute ", name, " must be an int, got ",
                   a.ToString());
  return a.i;
}

const std::vector<int64_t>& IntsOf(const std::string& name, const Arg& a) {
  SPMD_CHECK_VALUE(a.kind == Arg::Kind::kIntList, "spmd op attribute ", name,
                   " must be an int list, got ", a.ToString());
  return a.ints;
}

double FloatOf(const std::string& name, const Arg& a) {
  SPMD_CHECK_VALUE(a.kind == Arg::Kind::kDouble || a.kind == Arg::Kind::kInt || a.is_scalar(),
                   "spmd op attribute ", name, " must be a number, got ", a.ToString());
  if (a.kind == Arg::Kind::kDouble) return a.d;
  if (a.kind == Arg::Kind::kInt) return static_cast<double>(a.i);
  return a.ScalarValue();
}

int64_t NonNegative(const std::string& name, int64_t v) {
  SPMD_CHECK_VALUE(v >= 0, "spmd op attribute ", name, " must be non-negative, got ", v);
  return v;
}

int64_t CheckDim(const char* what, int64_t dim, const Shape& input) {
  SPMD_CHECK_VALUE(dim >= 0 && dim < static_cast<int64_t>(input.size()), what, " ", dim,
                   " is out of range for a per-device input of shape ", ShapeToString(input));
  return dim;
}

}  // namespace

SpmdAttrs SpmdAttrs::Read(const OpInfo& op, const std::vector<Arg>& args) {
  SPMD_CHECK_VALUE(args.size() == op.args.size(), op.qualified, " expects ", op.args.size(),
                   " args, got ", args.size());
  SpmdAttrs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = op.args[i].name;
    const Arg& arg = args[i];
    if (name == "self") continue;
    if (name == "dim") a.dim = IntOf(name, arg);
    else if (name == "size") a.size = NonNegative(name, IntOf(name, arg));
    else if (name == "split_dim") a.split_dim = IntOf(name, arg);
    else if (name == "concat_dim") a.concat_dim = IntOf(name, arg);
    else if (name == "split_size") a.split_size = NonNegative(name, IntOf(name, arg));
    else if (name == "concat_size") a.concat_size = NonNegative(name, IntOf(name, arg));
    else if (name == "left") a.left = NonNegative(name, IntOf(name, arg));
    else if (name == "right") a.right = NonNegative(name, IntOf(name, arg));
    else if (name == "shift") a.shift = NonNegative(name, IntOf(name, arg));
    else if (name == "parts") a.parts = IntOf(name, arg);
    else if (name == "part") a.part = NonNegative(name, IntOf(name, arg));
    else if (name == "value") a.value = FloatOf(name, arg);
    else if (name == "axes") {
      for (int64_t axis : IntsOf(name, arg)) a.axes.push_back(static_cast<int>(axis));
    } else if (name == "op") {
      int64_t v = IntOf(name, arg);
      SPMD_CHECK_VALUE(v >= 0 && v <= static_cast<int64_t>(ReduceOp::kMin),
                       "spmd op attribute op must be a ReduceOp (0 sum, 1 max, 2 min), got ", v);
      a.op = static_cast<ReduceOp>(v);
    } else if (name == "pairs") {
      const std::vector<int64_t>& flat = IntsOf(name, arg);
      SPMD_CHECK_VALUE(flat.size() % 2 == 0,
                       "spmd op attribute pairs must list (source, destination) pairs, got ",
                       arg.ToString());
      for (size_t p = 0; p < flat.size(); p += 2) a.pairs.emplace_back(flat[p], flat[p + 1]);
    } else {
      SPMD_FAIL("internal error: ", op.qualified, " has an attribute ", name,
                " that SpmdAttrs does not know");
    }
  }
  return a;
}

Shape SpmdOutputShape(const OpInfo& op, const Shape& input, const SpmdAttrs& a, const Mesh& mesh) {
  const InternalOps& ops = InternalOps::Get();
  const int64_t k = AxesSize(mesh, a.axes);
  Shape out = input;
  if (&op == ops.all_reduce || &op == ops.collective_permute) {
    // same shape
  } else if (&op == ops.mask_pad) {
    CheckDim("dim", a.dim, input);
  } else if (&op == ops.all_gather) {
    out[CheckDim("dim", a.dim, input)] = a.size;
  } else if (&op == ops.reduce_scatter || &op == ops.shard_slice) {
    out[CheckDim("dim", a.dim, input)] = DimTiling(a.size, k).tile_size;
  } else if (&op == ops.ring_slice || &op == ops.ring_unroll) {
    const int64_t pieces = &op == ops.ring_slice ? k * a.parts : k;
    SPMD_CHECK_VALUE(a.parts >= 1 && a.part < a.parts, op.qualified, ": part ", a.part,
                     " of ", a.parts, " parts");
    SPMD_CHECK_VALUE(k > 0 && a.size % pieces == 0, op.qualified, " needs an extent divisible by ",
                     pieces, " pieces, got ", a.size);
    out[CheckDim("dim", a.dim, input)] = &op == ops.ring_slice ? a.size / pieces : a.size;
  } else if (&op == ops.all_to_all) {
    SPMD_CHECK_VALUE(a.split_dim != a.concat_dim, "all_to_all needs two different dims, got ",
                     a.split_dim, " twice");
    out[CheckDim("split_dim", a.split_dim, input)] = DimTiling(a.split_size, k).tile_size;
    out[CheckDim("concat_dim", a.concat_dim, input)] = a.concat_size;
  } else if (&op == ops.halo_exchange) {
    out[CheckDim("dim", a.dim, input)] += a.left + a.right;
  } else {
    SPMD_CHECK_VALUE(false, op.qualified, " is not a partitioner-inserted spmd op");
  }
  return out;
}

}  // namespace spmd::ir
