#include "aten/host_bookkeeping.h"

#include <algorithm>

#include "aten/eager_fallback.h"
#include "aten/graph_template.h"
#include "aten/recorder.h"
#include "core/metrics.h"
#include "partition/rules/rule.h"
#include "runtime/device_data.h"
#include "runtime/plan_mode.h"

namespace spmd::aten {

using partition::ViewKind;

bool RunsOnHost(const OpPlan& plan, const ir::Node& node) {
  using runtime::DeviceData;
  // (A region being captured for replay keeps its ops: graph_template.h.)
  if (CapturingTemplate()) return false;
  // (In-place and out= ops write their arguments: they stay in the graph.)
  if (!plan.written_args.empty() ||
      std::any_of(plan.return_alias.begin(), plan.return_alias.end(), [](int a) { return a >= 0; }))
    return false;
  if (node.outputs().empty() || node.inputs().empty() || node.draws_random_numbers()) return false;
  for (const TensorType& t : node.outputs())
    if (!DeviceData::KeepsKnownValue(t)) return false;
  bool any_data = false, any_pending = false, from_bookkeeping = false;
  for (const ir::Value& in : node.inputs()) {
    if (!DeviceData::KeepsKnownValue(in.type())) return false;
    if (!in.node->is_data()) {
      any_pending = true;
      continue;
    }
    const auto* data = static_cast<const DeviceData*>(in.node->data().get());
    if (!data->is_replicated() || (data->planned() && !data->known())) return false;
    any_data = true;
    from_bookkeeping = from_bookkeeping || data->host_bookkeeping();
  }
  if (!any_data) return false;
  partition::RulePtr rule = partition::GetRule(node);
  const bool reshapes_or_joins =
      rule && (rule->algebra.joins || rule->executor.view == ViewKind::kReshape ||
               rule->executor.view == ViewKind::kPermute || rule->executor.view == ViewKind::kSubset);
  if (!any_pending) return reshapes_or_joins || from_bookkeeping;
  // A join that grows known data by pending values: those are synced first (not in plan mode,
  // where that would plan a step per bookkeeping op).
  return !runtime::Planning() && rule && rule->algebra.joins;
}

std::vector<ir::Value> ComputeOnHost(const OpPlan& plan, c10::ArrayRef<c10::IValue> args) {
  NoteHostWork();
  Count("HostBookkeepingOps");
  std::vector<c10::IValue> host = HostArguments(plan, args, nullptr, nullptr);
  plan.handle->callBoxed(&host);
  std::vector<ir::Value> values;
  auto upload = [&](const at::Tensor& t) {
    values.push_back(UploadValue(t));
    static_cast<runtime::DeviceData*>(values.back().node->data().get())->set_host_bookkeeping();
  };
  for (const c10::IValue& v : host) {
    if (v.isTensor()) {
      upload(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) upload(t);
    }
  }
  return values;
}

}  // namespace spmd::aten
