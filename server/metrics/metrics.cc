#include "server/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvharbor {
namespace metrics {

namespace {

void AtomicAdd(std::atomic<double>* a, double delta) {
  double old = a->load(std::memory_order_relaxed);
  while (
      !a->compare_exchange_weak(old, old + delta, std::memory_order_relaxed)) {
  }
}

absl::string_view TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void CheckNames(const std::string& name,
                const std::vector<std::string>& label_names, bool histogram) {
  KVH_CHECK(IsValidMetricName(name), "metrics: invalid metric name '%s'", name);
  std::set<std::string> seen;
  for (const std::string& l : label_names) {
    KVH_CHECK(IsValidLabelName(l) && !(histogram && l == "le") &&
                  seen.insert(l).second,
              "metrics: %s: invalid or repeated label name '%s'", name, l);
  }
}

void RenderHelpType(std::string* out, absl::string_view name,
                    absl::string_view help, MetricType type) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n", "# TYPE ",
                  name, " ", TypeName(type), "\n");
}

}  // namespace

// ---- Values ----

void Gauge::Add(double delta) { AtomicAdd(&value_, delta); }

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)),
      buckets_(new std::atomic<uint64_t>[bounds_->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const auto it = std::lower_bound(bounds_->begin(), bounds_->end(), v);
  buckets_[it - bounds_->begin()].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, v);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// ---- Exposition helpers ----

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || c == ':' ||
                    (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        absl::ascii_isalpha(c) || c == '_' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

namespace {

// Backslash and newline escaped, and the double quote where `quotes` (label
// values are quoted, HELP texts are not).
std::string Escape(absl::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  return Escape(value, /*quotes=*/true);
}

std::string EscapeHelp(absl::string_view help) {
  return Escape(help, /*quotes=*/false);
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values below 2^53 are exact as integers (counters, bytes).
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  // The shortest form that reads back as the same double (0.00025, not
  // 0.00025000000000000001).
  for (int precision = 15; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

void AppendSample(std::string* out, absl::string_view name,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, double value,
                  absl::string_view extra_name, absl::string_view extra_value) {
  absl::StrAppend(out, name);
  if (!label_names.empty() || !extra_name.empty()) {
    out->push_back('{');
    for (size_t i = 0; i < label_names.size(); ++i) {
      absl::StrAppend(out, i == 0 ? "" : ",", label_names[i], "=\"",
                      EscapeLabelValue(label_values[i]), "\"");
    }
    if (!extra_name.empty()) {
      absl::StrAppend(out, label_names.empty() ? "" : ",", extra_name, "=\"",
                      EscapeLabelValue(extra_value), "\"");
    }
    out->push_back('}');
  }
  absl::StrAppend(out, " ", FormatValue(value), "\n");
}

// ---- Families ----

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  CheckNames(name_, label_names_, type_ == MetricType::kHistogram);
}

void FamilyBase::RenderHeader(std::string* out) const {
  RenderHelpType(out, name_, help_, type_);
}

template <>
void Family<Counter>::Render(std::string* out) const {
  RenderHeader(out);
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [values, c] : series_) {
    AppendSample(out, name_, label_names_, values,
                 static_cast<double>(c->Value()));
  }
}

template <>
void Family<Gauge>::Render(std::string* out) const {
  RenderHeader(out);
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [values, g] : series_) {
    AppendSample(out, name_, label_names_, values, g->Value());
  }
}

template <>
void Family<Histogram>::Render(std::string* out) const {
  RenderHeader(out);
  absl::ReaderMutexLock lock(&mu_);
  const std::string bucket = name_ + "_bucket";
  for (const auto& [values, h] : series_) {
    const Histogram::Snapshot s = h->Read();
    const std::vector<double>& bounds = h->bounds();
    for (size_t i = 0; i < bounds.size(); ++i) {
      AppendSample(out, bucket, label_names_, values,
                   static_cast<double>(s.cumulative[i]), "le",
                   FormatValue(bounds[i]));
    }
    const double count = static_cast<double>(s.cumulative.back());
    AppendSample(out, bucket, label_names_, values, count, "le", "+Inf");
    AppendSample(out, name_ + "_sum", label_names_, values, s.sum);
    AppendSample(out, name_ + "_count", label_names_, values, count);
  }
}

// ---- Registry ----

template <typename Metric>
Family<Metric>* Registry::Add(std::string name, std::string help,
                              MetricType type,
                              std::vector<std::string> label_names,
                              typename Family<Metric>::Factory factory) {
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) {
    KVH_CHECK(f->name() != name, "metrics: '%s' registered twice", name);
  }
  auto f = std::make_unique<Family<Metric>>(std::move(name), std::move(help),
                                            type, std::move(label_names),
                                            std::move(factory));
  Family<Metric>* raw = f.get();
  families_.push_back(std::move(f));
  return raw;
}

Family<Counter>* Registry::AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names) {
  return Add<Counter>(std::move(name), std::move(help), MetricType::kCounter,
                      std::move(label_names),
                      [] { return std::make_shared<Counter>(); });
}

Family<Gauge>* Registry::AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names) {
  return Add<Gauge>(std::move(name), std::move(help), MetricType::kGauge,
                    std::move(label_names),
                    [] { return std::make_shared<Gauge>(); });
}

Family<Histogram>* Registry::AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    KVH_CHECK(std::isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]),
              "metrics: %s: bounds must be finite and increasing", name);
  }
  auto shared = std::make_shared<const std::vector<double>>(std::move(bounds));
  return Add<Histogram>(
      std::move(name), std::move(help), MetricType::kHistogram,
      std::move(label_names),
      [shared] { return std::make_shared<Histogram>(shared); });
}

void Registry::AddCollector(Collector collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() const {
  std::string out;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& f : families_) f->Render(&out);
  std::vector<CollectedFamily> collected;
  for (const Collector& c : collectors_) c(&collected);
  std::set<std::string> names;
  for (const auto& f : families_) names.insert(f->name());
  for (const CollectedFamily& f : collected) {
    CheckNames(f.name, f.label_names, false);
    KVH_CHECK(f.type != MetricType::kHistogram && names.insert(f.name).second,
              "metrics: collected family '%s' is a duplicate or a histogram",
              f.name);
    RenderHelpType(&out, f.name, f.help, f.type);
    for (const auto& [values, v] : f.samples) {
      KVH_CHECK(values.size() == f.label_names.size(),
                "metrics: %s: sample with %u label values", f.name,
                values.size());
      AppendSample(&out, f.name, f.label_names, values, v);
    }
  }
  return out;
}

}  // namespace metrics
}  // namespace kvharbor
