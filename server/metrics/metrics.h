// A small Prometheus metrics registry: counters, gauges and histograms with
// labels, rendered in the text exposition format (version 0.0.4).
//
// Debian 12 packages no prometheus-cpp, so this is ours. A family (one metric
// name, its help and label names) holds one series per label-value tuple.
// Hot paths look a series up once (Family::WithLabels, which takes the
// family's mutex) and then update it with relaxed atomics only. Values that
// already live elsewhere (the store's counters) are not mirrored: a collector
// reads them at scrape time instead.
//
// The Registry owns its families; series are shared_ptrs, so a series removed
// from its family (a deleted namespace) stays valid for whoever still holds
// it. Everything here is thread-safe. Names and label names are checked when
// registered (a bad one is a programming error and aborts).
#ifndef KVHARBOR_SERVER_METRICS_METRICS_H_
#define KVHARBOR_SERVER_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/base/check.h"

namespace kvharbor {
namespace metrics {

// The Content-Type of Registry::Render's output.
inline constexpr char kContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kCounter, kGauge, kHistogram };

class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double delta);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: finite upper bounds, strictly increasing (+Inf is implicit).
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);
  // Counts `v` in the first bucket whose bound is >= v ("le" is inclusive).
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
  };
  // Bucket counts are read one by one without a lock; the +Inf bucket is
  // their sum, so count and buckets always agree within one snapshot.
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  const std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds + 1 (+Inf)
  std::atomic<double> sum_{0};
};

// Bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends HELP, TYPE and every series.
  virtual void Render(std::string* out) const = 0;

 protected:
  void RenderHeader(std::string* out) const;
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

// One series per tuple of label values (in label_names order).
template <typename Metric>
class Family final : public FamilyBase {
 public:
  using Factory = std::function<std::shared_ptr<Metric>()>;
  Family(std::string name, std::string help, MetricType type,
         std::vector<std::string> label_names, Factory factory)
      : FamilyBase(std::move(name), std::move(help), type,
                   std::move(label_names)),
        factory_(std::move(factory)) {}

  // The series for `values` (one per label name; aborts otherwise), created
  // on first use. Takes the family's mutex: look up once, keep the pointer.
  std::shared_ptr<Metric> WithLabels(const std::vector<std::string>& values);
  // Forgets a series (it is no longer rendered); holders keep a valid one.
  void Remove(const std::vector<std::string>& values);
  void Render(std::string* out) const override;

 private:
  const Factory factory_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::shared_ptr<Metric>> series_
      ABSL_GUARDED_BY(mu_);
};

// Values read at scrape time (counters and gauges only).
struct CollectedFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  std::vector<std::pair<std::vector<std::string>, double>> samples;
};
using Collector = std::function<void(std::vector<CollectedFamily>* out)>;

class Registry {
 public:
  Family<Counter>* AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>* AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>* AddHistogram(std::string name, std::string help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> bounds);
  // `collect` runs on every Render, after the registered families; it must
  // not call back into the registry.
  void AddCollector(Collector collect);

  // The text exposition format, families in registration order, series
  // sorted by label values. A collected family whose name is registered
  // already, or invalid, aborts (a programming error).
  std::string Render() const;

 private:
  // Registers a family of a new name (a name registered twice aborts).
  template <typename Metric>
  Family<Metric>* Add(std::string name, std::string help, MetricType type,
                      std::vector<std::string> label_names,
                      typename Family<Metric>::Factory factory);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

// ---- Exposition helpers (exposed for tests) ----

// Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*; label names
// [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__".
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);
// Label values escape \, " and newline; HELP text escapes \ and newline.
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);
// Integers exactly, others with round-trip precision, +Inf, -Inf, NaN.
std::string FormatValue(double v);
// `name{a="x",b="y"} value\n` (no braces without labels). `extra_name` /
// `extra_value`, when set, add one more label after the others (le).
void AppendSample(std::string* out, absl::string_view name,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, double value,
                  absl::string_view extra_name = {},
                  absl::string_view extra_value = {});

// ---- Family template ----

template <>
void Family<Counter>::Render(std::string* out) const;
template <>
void Family<Gauge>::Render(std::string* out) const;
template <>
void Family<Histogram>::Render(std::string* out) const;

template <typename Metric>
std::shared_ptr<Metric> Family<Metric>::WithLabels(
    const std::vector<std::string>& values) {
  // A wrong count is a programming error (label values come from our code).
  KVH_CHECK(values.size() == label_names_.size(),
            "metrics: %s takes %u label values, got %u", name(),
            label_names_.size(), values.size());
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = series_.find(values);
    if (it != series_.end()) return it->second;
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Metric>& slot = series_[values];
  if (slot == nullptr) slot = factory_();
  return slot;
}

template <typename Metric>
void Family<Metric>::Remove(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  series_.erase(values);
}

}  // namespace metrics
}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_METRICS_METRICS_H_
