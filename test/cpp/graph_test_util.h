// Helpers for the torch-free compiler tests: meshes, shardings written with axis names, and
// global graphs built by hand (parameters with a layout, ATen ops interned with a small
// schema, sharding constraints), as the recorder would build them without the dispatcher.
#pragma once
#include <cmath>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/internal_ops.h"
#include "ir/node.h"
#include "ir/op.h"
#include "partition/program.h"
#include "sharding/mesh.h"
#include "sharding/sharding.h"

namespace spmd::testing {

using Names = std::vector<std::string>;

// A mesh of `shape` named `names` over `ids` (default 0, 1, ... in row-major order).
inline MeshPtr MakeMesh(std::vector<int64_t> shape, Names names, std::vector<int64_t> ids = {}) {
  if (ids.empty()) {
    int64_t size = 1;
    for (int64_t s : shape) size *= s;
    ids.resize(size);
    std::iota(ids.begin(), ids.end(), 0);
  }
  return std::make_shared<const Mesh>(std::move(ids), std::move(shape), std::move(names));
}

// A partition spec written with axis names, one entry per tensor dim ({} is None).
inline Sharding Spec(const MeshPtr& mesh, const std::vector<Names>& spec) {
  std::vector<AxisList> dim_axes;
  for (const Names& entry : spec) {
    AxisList axes;
    for (const std::string& name : entry) {
      const int axis = mesh->AxisIndex(name);
      if (axis < 0) throw std::logic_error("test spec names unknown axis " + name);
      axes.push_back(axis);
    }
    dim_axes.push_back(axes);
  }
  return Sharding::Tiled(mesh, dim_axes);
}

inline TensorType F32(Shape shape) { return TensorType{DType::kFloat32, std::move(shape)}; }

// Device data as the runtime would hold it: only its type and layout matter to the compiler.
class TestData : public ir::DataHandle {
 public:
  TestData(TensorType type, Sharding sharding)
      : type_(std::move(type)), sharding_(std::move(sharding)) {}
  const TensorType& type() const override { return type_; }
  const Sharding& sharding() const override { return sharding_; }

 private:
  TensorType type_;
  Sharding sharding_;
};

// A graph parameter holding data of `type` laid out as `sharding` (invalid = replicated).
inline ir::Value Param(TensorType type, Sharding sharding = Sharding()) {
  return ir::Value{ir::MakeDataNode(std::make_shared<TestData>(std::move(type), std::move(sharding))),
                   0};
}

// ATen ops with the tensor part of their schemas (the recorder interns the real schema; the
// compiler only reads argument names and kinds).
inline const ir::OpInfo* OpMm() {
  return ir::InternOp("aten::mm", {{"self", ir::ArgType::kTensor}, {"mat2", ir::ArgType::kTensor}}, 1);
}
inline const ir::OpInfo* OpUnary(const std::string& qualified) {
  return ir::InternOp(qualified, {{"self", ir::ArgType::kTensor}}, 1);
}

inline ir::Value Mm(const ir::Value& a, const ir::Value& b) {
  const Shape& sa = a.type().shape;
  const Shape& sb = b.type().shape;
  if (sa.size() != 2 || sb.size() != 2 || sa[1] != sb[0])
    throw std::logic_error("test mm with mismatched shapes");
  TensorType out{a.type().dtype, {sa[0], sb[1]}};
  return ir::Value{ir::MakeNode(OpMm(), {a, b}, {ir::Arg::Tensor(0), ir::Arg::Tensor(1)}, {out}), 0};
}

inline ir::Value Unary(const std::string& qualified, const ir::Value& x) {
  return ir::Value{ir::MakeNode(OpUnary(qualified), {x}, {ir::Arg::Tensor(0)}, {x.type()}), 0};
}
inline ir::Value Relu(const ir::Value& x) { return Unary("aten::relu", x); }
inline ir::Value Tanh(const ir::Value& x) { return Unary("aten::tanh", x); }

// xs.mark_sharding on an intermediate: an spmd::sharding_constraint carrying the annotation.
inline ir::Value Constrain(const ir::Value& x, Sharding sharding) {
  ir::NodePtr n = ir::MakeNode(ir::InternalOps::Get().sharding_constraint, {x},
                               {ir::Arg::Tensor(0)}, {x.type()});
  n->set_shardings({std::move(sharding)});
  return ir::Value{n, 0};
}

// Relative comparison for the cost model's doubles (hand-computed with different rounding).
// A collective of `kind` moving `bytes` per device over the devices of `group` (one group of
// several alike), as the partitioner records it for the cost model.
inline partition::CollectiveStat Stat(const std::string& kind, int64_t bytes,
                                      std::vector<int64_t> group) {
  partition::CollectiveStat c;
  c.kind = kind;
  c.group_size = static_cast<int64_t>(group.size());
  c.bytes = bytes;
  c.first_group = std::move(group);
  return c;
}

inline bool Close(double actual, double expected, double rel = 1e-9) {
  return std::fabs(actual - expected) <= rel * std::fabs(expected) + 1e-300;
}

}  // namespace spmd::testing
