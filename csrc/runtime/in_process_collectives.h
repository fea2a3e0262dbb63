// Collectives between emulated devices that all live in this process: data moves as host
// tensors, and each group's identical result is computed once and shared by its members.
#pragma once
#include "runtime/collectives.h"

namespace spmd::runtime {

class InProcessCollectives final : public Collectives {
 public:
  std::string name() const override { return "in-process"; }
  bool IsLocal(int64_t device) const override { return true; }

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
};

}  // namespace spmd::runtime
