// Process-wide counters and metrics (timers, byte sizes), as in PyTorch/XLA's debug.metrics:
// counters are named integers; a metric keeps a sample count, an accumulator and the most recent
// samples. Thread-safe: the autograd engine records backward ops on its own thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace spmd {

struct MetricData {
  int64_t total_samples = 0;
  double accumulator = 0;
  std::vector<double> samples;  // the most recent kMaxSamples values
  static constexpr size_t kMaxSamples = 1024;
};

class Metrics {
 public:
  static Metrics& Get();

  void Increment(const std::string& counter, int64_t delta = 1);
  void Record(const std::string& metric, double value);

  int64_t CounterValue(const std::string& counter) const;  // 0 when never incremented
  std::vector<std::string> CounterNames() const;
  std::vector<std::string> MetricNames() const;
  bool GetMetric(const std::string& metric, MetricData* out) const;

  void ClearCounters();
  void ClearMetrics();
  std::string Report() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  std::map<std::string, MetricData> metrics_;
};

inline void Count(const std::string& counter, int64_t delta = 1) {
  Metrics::Get().Increment(counter, delta);
}

// Records the elapsed wall time (seconds) into a metric when it goes out of scope.
class ScopedTimer {
 public:
  explicit ScopedTimer(std::string metric)
      : metric_(std::move(metric)), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    Metrics::Get().Record(metric_, dt);
  }

 private:
  std::string metric_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace spmd
