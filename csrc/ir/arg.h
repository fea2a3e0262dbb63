// A torch-free value for one non-tensor argument of an op (or a reference to a tensor input).
// Args are stored in schema order; the runtime turns them back into IValues once per compiled
// program, so replay only fills in tensors and the run-time scalars.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/hash.h"

namespace spmd::ir {

struct Arg {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kDouble,
    kIntList,
    kDoubleList,
    kBoolList,  // stored in ints (0/1)
    kString,
    kScalarInt,
    kScalarDouble,
    kScalarBool,
    kTensor,         // i = index into the node's inputs
    kTensorList,     // ints = input indices
    kOptTensorList,  // ints = input indices, -1 for None
    kScalarType,     // i = DType value
    kLayout,         // i = c10::Layout value
    kDevice,         // the spmd device; replay runs on CPU
    kMemoryFormat,   // i = c10::MemoryFormat value
    kScalarList,     // Scalar[]: doubles = the values, ints = each one's kind (kScalarInt,
                     // kScalarDouble, kScalarBool); always dynamic, one run-time slot each
  };

  Kind kind = Kind::kNone;
  // A Scalar whose value is fed at run time: not part of the graph key, so e.g. a learning
  // rate or Adam's bias correction changing every step does not recompile.
  bool dynamic = false;
  // A scalar that the op receives as a Tensor argument: a Python number, which PyTorch passes
  // as a 0-dim "wrapped number" tensor (it has its own type-promotion rules).
  bool wrapped = false;
  // For dynamic scalars in a compiled program: the index of the value in the graph's scalars
  // (the partitioner copies and reorders ops, so position alone does not identify it).
  int32_t slot = -1;
  int64_t i = 0;
  double d = 0;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
  std::string s;

  static Arg None() { return Arg(); }
  static Arg Int(int64_t v) { Arg a; a.kind = Kind::kInt; a.i = v; return a; }
  static Arg Bool(bool v) { Arg a; a.kind = Kind::kBool; a.i = v; return a; }
  static Arg Double(double v) { Arg a; a.kind = Kind::kDouble; a.d = v; return a; }
  static Arg IntList(std::vector<int64_t> v) {
    Arg a; a.kind = Kind::kIntList; a.ints = std::move(v); return a;
  }
  static Arg Tensor(int64_t input) { Arg a; a.kind = Kind::kTensor; a.i = input; return a; }
  static Arg TensorList(std::vector<int64_t> inputs) {
    Arg a; a.kind = Kind::kTensorList; a.ints = std::move(inputs); return a;
  }
  static Arg String(std::string v) { Arg a; a.kind = Kind::kString; a.s = std::move(v); return a; }
  // A constant Scalar argument (not fed at run time), as lowerings emit them.
  static Arg ScalarDouble(double v) { Arg a; a.kind = Kind::kScalarDouble; a.d = v; return a; }
  static Arg ScalarInt(int64_t v) { Arg a; a.kind = Kind::kScalarInt; a.i = v; return a; }
  static Arg ScalarType(int64_t dtype) { Arg a; a.kind = Kind::kScalarType; a.i = dtype; return a; }

  bool is_none() const { return kind == Kind::kNone; }
  // How many run-time scalar slots the arg takes: one per dynamic Scalar, one per element of
  // a Scalar list, none for constants.
  int32_t num_slots() const {
    if (!dynamic) return 0;
    return kind == Kind::kScalarList ? static_cast<int32_t>(doubles.size()) : 1;
  }
  bool is_scalar() const {
    return kind == Kind::kScalarInt || kind == Kind::kScalarDouble || kind == Kind::kScalarBool;
  }
  double ScalarValue() const { return kind == Kind::kScalarDouble ? d : static_cast<double>(i); }

  Hash hash() const;  // excludes the value of dynamic scalars
  std::string ToString() const;
  bool operator==(const Arg& o) const;
};

}  // namespace spmd::ir
