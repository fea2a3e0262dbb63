#include "aten/auto_sharding.h"

#include <cstdlib>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/metrics.h"
#include "plan/auto_layout.h"
#include "runtime/device_data.h"
#include "runtime/device_set.h"

namespace spmd::aten {

namespace {

struct State {
  std::mutex mu;
  bool on = false;
  plan::Hardware hardware;
  // graph key (with the mesh and options) -> per parameter position, its chosen layout
  // (invalid: kept as its data has it)
  std::unordered_map<Hash, std::vector<Sharding>> chosen;
};

State& GetState() {
  static auto* state = new State();
  return *state;
}

// XLA_AUTO_SPMD_MESH ("4,2"), else one axis over every device.
std::vector<int64_t> AutoMeshShape(int64_t num_devices) {
  const char* env = std::getenv("XLA_AUTO_SPMD_MESH");
  if (!env || !*env) return {num_devices};
  std::vector<int64_t> shape;
  std::string text(env), part;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      char* end = nullptr;
      const long long v = std::strtoll(part.c_str(), &end, 10);
      SPMD_CHECK_VALUE(!part.empty() && end && *end == '\0' && v > 0,
                       "XLA_AUTO_SPMD_MESH must be positive integers separated by commas, ",
                       "like \"4,2\"; got \"", text, "\"");
      shape.push_back(v);
      part.clear();
    } else {
      part += text[i];
    }
  }
  const int64_t total = std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  SPMD_CHECK_VALUE(total == num_devices, "XLA_AUTO_SPMD_MESH=\"", text, "\" has ", total,
                   " devices, but there are ", num_devices);
  return shape;
}

Hash ShapeKey(const std::vector<int64_t>& shape) {
  Hash h = HashInt(static_cast<int64_t>(shape.size()));
  for (int64_t s : shape) h = HashCombine(h, HashInt(s));
  return h;
}

}  // namespace

void SetAutoSharding(bool on, const plan::Hardware& hardware) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.on = on;
  if (on) s.hardware = hardware;
  s.chosen.clear();  // (another hardware prices layouts differently)
}

bool AutoSharding() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.on;
}

Hash AutoShardingKey() {
  if (!AutoSharding()) return 0;
  // (the text, checked only when a step is partitioned: PyTorch/XLA hashes it alike)
  const char* env = std::getenv("XLA_AUTO_SPMD_MESH");
  return HashCombine(HashInt(0x61757461), std::hash<std::string>()(env ? env : ""));
}

std::optional<AutoLayouts> AutoLayoutsFor(const ir::Graph& graph, int64_t num_devices,
                                          bool planning, bool defer_output_reductions) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.on) return std::nullopt;
  std::vector<bool> decide;
  // (Replicated data is decided: an upload, or what a step computed replicated, a model's
  // parameters made on the device among them. Tiled data keeps its layout: the script's
  // mark_sharding, or a previous step's choice coming back.)
  for (const ir::NodePtr& p : graph.params) {
    const Sharding& s = p->data()->sharding();
    decide.push_back(!s.valid() || s.IsReplicated());
  }
  if (std::find(decide.begin(), decide.end(), true) == decide.end()) return std::nullopt;

  const std::vector<int64_t> shape = AutoMeshShape(num_devices);
  const Hash key = HashCombine(HashCombine(graph.key, ShapeKey(shape)),
                               HashInt(defer_output_reductions ? 1 : 0));
  auto it = s.chosen.find(key);
  if (it == s.chosen.end()) {
    Count("CompileWithAutoSharding");
    std::vector<int64_t> ids(num_devices);
    std::iota(ids.begin(), ids.end(), 0);
    plan::AutoLayoutRequest request;
    request.mesh = std::make_shared<const Mesh>(ids, shape);
    request.hardware = s.hardware;
    request.memory_budget =
        planning ? static_cast<int64_t>(s.hardware.hbm_bytes) : runtime::DeviceSet::Get().bytes_limit();
    request.decide = decide;
    request.defer_output_reductions = defer_output_reductions;
    plan::AutoLayout got = plan::ChooseParamLayouts(graph, request);
    std::vector<Sharding> by_position(graph.params.size());
    for (size_t i = 0; i < graph.params.size(); ++i) {
      auto l = got.layouts.find(graph.params[i]->data().get());
      if (l != got.layouts.end()) by_position[i] = l->second;
    }
    if (s.chosen.size() >= 64) s.chosen.clear();  // (a bound; a loop repeats a few graphs)
    it = s.chosen.emplace(key, std::move(by_position)).first;
  }
  AutoLayouts out;
  out.key = key;
  for (size_t i = 0; i < graph.params.size(); ++i) {
    const Sharding& l = it->second[i];
    if (!l.valid()) continue;
    out.layouts.emplace(graph.params[i]->data().get(), l);
    out.key = HashCombine(out.key, HashCombine(HashInt(static_cast<int64_t>(i)), l.hash()));
  }
  return out;
}

}  // namespace spmd::aten
