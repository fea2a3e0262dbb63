// The compiler entry point: global graph in, per-device SPMD program out.
#pragma once
#include "ir/graph.h"
#include "partition/program.h"

namespace spmd::partition {

// Partitions `graph` over the mesh its annotations use (a 1-D mesh over `num_devices` when
// nothing is annotated). Parameters keep the layout their data already has; every reshard the
// program needs is an explicit collective in it.
Program PartitionGraph(const ir::Graph& graph, int64_t num_devices);

}  // namespace spmd::partition
