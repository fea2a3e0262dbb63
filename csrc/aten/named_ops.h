// The ATen ops that aten treats by name, in one table (named_ops.cc), as the sharding rules
// are one registry: everything else is decided from an op's schema. Every name is checked
// against this torch's dispatcher (test_aten_named_ops.py), so a misspelt or renamed op fails
// a test instead of silently losing its treatment.
#pragma once
#include <string>
#include <vector>

#include "aten/op_plan.h"

namespace spmd::aten {

// What functionalization's wrapper (backend.cc) does with the op, where not decided by its
// schema.
enum class FunctionalizeFix : uint8_t {
  kBySchema,  // in-place, in-place list and out= ops get their fix from their schema
  kNone,      // an in-place op that changes only metadata, which functionalization handles
  kDetach,    // detach: a copy of the value or an alias (FunctionalDetach)
};

struct NamedOp {
  // Runs instead of the recorder (host <-> device transfers, metadata queries, ...).
  SpecialKernel special = nullptr;
  // Output types instead of the meta kernel's, where the two disagree.
  ShapeFn shape;
  // Arguments the CPU kernel writes although the schema does not say so.
  std::vector<int> hidden_writes;
  // The op `special` records this one as (RecordReshapeAliasAsView).
  const char* recorded_as = nullptr;
  // Named like a view's functional copy (X_copy) without being one.
  bool not_a_view_copy = false;
  // Its composite kernel is kept rather than the recorder's (detach: a shallow copy, sharing
  // its slot).
  bool keeps_composite_kernel = false;
  // A device -> host copy into a host tensor is legal (copy_).
  bool may_write_host = false;
  FunctionalizeFix functionalize = FunctionalizeFix::kBySchema;
};

// The entry for `name` (a qualified name: "aten::clone", "aten::add.Tensor"; the schema name
// alone where the overload is empty), or null.
const NamedOp* FindNamedOp(const std::string& name);
// Whether `name` has an entry whose `flag` is set.
inline bool NamedOpSays(const std::string& name, bool NamedOp::*flag) {
  const NamedOp* op = FindNamedOp(name);
  return op && op->*flag;
}

// Every op the table names (its entries and the ops they record as), sorted.
std::vector<std::string> NamedOpNames();

}  // namespace spmd::aten
