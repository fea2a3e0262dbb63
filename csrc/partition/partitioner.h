// The compiler entry point: global graph in, per-device SPMD program out.
#pragma once
#include "core/hash.h"
#include "ir/graph.h"
#include "partition/program.h"
#include "partition/propagate.h"
#include "partition/ring.h"

namespace spmd::partition {

struct PartitionOptions {
  // GSPMD's step semantics (the default): every value the program hands back is complete, a
  // pending partial sum is reduced inside the step (reduce-scattered onto the tiling its
  // propagated sharding asks for, all-reduced otherwise). With this set, an output may leave
  // as a pending partial sum, reduced later by the program that reads it (gradient
  // accumulation without communication); the step then lists it in `pending_reductions`.
  bool defer_output_reductions = false;
  // Fill Program::traits (what each node's rule lets the executor do). Only a program that
  // will run needs them; plan mode analyses the program without running it and skips them
  // (about a tenth of partitioning a 70B step). Not part of Key: the program is the same.
  bool executor_traits = true;
  // Layouts to take some parameters' data to have (propagate.h): a search trying layouts,
  // auto-sharding. Not owned; nullptr: every parameter as its data is laid out. Not part of
  // Key (keyed by data, they differ every step): a caller that caches adds a key of its own.
  const ParamLayouts* param_layouts = nullptr;

  // XLA's windowed einsum (partition/windowed_einsum.h): a contraction whose all-gather of an
  // operand, or reduce-scatter of its result, moves at least this many bytes per device runs
  // as a ring of collective-permutes interleaved with partial products. -1: off (the
  // default; torch_spmd.runtime.set_collective_matmul, and plan mode on presets whose
  // runtime does it, turn it on).
  int64_t windowed_einsum_bytes = -1;
  // ... and only where each step keeps at least this extent of the windowed dim.
  int64_t windowed_einsum_min_extent = 128;
  // A compiling runtime's fusion (XLA; torch.compile's Inductor) in the memory figures: a
  // value with one reader, made by a pointwise op or a view (or one that
  // ShardingRule::fuses_into_reader) or read by one, is computed inside a fusion and never
  // held in device memory (the cast of the logits to fp32 before a log-softmax, a loss
  // gradient's one-hot, the log-softmax gradient reshaped and cast back to 16 bits). Off: every value a
  // program makes is held, as eager PyTorch holds it. The program and its values are the same
  // either way.
  bool fused_memory = false;
  // Context parallelism (partition/ring.h): how an op whose rule can read its operands around
  // a ring (attention's keys and values over a sharded sequence) runs where the assignment
  // would gather them. torch_spmd.runtime.set_context_parallel.
  ContextParallel context_parallel = ContextParallel::kAuto;

  Hash Key() const {
    return HashCombine(
        HashCombine(HashCombine(HashCombine(HashInt(defer_output_reductions ? 1 : 0),
                                            HashInt(windowed_einsum_bytes)),
                                HashInt(windowed_einsum_min_extent)),
                    HashInt(fused_memory ? 1 : 0)),
        HashInt(static_cast<int64_t>(context_parallel)));
  }
};

// Partitions `graph` over the mesh its annotations use (a 1-D mesh over `num_devices` when
// nothing is annotated). Parameters keep the layout their data already has; every reshard the
// program needs is an explicit collective in it.
Program PartitionGraph(const ir::Graph& graph, int64_t num_devices,
                       const PartitionOptions& options = {});

}  // namespace spmd::partition
