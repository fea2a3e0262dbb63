// Gives the spmd device its autograd worker queue whatever ran before `import torch_spmd`.
//
// Autograd's engine sizes its per-device ready queues once, at the first backward of the
// process, from the device guards registered then. A backward on CPU before torch_spmd is
// imported (a CPU reference run, a library's self-test) therefore leaves no queue for spmd:0,
// and every later spmd backward fails an internal assert in Engine::ready_queue. When that
// happened, the missing queue is added here, with its worker thread started by the engine's
// own thread_init, exactly as the engine would have done had the device been registered first.
#include <torch/csrc/autograd/engine.h>

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "aten/backend.h"
#include "aten/lazy_tensor.h"

namespace spmd::aten {
namespace {

using torch::autograd::Engine;
using torch::autograd::ReadyQueue;

// The engine keeps its start-up state protected; a derived class may name the members, and the
// pointers to them apply to any Engine.
struct EngineState : Engine {
  static std::vector<std::shared_ptr<ReadyQueue>>& Queues(Engine& engine) {
    return engine.*(&EngineState::device_ready_queues_);
  }
  // Set by the engine's device-thread start-up (the first backward), whatever it found.
  static bool Started(Engine& engine) {
    return engine.*(&EngineState::thread_pool_shared_) != nullptr;
  }
};

}  // namespace

void EnsureAutogradDeviceQueue() {
  static std::once_flag once;
  std::call_once(once, [] {
    Engine& engine = Engine::get_default_engine();
    // Not started yet: the first backward will count spmd:0 (its guard is registered when the
    // module loads). Threads are not started here: a process that forks after importing
    // torch_spmd must keep its children's autograd usable, as torch itself allows.
    if (!EngineState::Started(engine)) return;
    std::vector<std::shared_ptr<ReadyQueue>>& queues = EngineState::Queues(engine);
    const size_t needed = static_cast<size_t>(SpmdDevice().index()) + 1;
    // The engine wrote this vector once, at its start-up, which is over. It is short only when
    // it holds no queue at all (a process without other devices): then no backward reads it,
    // since any that tried would have failed the assert this avoids.
    for (size_t device = queues.size(); device < needed; ++device) {
      queues.push_back(std::make_shared<ReadyQueue>());
      std::thread(&Engine::thread_init, &engine, static_cast<int>(device), queues.back(), true)
          .detach();
    }
  });
}

}  // namespace spmd::aten
