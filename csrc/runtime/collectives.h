// Collectives between the emulated devices, behind one interface, with the exact semantics of
// the spmd:: ops in ir/internal_ops.h (groups over mesh axes, member i holding tile i, uneven
// tiles padded to ceil(extent/k)).
//
// Interface choice, made for the multi-process (torch.distributed gloo) implementation to come:
// - Inputs and outputs are host tensors indexed by *global device id* (DeviceTensors). Entry d
//   is defined exactly when device d is in the mesh and this process owns it (IsLocal); every
//   other entry is left undefined. The in-process implementation owns every device. A
//   multi-process one fills only its own devices and exchanges the rest over the wire.
// - The groups are described by MeshGroups (the mesh's devices grouped over the axes): a list of
//   device-id lists that every process computes identically, so it maps directly onto
//   per-group communicators or send/recv pairs. Nothing refers to buffers, the DeviceSet or IR.
// - Results for members of one group that hold identical data (all-gather, all-reduce) are the
//   same at::Tensor, so emulation does the work once per group and devices share one host
//   copy; a collective-permute destination shares its source's tensor. Values are immutable, so
//   callers must never write into a result or an input.
// - Validation, metrics and dispatch live in the non-virtual public methods; implementations
//   override the protected Do* methods and may assume validated inputs (all defined inputs have
//   one dtype and shape, dims and extents match the op, pairs are in range).
//
// Metrics (core/metrics.h), recorded once per executed collective by every process:
//   counters  CollectiveAllGather, CollectiveAllReduce, CollectiveReduceScatter,
//             CollectiveAllToAll, CollectivePermute
//   metrics   the same name + "Bytes": one sample per execution, the bytes of each device's
//             input buffer (every participant's is the same size in an SPMD program; the same
//             measure as partition::CollectiveStat::bytes).
// halo_exchange has no counter of its own: it runs as (up to) two collective-permutes of its
// halo slices, which are counted as such.
#pragma once
#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sharding/sharding.h"
#include "sharding/tiling.h"

namespace spmd::runtime {

using DeviceTensors = std::vector<at::Tensor>;  // by device id; undefined where not taking part
using PermutePairs = std::vector<std::pair<int64_t, int64_t>>;  // (source, destination) members

enum class CollectiveKind { kAllGather, kAllReduce, kReduceScatter, kAllToAll, kPermute };
const char* CollectiveMetricName(CollectiveKind kind);  // "CollectiveAllGather", ...

// Shared by every implementation (also the device-batched kernels of stacked_kernels.cc):
// records one execution of `kind` whose per-device input is `shard` (see Metrics above), and
// the argument checks with their messages.
void RecordCollective(CollectiveKind kind, const at::Tensor& shard);
void CheckCollectiveDim(const char* op, const char* what, int64_t dim, const at::Tensor& shard);
void CheckCollectiveExtent(const char* op, const char* what, const at::Tensor& shard, int64_t dim,
                           int64_t want);

class Collectives {
 public:
  virtual ~Collectives() = default;

  // The implementation kernels use; InProcessCollectives unless SetCurrent installed another.
  static std::shared_ptr<Collectives> Current();
  // Installs `collectives` (nullptr restores the in-process default). Collectives already
  // running keep the implementation they started with.
  static void SetCurrent(std::shared_ptr<Collectives> collectives);

  // The implementation the xm:: cross-replica collectives use (ir/replica_ops.h), where device
  // id = replica ordinal: in multi-process mode ProcessGroupCollectives, one replica (and one
  // device) per process. Current() when none is installed. Kept apart from Current() because
  // a partitioned program's mesh numbers this process's own devices (0..n-1), not replicas:
  // the partitioner's spmd:: collectives must stay in-process until meshes span processes.
  static std::shared_ptr<Collectives> Replicas();
  static void SetReplicas(std::shared_ptr<Collectives> collectives);  // nullptr: Current()

  virtual std::string name() const = 0;
  virtual bool IsLocal(int64_t device) const = 0;

  // Each member's tile (extent ceil(size/k) on `dim`) without its padding, concatenated in
  // member order: extent `size`.
  DeviceTensors AllGather(const DeviceTensors& in, const MeshGroups& groups, int64_t dim,
                          int64_t size);
  // Elementwise reduction over each group.
  DeviceTensors AllReduce(const DeviceTensors& in, const MeshGroups& groups, ReduceOp op);
  // Inputs have extent `size` on `dim`; member i gets tile i of the reduction, zero-padded.
  DeviceTensors ReduceScatter(const DeviceTensors& in, const MeshGroups& groups, int64_t dim,
                              ReduceOp op, int64_t size);
  // Inputs hold a tile of the extent-`concat_size` dim and the whole `split_dim`; member j gets
  // the whole concat dim and tile j of the split dim (zero-padded).
  DeviceTensors AllToAll(const DeviceTensors& in, const MeshGroups& groups, int64_t split_dim,
                         int64_t concat_dim, int64_t split_size, int64_t concat_size);
  // Within each group, member dst receives member src's tensor; members receiving nothing get
  // zeros. A member may send to several destinations, but receives from at most one source.
  DeviceTensors CollectivePermute(const DeviceTensors& in, const MeshGroups& groups,
                                  const PermutePairs& pairs);

 protected:
  virtual DeviceTensors DoAllGather(const DeviceTensors& in, const MeshGroups& groups,
                                    int64_t dim, int64_t size) = 0;
  virtual DeviceTensors DoAllReduce(const DeviceTensors& in, const MeshGroups& groups,
                                    ReduceOp op) = 0;
  virtual DeviceTensors DoReduceScatter(const DeviceTensors& in, const MeshGroups& groups,
                                        int64_t dim, ReduceOp op, int64_t size) = 0;
  virtual DeviceTensors DoAllToAll(const DeviceTensors& in, const MeshGroups& groups,
                                   int64_t split_dim, int64_t concat_dim, int64_t split_size,
                                   int64_t concat_size) = 0;
  virtual DeviceTensors DoCollectivePermute(const DeviceTensors& in, const MeshGroups& groups,
                                            const PermutePairs& pairs) = 0;

 private:
  // Checks that `in` is defined exactly on the local mesh devices, with one dtype and shape;
  // returns that shape's first local tensor (for size checks and byte counts).
  const at::Tensor& CheckInputs(const char* op, const DeviceTensors& in,
                                const MeshGroups& groups) const;
};

}  // namespace spmd::runtime
