#include "core/metrics.h"

#include <cstdio>
#include <sstream>

namespace spmd {

Metrics& Metrics::Get() {
  static Metrics* metrics = new Metrics();  // leaked: used from static destructors
  return *metrics;
}

void Metrics::Increment(const std::string& counter, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_[counter] += delta;
}

void Metrics::Record(const std::string& metric, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  MetricData& m = metrics_[metric];
  m.total_samples += 1;
  m.accumulator += value;
  if (m.samples.size() >= MetricData::kMaxSamples) m.samples.erase(m.samples.begin());
  m.samples.push_back(value);
}

int64_t Metrics::CounterValue(const std::string& counter) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counters_.find(counter);
  return it == counters_.end() ? 0 : it->second;
}

std::vector<std::string> Metrics::CounterNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& kv : counters_) names.push_back(kv.first);
  return names;
}

std::vector<std::string> Metrics::MetricNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& kv : metrics_) names.push_back(kv.first);
  return names;
}

bool Metrics::GetMetric(const std::string& metric, MetricData* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(metric);
  if (it == metrics_.end()) return false;
  *out = it->second;
  return true;
}

void Metrics::ClearCounters() {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.clear();
}

void Metrics::ClearMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.clear();
}

namespace {
std::string FormatValue(const std::string& name, double v) {
  char buf[64];
  bool is_time = name.find("Time") != std::string::npos;
  bool is_bytes = name.find("Bytes") != std::string::npos;
  if (is_time) {
    if (v >= 1) std::snprintf(buf, sizeof(buf), "%.3fs", v);
    else if (v >= 1e-3) std::snprintf(buf, sizeof(buf), "%.3fms", v * 1e3);
    else std::snprintf(buf, sizeof(buf), "%.3fus", v * 1e6);
  } else if (is_bytes) {
    std::snprintf(buf, sizeof(buf), "%.0fB", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", v);
  }
  return buf;
}
}  // namespace

std::string Metrics::Report() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  for (const auto& kv : metrics_) {
    const MetricData& m = kv.second;
    os << "Metric: " << kv.first << "\n";
    os << "  TotalSamples: " << m.total_samples << "\n";
    os << "  Accumulator: " << FormatValue(kv.first, m.accumulator) << "\n";
    if (m.total_samples > 0)
      os << "  Mean: " << FormatValue(kv.first, m.accumulator / m.total_samples) << "\n";
  }
  for (const auto& kv : counters_) {
    os << "Counter: " << kv.first << "\n";
    os << "  Value: " << kv.second << "\n";
  }
  return os.str();
}

}  // namespace spmd
