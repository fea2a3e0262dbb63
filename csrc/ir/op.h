// Interned op descriptors. An IR node names its op by an OpInfo*: the ATen schema name plus a
// torch-free summary of the argument list, so the compiler can read attributes (dims, sizes)
// without torch headers. Internal ops (spmd::*) are executed natively by the runtime.
#pragma once
#include <atomic>
#include <string>
#include <vector>

namespace spmd::ir {

enum class ArgType : uint8_t {
  kTensor,
  kTensorList,
  kOptionalTensorList,
  kInt,
  kIntList,
  kFloat,
  kFloatList,
  kBool,
  kBoolList,
  kString,
  kScalar,
  kScalarList,  // Scalar[] (a list optimizer's per-tensor step sizes)
  kScalarType,
  kLayout,
  kDevice,
  kMemoryFormat,
  kGenerator,
  kOther,
};

struct ArgSchema {
  std::string name;
  ArgType type = ArgType::kOther;
  bool optional = false;
  bool is_write = false;  // annotated as mutated (in-place or out=)
};

class OpInfo {
 public:
  std::string name;       // "aten::add"
  std::string overload;   // "Tensor" (may be empty)
  std::string qualified;  // "aten::add.Tensor"
  std::vector<ArgSchema> args;
  int num_returns = 1;
  bool internal = false;  // an spmd:: op run by the runtime, not by a dispatcher kernel
  bool has_mutable_arg = false;
  // The runtime caches its kernel handle here (a c10::OperatorHandle*) the first time it runs
  // the op, so replay never looks the schema up again.
  mutable std::atomic<void*> backend{nullptr};

  int ArgIndex(const std::string& arg_name) const;  // -1 when absent
};

// Returns the OpInfo registered under `qualified`, creating it with `args` on first use.
// Thread-safe; the pointer stays valid for the life of the process.
const OpInfo* InternOp(const std::string& qualified, std::vector<ArgSchema> args,
                       int num_returns, bool internal = false);
// The OpInfo for `qualified`, or nullptr if it was never interned.
const OpInfo* FindOp(const std::string& qualified);

}  // namespace spmd::ir
