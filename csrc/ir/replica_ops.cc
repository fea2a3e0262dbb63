#include "ir/replica_ops.h"

#include <string>

#include "core/error.h"

namespace spmd::ir {

namespace {

ArgSchema Tensor(const char* name) { return {name, ArgType::kTensor}; }
ArgSchema Tensors(const char* name) { return {name, ArgType::kTensorList}; }
ArgSchema Int(const char* name) { return {name, ArgType::kInt}; }
ArgSchema Ints(const char* name) { return {name, ArgType::kIntList}; }
ArgSchema Float(const char* name) { return {name, ArgType::kFloat}; }

int64_t IntOf(const std::string& name, const Arg& a) {
  SPMD_CHECK_VALUE(a.kind == Arg::Kind::kInt, "xm op attribute ", name, " must be an int, got ",
                   a.ToString());
  return a.i;
}

// Checks that `groups` is a partition of 0..W-1 into lists of one size: every replica must
// take part in every collective, or the processes would disagree about who waits for whom.
void CheckGroups(const std::vector<std::vector<int64_t>>& groups) {
  SPMD_CHECK_VALUE(!groups.empty() && !groups[0].empty(), "xm collective: groups must not be empty");
  const size_t k = groups[0].size();
  size_t world = 0;
  for (const auto& g : groups) {
    SPMD_CHECK_VALUE(g.size() == k, "xm collective: every group must have the same size, got ",
                     k, " and ", g.size());
    world += g.size();
  }
  std::vector<bool> seen(world, false);
  for (const auto& g : groups) {
    for (int64_t r : g) {
      SPMD_CHECK_VALUE(r >= 0 && r < static_cast<int64_t>(world),
                       "xm collective: groups must hold each replica 0..", world - 1,
                       " exactly once, got replica ", r);
      SPMD_CHECK_VALUE(!seen[r], "xm collective: replica ", r, " is in more than one group");
      seen[r] = true;
    }
  }
}

std::vector<std::vector<int64_t>> UnflattenGroups(const std::vector<int64_t>& flat, int64_t k) {
  SPMD_CHECK_VALUE(k > 0 && !flat.empty() && flat.size() % k == 0,
                   "xm collective: ", flat.size(), " group members do not split into groups of ", k);
  std::vector<std::vector<int64_t>> groups;
  for (size_t i = 0; i < flat.size(); i += k)
    groups.emplace_back(flat.begin() + i, flat.begin() + i + k);
  return groups;
}

int64_t CheckDim(const char* what, int64_t dim, const Shape& input) {
  SPMD_CHECK_VALUE(dim >= 0 && dim < static_cast<int64_t>(input.size()), "xm collective: ", what,
                   " ", dim, " is out of range for an input of shape ", ShapeToString(input));
  return dim;
}

int64_t Split(const char* op, int64_t extent, int64_t k, int64_t dim) {
  SPMD_CHECK_VALUE(extent % k == 0, op, ": dim ", dim, " of extent ", extent,
                   " does not split evenly into ", k, " chunks (one per group member)");
  return extent / k;
}

}  // namespace

const ReplicaOps& ReplicaOps::Get() {
  static const ReplicaOps* ops = [] {
    auto* o = new ReplicaOps();
    o->all_reduce = InternOp("xm::all_reduce",
                             {Tensors("inputs"), Int("op"), Float("scale"), Ints("groups"),
                              Int("group_size")},
                             1, /*internal=*/true);
    o->all_gather = InternOp("xm::all_gather",
                             {Tensor("self"), Int("dim"), Ints("groups"), Int("group_size")}, 1,
                             true);
    o->reduce_scatter = InternOp("xm::reduce_scatter",
                                 {Tensor("self"), Int("op"), Float("scale"), Int("dim"),
                                  Ints("groups"), Int("group_size")},
                                 1, true);
    o->all_to_all = InternOp("xm::all_to_all",
                             {Tensor("self"), Int("split_dim"), Int("concat_dim"), Ints("groups"),
                              Int("group_size")},
                             1, true);
    return o;
  }();
  return *ops;
}

bool ReplicaOps::Contains(const OpInfo* op) const {
  return op == all_reduce || op == all_gather || op == reduce_scatter || op == all_to_all;
}

ReplicaAttrs ReplicaAttrs::Read(const OpInfo& op, const std::vector<Arg>& args) {
  SPMD_CHECK_VALUE(args.size() == op.args.size(), op.qualified, " expects ", op.args.size(),
                   " args, got ", args.size());
  ReplicaAttrs a;
  std::vector<int64_t> flat;
  int64_t group_size = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = op.args[i].name;
    const Arg& arg = args[i];
    if (name == "self" || name == "inputs") continue;
    if (name == "dim") a.dim = IntOf(name, arg);
    else if (name == "split_dim") a.split_dim = IntOf(name, arg);
    else if (name == "concat_dim") a.concat_dim = IntOf(name, arg);
    else if (name == "group_size") group_size = IntOf(name, arg);
    else if (name == "scale") {
      SPMD_CHECK_VALUE(arg.kind == Arg::Kind::kDouble, "xm op attribute scale must be a float, got ",
                       arg.ToString());
      a.scale = arg.d;
    } else if (name == "op") {
      int64_t v = IntOf(name, arg);
      SPMD_CHECK_VALUE(v >= 0 && v <= static_cast<int64_t>(ReduceOp::kMin),
                       "xm op attribute op must be a ReduceOp (0 sum, 1 max, 2 min), got ", v);
      a.op = static_cast<ReduceOp>(v);
    } else if (name == "groups") {
      SPMD_CHECK_VALUE(arg.kind == Arg::Kind::kIntList,
                       "xm op attribute groups must be an int list, got ", arg.ToString());
      flat = arg.ints;
    } else {
      SPMD_FAIL("internal error: ", op.qualified, " has an attribute ", name,
                " that ReplicaAttrs does not know");
    }
  }
  a.groups = UnflattenGroups(flat, group_size);
  CheckGroups(a.groups);
  return a;
}

std::vector<Arg> GroupArgs(const std::vector<std::vector<int64_t>>& groups) {
  CheckGroups(groups);
  std::vector<int64_t> flat;
  for (const auto& g : groups) flat.insert(flat.end(), g.begin(), g.end());
  return {Arg::IntList(std::move(flat)), Arg::Int(static_cast<int64_t>(groups[0].size()))};
}

Shape ReplicaOutputShape(const OpInfo& op, const Shape& input, const ReplicaAttrs& a) {
  const ReplicaOps& ops = ReplicaOps::Get();
  const int64_t k = a.group_size();
  Shape out = input;
  if (&op == ops.all_reduce) {
    // same shape
  } else if (&op == ops.all_gather) {
    out[CheckDim("dim", a.dim, input)] *= k;
  } else if (&op == ops.reduce_scatter) {
    const int64_t d = CheckDim("dim", a.dim, input);
    out[d] = Split("reduce_scatter", input[d], k, d);
  } else if (&op == ops.all_to_all) {
    const int64_t s = CheckDim("split_dim", a.split_dim, input);
    const int64_t c = CheckDim("concat_dim", a.concat_dim, input);
    out[s] = Split("all_to_all", input[s], k, s);
    out[c] *= k;  // when s == c the two cancel out: the extent is unchanged
  } else {
    SPMD_CHECK_VALUE(false, op.qualified, " is not an xm collective");
  }
  return out;
}

}  // namespace spmd::ir
