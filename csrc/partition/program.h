// The compiler's output: one SPMD program, identical on every device. Its nodes are local ops
// (with local, per-device shapes) and spmd:: collectives; its parameters correspond one to one
// to the global graph's parameters, and each output comes with the layout it is produced in.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "sharding/sharding.h"

namespace spmd::partition {

struct CollectiveStat {
  std::string kind;       // all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute
  std::vector<std::string> axes;  // mesh axis labels
  int64_t group_size = 0;
  int64_t bytes = 0;      // each device's input buffer
};

struct ProgramStats {
  std::vector<CollectiveStat> collectives;
  int64_t peak_bytes_per_device = 0;  // static estimate from buffer liveness
  double flops_per_device = 0;
  std::map<std::string, int64_t> replicated_fallback_ops;  // op name -> count
  // Outputs that leave the program as pending partial results (kind "all-reduce", the axes
  // they are partial over): reduced on the host when read, or by the program that next
  // consumes them.
  std::vector<CollectiveStat> pending_reductions;
};

struct Program {
  std::vector<ir::NodePtr> nodes;     // topological order; params included
  std::vector<ir::NodePtr> params;    // in the global graph's parameter order
  std::vector<Sharding> param_shardings;  // layout each parameter must arrive in
  std::vector<ir::Value> outputs;     // in the global graph's output order
  std::vector<Sharding> output_shardings;  // invalid = replicated
  std::vector<TensorType> output_global_types;
  ProgramStats stats;
  std::string ToText() const;
};

}  // namespace spmd::partition
