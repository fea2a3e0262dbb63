// Collectives across processes over torch.distributed process groups (gloo): the multi-process
// implementation of the Collectives interface (collectives.h). One process per device: global
// device id = process rank, and only this process's rank is local. Every process calls each
// collective with the same groups in the same order (the lazy graphs of all replicas are the
// same program), and only talks to the members of its own group.
//
// Communicators: the world process group serves any group holding every rank; a smaller group
// needs a process group over exactly its ranks, registered with AddGroup (created in Python
// by torch.distributed.new_group, which every rank must call in the same order). A group's
// member order need not be sorted: members are mapped onto the communicator's ranks (which
// new_group numbers in ascending global-rank order).
//
// Gloo has no reduce_scatter: it runs as an all-to-all of the members' chunks followed by a
// local reduction (the same bytes on the wire as a ring reduce-scatter). Dtypes gloo lacks
// travel widened (bfloat16 as float32, bool as uint8, int16 as int32) and are narrowed back.
#pragma once
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <map>
#include <mutex>
#include <vector>

#include "runtime/collectives.h"

namespace spmd::runtime {

class ProcessGroupCollectives final : public Collectives {
 public:
  using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

  // `world` spans every process; this process is its rank.
  explicit ProcessGroupCollectives(ProcessGroupPtr world);

  // Registers the communicator of the group of global ranks `ranks` (any order); `group` must
  // number them in ascending order, as torch.distributed.new_group does.
  void AddGroup(std::vector<int64_t> ranks, ProcessGroupPtr group);
  bool HasGroup(std::vector<int64_t> ranks) const;

  std::string name() const override { return "process-group(" + world_->getBackendName() + ")"; }
  bool IsLocal(int64_t device) const override { return device == rank_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }

 protected:
  DeviceTensors DoAllGather(const DeviceTensors& in, const MeshGroups& groups, int64_t dim,
                            int64_t size) override;
  DeviceTensors DoAllReduce(const DeviceTensors& in, const MeshGroups& groups,
                            ReduceOp op) override;
  DeviceTensors DoReduceScatter(const DeviceTensors& in, const MeshGroups& groups, int64_t dim,
                                ReduceOp op, int64_t size) override;
  DeviceTensors DoAllToAll(const DeviceTensors& in, const MeshGroups& groups, int64_t split_dim,
                           int64_t concat_dim, int64_t split_size,
                           int64_t concat_size) override;
  DeviceTensors DoCollectivePermute(const DeviceTensors& in, const MeshGroups& groups,
                                    const PermutePairs& pairs) override;

 private:
  // This process's group of a collective: the communicator, and each member's rank in it.
  struct Comm {
    ProcessGroupPtr pg;
    std::vector<int64_t> members;   // global ranks, in member order
    std::vector<int> pg_rank;       // member index -> rank in pg
    int64_t index;                  // this process's member index
  };
  Comm CommFor(const MeshGroups& groups) const;
  // `in` sent as chunk i of an all-to-all to member i (stacked on a new dim 0, in pg rank
  // order); returns what each member sent here, indexed by member.
  std::vector<at::Tensor> Exchange(const Comm& c, const std::vector<at::Tensor>& chunks) const;

  ProcessGroupPtr world_;
  int64_t rank_;
  int64_t world_size_;
  mutable std::mutex mu_;
  std::map<std::vector<int64_t>, ProcessGroupPtr> groups_;  // sorted ranks -> communicator
};

class ProcessSpan;  // process_span.h
// Multi-process SPMD over `world` (every process a rank), this process owning `local_devices`
// of the global devices: the span's exchanges run as gloo all-gathers on `world`.
std::shared_ptr<ProcessSpan> MakeProcessGroupSpan(ProcessGroupCollectives::ProcessGroupPtr world,
                                                  int64_t local_devices);

}  // namespace spmd::runtime
