// Golden factor notation of the sharding rules (partition/rules/notation.h), one table row per
// op family: what each rule says about an op, checked as data and without torch. A change to a
// rule's factors, kinds or flags shows up here as a one-line diff to review.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph_test_util.h"
#include "partition/rules/notation.h"
#include "partition/rules/rule.h"

namespace spmd::partition {
namespace {

using ir::Arg;
using ir::ArgType;

struct Case {
  std::string op;                    // qualified name
  std::vector<ir::ArgSchema> schema;  // the tensor and attribute arguments the rule reads
  std::vector<TensorType> inputs;
  std::vector<Arg> args;
  std::vector<TensorType> outputs;
  std::string golden;
};

TensorType I64(Shape shape) { return TensorType{DType::kInt64, std::move(shape)}; }

std::string NotationOf(const Case& c) {
  std::vector<ir::Value> inputs;
  for (const TensorType& t : c.inputs) inputs.push_back(testing::Param(t));
  const ir::OpInfo* op = ir::InternOp(c.op, c.schema, static_cast<int>(c.outputs.size()));
  ir::NodePtr node = ir::MakeNode(op, inputs, c.args, c.outputs);
  RulePtr rule = GetRule(*node);
  return rule ? FactorNotation(*rule) : "no rule";
}

const ir::ArgSchema kSelf{"self", ArgType::kTensor};

std::vector<Case> Cases() {
  using testing::F32;
  const Arg one = Arg::ScalarInt(1);
  return {
      {"aten::mm", {kSelf, {"mat2", ArgType::kTensor}}, {F32({4, 8}), F32({8, 5})},
       {Arg::Tensor(0), Arg::Tensor(1)}, {F32({4, 5})},
       "([i, j], [j, k]) -> ([i, k]) {i=4, j=8, k=5} reduction={j} sums={j}"},
      {"aten::bmm", {kSelf, {"mat2", ArgType::kTensor}}, {F32({2, 4, 8}), F32({2, 8, 5})},
       {Arg::Tensor(0), Arg::Tensor(1)}, {F32({2, 4, 5})},
       "([i, j, k], [i, k, l]) -> ([i, j, l]) {i=2, j=4, k=8, l=5} reduction={k} sums={k}"},
      {"aten::addmm",
       {kSelf, {"mat1", ArgType::kTensor}, {"mat2", ArgType::kTensor}, {"beta", ArgType::kScalar},
        {"alpha", ArgType::kScalar}},
       {F32({5}), F32({4, 8}), F32({8, 5})},
       {Arg::Tensor(0), Arg::Tensor(1), Arg::Tensor(2), one, one}, {F32({4, 5})},
       "([k], [i, j], [j, k]) -> ([i, k]) {i=4, j=8, k=5} reduction={j}"},
      {"aten::add.Tensor", {kSelf, {"other", ArgType::kTensor}, {"alpha", ArgType::kScalar}},
       {F32({4, 5}), F32({5})}, {Arg::Tensor(0), Arg::Tensor(1), one}, {F32({4, 5})},
       "([i, j], [j]) -> ([i, j]) {i=4, j=5} additive elementwise"},
      {"aten::sum.dim_IntList",
       {kSelf, {"dim", ArgType::kIntList, true}, {"keepdim", ArgType::kBool},
        {"dtype", ArgType::kScalarType, true}},
       {F32({4, 6, 5})}, {Arg::Tensor(0), Arg::IntList({1}), Arg::Bool(false), Arg::None()},
       {F32({4, 5})},
       "([i, j, k]) -> ([i, k]) {i=4, j=6, k=5} reduction={j} sums={j} linear={0}"},
      {"aten::mean.dim",
       {kSelf, {"dim", ArgType::kIntList, true}, {"keepdim", ArgType::kBool},
        {"dtype", ArgType::kScalarType, true}},
       {F32({4, 6})}, {Arg::Tensor(0), Arg::IntList({0}), Arg::Bool(false), Arg::None()},
       {F32({6})},
       "([i, j]) -> ([j]) {i=4, j=6} reduction={i} linear={0}"},
      {"aten::amax", {kSelf, {"dim", ArgType::kIntList}, {"keepdim", ArgType::kBool}},
       {F32({4, 6})}, {Arg::Tensor(0), Arg::IntList({1}), Arg::Bool(true)}, {F32({4, 1})},
       "([i, j]) -> ([i, _]) {i=4, j=6} reduction={j(max)}"},
      {"aten::_softmax", {kSelf, {"dim", ArgType::kInt}, {"half_to_float", ArgType::kBool}},
       {F32({4, 6})}, {Arg::Tensor(0), Arg::Int(1), Arg::Bool(false)}, {F32({4, 6})},
       "([i, j]) -> ([i, j]) {i=4, j=6} couples_tiles={j} yields={j}"},
      {"aten::gelu", {kSelf, {"approximate", ArgType::kString}}, {F32({4, 6})},
       {Arg::Tensor(0), Arg::String("none")}, {F32({4, 6})},
       "([i, j]) -> ([i, j]) {i=4, j=6} elementwise"},
      {"aten::view_copy", {kSelf, {"size", ArgType::kIntList}}, {F32({2, 4, 6})},
       {Arg::Tensor(0), Arg::IntList({8, 6})}, {F32({8, 6})},
       "([i, j, k]) -> ([ij, k]) {i=2, j=4, k=6} linear={0} reads_strides view=reshape"},
      {"aten::t_copy", {kSelf}, {F32({4, 6})}, {Arg::Tensor(0)}, {F32({6, 4})},
       "([i, j]) -> ([j, i]) {i=4, j=6} linear={0} view=permute"},
      {"aten::select_copy.int", {kSelf, {"dim", ArgType::kInt}, {"index", ArgType::kInt}},
       {F32({4, 6})}, {Arg::Tensor(0), Arg::Int(0), Arg::Int(1)}, {F32({6})},
       "([i, j]) -> ([j]) {i=4, j=6} need_replication={i} linear={0} view=subset"},
      {"aten::cat", {{"tensors", ArgType::kTensorList}, {"dim", ArgType::kInt}},
       {F32({2, 5}), F32({3, 5})}, {Arg::TensorList({0, 1}), Arg::Int(0)}, {F32({5, 5})},
       "([k, j], [l, j]) -> ([i, j]) {i=5, j=5, k=2, l=3} need_replication={i, k, l} additive"},
      {"aten::embedding",
       {{"weight", ArgType::kTensor}, {"indices", ArgType::kTensor}, {"padding_idx", ArgType::kInt},
        {"scale_grad_by_freq", ArgType::kBool}, {"sparse", ArgType::kBool}},
       {F32({10, 6}), I64({3, 4})},
       {Arg::Tensor(0), Arg::Tensor(1), Arg::Int(-1), Arg::Bool(false), Arg::Bool(false)},
       {F32({3, 4, 6})},
       "([i, j], [k, l]) -> ([k, l, j]) {i=10, j=6, k=3, l=4} reduction={i} yields={i}"},
      {"aten::native_layer_norm",
       {{"input", ArgType::kTensor}, {"normalized_shape", ArgType::kIntList},
        {"weight", ArgType::kTensor, true}, {"bias", ArgType::kTensor, true},
        {"eps", ArgType::kFloat}},
       {F32({4, 6}), F32({6}), F32({6})},
       {Arg::Tensor(0), Arg::IntList({6}), Arg::Tensor(1), Arg::Tensor(2), Arg::Double(1e-5)},
       {F32({4, 6}), F32({4, 1}), F32({4, 1})},
       "([i, j], [j], [j]) -> ([i, j], [i, _], [i, _]) {i=4, j=6} need_replication={j}"},
  };
}

TEST(RuleNotationTest, EachFamilyPrintsItsGoldenFactors) {
  for (const Case& c : Cases()) EXPECT_EQ(NotationOf(c), c.golden) << c.op;
}

}  // namespace
}  // namespace spmd::partition
