#include "aten/memory_api.h"

#include <mutex>

#include "aten/lazy_tensor.h"
#include "aten/recorder.h"
#include "ir/internal_ops.h"

namespace spmd::aten {

at::Tensor Offload(const at::Tensor& t, bool to_host) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const ir::Value& in = GetLazyImpl(t, "torch_spmd.memory.offload")->slot()->value;
  ir::NodePtr node = ir::MakeNode(ir::InternalOps::Get().offload, {in},
                                  {ir::Arg::Tensor(0), ir::Arg::Int(to_host ? 1 : 0)},
                                  {in.type()});
  return WrapOutput(ir::Value{node, 0}, /*factory=*/true);
}

}  // namespace spmd::aten
