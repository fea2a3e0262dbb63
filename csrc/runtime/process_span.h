// Multi-process SPMD: the global devices of one mesh split over several processes.
//
// As on a multi-host TPU pod, every process runs the same program and owns a contiguous slice
// of the global devices: process p of P holds devices [p * L, (p + 1) * L), L = N / P. Its
// DeviceSet has L devices (local index l is global device first_device() + l), and every
// value it holds is stacked over those L devices only. The compiler partitions for all N
// devices (a mesh names global ids); the runtime translates at the few places where a device's
// identity matters (its tile of a sharded upload, a random op's tile, a collective's groups).
//
// A collective whose groups lie within processes runs in memory as in a single process; one
// whose groups span processes exchanges the members' shards over the span's process group
// (one coalesced call per collective, not per device).
//
// With no span installed (the default) the process owns every device: first_device 0,
// global count = the DeviceSet's.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spmd::runtime {

class ProcessSpan {
 public:
  ProcessSpan(int64_t process_index, int64_t process_count, int64_t local_devices);
  virtual ~ProcessSpan() = default;

  int64_t process_index() const { return process_index_; }
  int64_t process_count() const { return process_count_; }
  int64_t local_devices() const { return local_devices_; }
  int64_t global_devices() const { return local_devices_ * process_count_; }
  int64_t first_device() const { return process_index_ * local_devices_; }
  int64_t ProcessOf(int64_t global_device) const { return global_device / local_devices_; }

  // Every process's `local` (equal shapes and dtypes everywhere) concatenated along dim 0 in
  // process order. Every process must call it, in the same order.
  virtual at::Tensor AllGather(const at::Tensor& local, const char* what) = 0;
  // AllGather of several tensors (any dtypes and shapes, dim 0 concatenated) in one exchange:
  // their bytes travel packed together.
  std::vector<at::Tensor> AllGatherMany(const std::vector<at::Tensor>& locals, const char* what);
  // Several tensors in one message to process `to` / from process `from` (shaped and typed as
  // `likes`) / from process `root` to every other (`tensors`: the root's values, elsewhere
  // tensors shaped as them).
  void SendMany(const std::vector<at::Tensor>& tensors, int64_t to, const char* what);
  std::vector<at::Tensor> RecvMany(const std::vector<at::Tensor>& likes, int64_t from,
                                   const char* what);
  std::vector<at::Tensor> BroadcastMany(const std::vector<at::Tensor>& tensors, int64_t root,
                                        const char* what);
  // Bytes this process sent to other processes (a metric: CrossProcessBytes).
  static void NoteSent(int64_t bytes);

 protected:
  // The byte transfers the packed forms run on (`bytes`: a contiguous uint8 tensor).
  virtual void SendBytes(const at::Tensor& bytes, int64_t to, const char* what) = 0;
  virtual void RecvBytes(at::Tensor& bytes, int64_t from, const char* what) = 0;
  virtual void BroadcastBytes(at::Tensor& bytes, int64_t root, const char* what) = 0;

 public:

  // The installed span (null: one process owns every device).
  static std::shared_ptr<ProcessSpan> Current();
  // Installs `span` (nullptr: back to one process). The DeviceSet must already have
  // span->local_devices() devices.
  static void Set(std::shared_ptr<ProcessSpan> span);

 private:
  int64_t process_index_, process_count_, local_devices_;
};

// The global device count (all processes') and this process's first global device.
int64_t GlobalDeviceCount();
int64_t FirstLocalDevice();
// Whether `groups` (lists of global device ids) put devices of different processes together.
bool GroupsSpanProcesses(const std::vector<std::vector<int64_t>>& groups);

// Checks that every process is about to run the same program (its key): a process whose
// Python code took another branch compiled something else, and would otherwise wait forever
// in a collective the others never reach. Throws naming the processes that differ.
void CheckSameProgramEverywhere(uint64_t key, const std::string& what);

}  // namespace spmd::runtime
