// The local ops fused attention's lowerings emit: the kernel with its mask replaced, and a
// causal mask of global positions (rules/attention.h).
#include <limits>

#include "ir/internal_ops.h"
#include "partition/rules/attention.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

using ir::Arg;
using ir::ArgType;

std::vector<LocalValue> EmitAttention(LocalBuilder& b, const AttentionNode& a,
                                      std::vector<ir::Value> inputs, bool is_causal,
                                      const LocalValue* mask, const std::vector<TensorType>& outs,
                                      const std::vector<Sharding>& layouts,
                                      const std::vector<TensorType>& globals) {
  const ir::Node& node = b.node();
  std::vector<Arg> args = b.WithSlots(node.args());
  args.at(ArgIndex(node, "is_causal")) = Arg::Bool(is_causal);
  const int mask_arg = ArgIndex(node, "attn_mask");
  if (mask) {
    if (a.mask >= 0) {
      inputs[a.mask] = mask->value;
    } else {
      inputs.push_back(mask->value);
      args.at(mask_arg) = Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
    }
  }
  ir::NodePtr n = b.program().Emit(node.op(), std::move(inputs), std::move(args), outs, layouts);
  std::vector<LocalValue> results;
  for (size_t o = 0; o < outs.size(); ++o)
    results.push_back(LocalValue{ir::Value{n, static_cast<int>(o)}, layouts[o], globals[o]});
  return results;
}

LocalValue CausalMask(LocalBuilder& b, const LocalValue& q_rows, const LocalValue& k_cols,
                      DType dtype) {
  static const std::vector<ir::ArgSchema> where = {
      {"condition", ArgType::kTensor}, {"self", ArgType::kScalar}, {"other", ArgType::kScalar}};
  const LocalValue kept = AtLeast(b, q_rows, k_cols);
  const TensorType additive{DType::kFloat32, kept.local_shape()};
  const LocalValue fp32 = b.EmitOp("aten::where.Scalar", where, {kept.value},
                                   {Arg::Tensor(0), Arg::ScalarDouble(0.0),
                                    Arg::ScalarDouble(-std::numeric_limits<double>::infinity())},
                                   additive, kept.layout, additive);
  const LocalValue mask = dtype == DType::kFloat32 ? fp32 : CastTo(b, fp32, dtype);
  // A real pod's flash kernel masks its tiles by their offsets: the mask is never held.
  for (const LocalValue* v : {&kept, &fp32, &mask}) b.program().MarkMadeByReader(v->value.node.get());
  return mask;
}

}  // namespace spmd::partition
