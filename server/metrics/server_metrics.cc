#include "server/metrics/server_metrics.h"

#include <deque>
#include <utility>
#include <vector>

#include "types/tier.h"

namespace kvharbor {

namespace {

using metrics::CollectedFamily;
using metrics::MetricType;

// 100 us .. 10 s: a Match is tens of microseconds, a large Fetch seconds.
const std::vector<double>& LatencyBounds() {
  static const auto* b = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *b;
}

// 0 (a full miss), then 16 .. 1M tokens by powers of 4.
std::vector<double> PrefixBounds() {
  std::vector<double> b{0};
  for (double v : metrics::ExponentialBuckets(16, 4, 9)) b.push_back(v);
  return b;
}

class FamilySet {
 public:
  CollectedFamily* Add(std::string name, std::string help, MetricType type,
                       std::vector<std::string> labels) {
    families_.push_back(CollectedFamily{
        std::move(name), std::move(help), type, std::move(labels), {}});
    return &families_.back();
  }
  void MoveTo(std::vector<CollectedFamily>* out) {
    for (CollectedFamily& f : families_) out->push_back(std::move(f));
  }

 private:
  std::deque<CollectedFamily> families_;  // stable element addresses
};

// The per-namespace families of CollectStore, in exposition order.
struct NamespaceFamilies {
  CollectedFamily* hit = nullptr;
  CollectedFamily* miss = nullptr;
  CollectedFamily* pages = nullptr;
  CollectedFamily* bytes = nullptr;
  CollectedFamily* capacity = nullptr;
  CollectedFamily* ratio = nullptr;  // per codec
  CollectedFamily* codec_pages = nullptr;
  CollectedFamily* expected_ratio = nullptr;
  CollectedFamily* expected_error = nullptr;
  CollectedFamily* evicted = nullptr;
  CollectedFamily* demoted = nullptr;
  CollectedFamily* promoted = nullptr;
  CollectedFamily* inserted = nullptr;
  CollectedFamily* dedup = nullptr;
  CollectedFamily* in = nullptr;
  CollectedFamily* sent = nullptr;
  CollectedFamily* offered = nullptr;
  CollectedFamily* leases = nullptr;
  CollectedFamily* uploads = nullptr;
  CollectedFamily* corrupt = nullptr;
  CollectedFamily* disk_errors = nullptr;
  CollectedFamily* memory = nullptr;
  CollectedFamily* cal_state = nullptr;
  CollectedFamily* cal_sampled = nullptr;
};

CollectedFamily* NamespaceCounter(FamilySet* fs, const char* name,
                                  const char* help) {
  return fs->Add(name, help, MetricType::kCounter, {"namespace"});
}

CollectedFamily* NamespaceGauge(FamilySet* fs, const char* name,
                                const char* help,
                                std::vector<std::string> labels = {
                                    "namespace"}) {
  return fs->Add(name, help, MetricType::kGauge, std::move(labels));
}

// The per-namespace families of cache contents and calibration, then of
// traffic and evictions (AddNamespaceTrafficFamilies), in render order.
void AddNamespaceContentFamilies(FamilySet* fs, NamespaceFamilies* f) {
  f->hit = NamespaceCounter(fs, "kvharbor_match_hit_tokens_total",
                            "Tokens of Match requests found cached.");
  f->miss = NamespaceCounter(fs, "kvharbor_match_miss_tokens_total",
                             "Tokens of Match requests not cached.");
  f->pages = NamespaceGauge(fs, "kvharbor_namespace_pages",
                            "Cached pages by tier.", {"namespace", "tier"});
  f->bytes = NamespaceGauge(
      fs, "kvharbor_namespace_stored_bytes",
      "Bytes the cached pages take by tier (raw: page bytes; cold tiers: "
      "codec buffers).",
      {"namespace", "tier"});
  f->capacity = NamespaceGauge(fs, "kvharbor_namespace_capacity_pages",
                               "Pages the raw tier's pool holds.");
  f->ratio = NamespaceGauge(
      fs, "kvharbor_namespace_compression_ratio",
      "Raw bytes of the cold pages one codec encoded over the bytes they take "
      "in the cold tiers (per codec; only while it has cold pages).",
      {"namespace", "codec"});
  f->codec_pages = NamespaceGauge(
      fs, "kvharbor_namespace_codec_pages",
      "Cold pages (all cold tiers) by the codec that encoded them.",
      {"namespace", "codec"});
  f->expected_ratio = NamespaceGauge(
      fs, "kvharbor_namespace_calibration_expected_ratio",
      "Raw / stored bytes the active calibration expected (only when "
      "it records one).");
  f->expected_error = NamespaceGauge(
      fs, "kvharbor_namespace_calibration_expected_rel_error",
      "Relative error (sqrt of squared error over variance) the active "
      "calibration expected on its rows, by kv (keys, values).",
      {"namespace", "kv"});
}

void AddNamespaceTrafficFamilies(FamilySet* fs, NamespaceFamilies* f) {
  f->evicted = NamespaceCounter(
      fs, "kvharbor_evicted_pages_total",
      "Pages removed from the cache (evicted or dropped from the coldest "
      "tier).");
  f->demoted = NamespaceCounter(fs, "kvharbor_demoted_pages_total",
                                "Pages moved to a colder tier.");
  f->promoted = NamespaceCounter(
      fs, "kvharbor_promoted_pages_total",
      "Cold pages made raw again by an insert of their prefix.");
  f->inserted = NamespaceCounter(fs, "kvharbor_inserted_pages_total",
                                 "Pages stored by Insert.");
  f->dedup = NamespaceCounter(fs, "kvharbor_dedup_pages_total",
                              "Pages an Insert sent that were cached already.");
  f->in = NamespaceCounter(fs, "kvharbor_received_bytes_total",
                           "Page bytes received by Insert.");
  f->sent = NamespaceCounter(fs, "kvharbor_sent_bytes_total",
                             "Page bytes sent by Fetch.");
  f->offered = NamespaceCounter(
      fs, "kvharbor_host_ipc_offered_bytes_total",
      "Page bytes GetHostHandles described for same-host copies out of "
      "shared memory (not in kvharbor_sent_bytes_total).");
  f->leases = NamespaceGauge(fs, "kvharbor_leases_active",
                             "Leases held (Match with lock).");
  f->uploads = NamespaceGauge(fs, "kvharbor_uploads_in_flight",
                              "Inserts begun, not yet finished.");
  f->corrupt = NamespaceCounter(
      fs, "kvharbor_corrupt_pages_dropped_total",
      "Cold pages (host-compressed buffers, disk files) dropped because "
      "their stored bytes failed a checksum; never served.");
  f->disk_errors = NamespaceCounter(fs, "kvharbor_disk_write_errors_total",
                                    "Failed disk-tier page writes.");
  f->memory = NamespaceGauge(
      fs, "kvharbor_namespace_memory_bytes",
      "Bytes the namespace holds in the memory budget (written raw "
      "pages, metadata, host-compressed buffers).");
  f->cal_state = NamespaceGauge(
      fs, "kvharbor_namespace_calibration_state",
      "Online calibration state (0 none, 1 sampling, 2 calibrating, 3 "
      "ready).");
  f->cal_sampled =
      NamespaceGauge(fs, "kvharbor_namespace_calibration_sampled_tokens",
                     "Tokens in the online calibration sample.");
}

NamespaceFamilies AddNamespaceFamilies(FamilySet* fs) {
  NamespaceFamilies f;
  AddNamespaceContentFamilies(fs, &f);
  AddNamespaceTrafficFamilies(fs, &f);
  return f;
}

// One namespace's samples (stats `c`) in every family of `f`.
void AddNamespaceSamples(const NamespaceStats& c, const NamespaceFamilies& f) {
  const std::vector<std::string> l{c.name};
  f.hit->samples.emplace_back(l, c.hit_tokens);
  f.miss->samples.emplace_back(l, c.miss_tokens);
  for (int t = 0; t < kNumTiers; ++t) {
    const std::vector<std::string> lt{
        c.name, std::string(TierName(static_cast<Tier>(t)))};
    f.pages->samples.emplace_back(lt, c.tiers[t].pages);
    f.bytes->samples.emplace_back(lt, c.tiers[t].bytes);
  }
  f.capacity->samples.emplace_back(l, c.capacity_pages);
  for (const CodecStats& cs : c.codecs) {
    const std::vector<std::string> lc{c.name, cs.codec};
    f.codec_pages->samples.emplace_back(lc, cs.pages);
    if (cs.bytes > 0) {
      f.ratio->samples.emplace_back(
          lc, static_cast<double>(cs.pages * c.page_bytes) /
                  static_cast<double>(cs.bytes));
    }
  }
  f.evicted->samples.emplace_back(l, c.evicted_pages);
  f.demoted->samples.emplace_back(l, c.demoted_pages);
  f.promoted->samples.emplace_back(l, c.promoted_pages);
  f.inserted->samples.emplace_back(l, c.inserted_pages);
  f.dedup->samples.emplace_back(l, c.dedup_pages);
  f.in->samples.emplace_back(l, c.bytes_in);
  f.sent->samples.emplace_back(l, c.bytes_out);
  f.offered->samples.emplace_back(l, c.host_ipc_bytes);
  f.leases->samples.emplace_back(l, c.active_leases);
  f.uploads->samples.emplace_back(l, c.uploads_in_flight);
  f.corrupt->samples.emplace_back(l, c.corrupt_dropped);
  f.cal_state->samples.emplace_back(l, static_cast<int>(c.calibration.state));
  f.cal_sampled->samples.emplace_back(l, c.calibration.tokens_sampled);
  const CalibrationEstimate& e = c.calibration.expected;
  if (e.expected_ratio > 0) {
    f.expected_ratio->samples.emplace_back(l, e.expected_ratio);
    f.expected_error->samples.emplace_back(
        std::vector<std::string>{c.name, "keys"}, e.keys_rel_error);
    f.expected_error->samples.emplace_back(
        std::vector<std::string>{c.name, "values"}, e.values_rel_error);
  }
  f.disk_errors->samples.emplace_back(l, c.disk_write_errors);
  f.memory->samples.emplace_back(l, c.memory_bytes);
}

// The store-wide and call-limit gauges.
void AddStoreFamilies(const Store& store,
                      const std::function<CallCounters()>& calls,
                      FamilySet* fs) {
  // One unlabelled sample per family.
  auto scalar = [&](const char* name, const char* help, MetricType type,
                    double value) {
    fs->Add(name, help, type, {})
        ->samples.emplace_back(std::vector<std::string>{}, value);
  };
  const GlobalStats s = store.Counters();
  scalar("kvharbor_pool_budget_bytes",
         "Host memory all namespaces may hold together (raw pages, metadata, "
         "host-compressed tiers).",
         MetricType::kGauge, s.pool_budget_bytes);
  scalar("kvharbor_pool_reserved_bytes",
         "Capacities reserved up front from the budget (shared host arena or "
         "device tier only).",
         MetricType::kGauge, s.pool_reserved_bytes);
  scalar("kvharbor_memory_used_bytes",
         "Bytes the namespaces hold in the memory budget.", MetricType::kGauge,
         s.memory_used_bytes);
  scalar("kvharbor_namespaces", "Namespaces in the store.", MetricType::kGauge,
         s.namespaces);
  if (calls) {
    const CallCounters c = calls();
    scalar("kvharbor_rpcs_in_flight",
           "KvHarbor calls between their handler and their end.",
           MetricType::kGauge, c.in_flight);
    scalar("kvharbor_rpcs_rejected_total",
           "KvHarbor calls turned away with RESOURCE_EXHAUSTED by "
           "limits.max_in_flight_calls, _per_tenant or _per_connection.",
           MetricType::kCounter, c.rejected);
    scalar("kvharbor_rpcs_idle_cancelled_total",
           "Insert and Fetch streams cancelled for making no progress "
           "(limits.upload_idle_timeout_ms, fetch_idle_timeout_ms).",
           MetricType::kCounter, c.idle_cancelled);
    if (c.data_plane) {
      scalar("kvharbor_data_plane_bytes_total",
             "Page bytes moved on the bulk data plane, both ways.",
             MetricType::kCounter, c.data_plane_bytes);
      scalar("kvharbor_data_plane_refused_total",
             "Bulk data plane connections refused for "
             "data_plane.max_connections.",
             MetricType::kCounter, c.data_plane_refused);
    }
  }
}

void CollectStore(const Store& store,
                  const std::function<CallCounters()>& calls,
                  std::vector<CollectedFamily>* out) {
  FamilySet fs;
  const NamespaceFamilies f = AddNamespaceFamilies(&fs);
  for (const std::shared_ptr<Namespace>& ns : store.List()) {
    AddNamespaceSamples(ns->Counters(), f);
  }
  AddStoreFamilies(store, calls, &fs);
  fs.MoveTo(out);
}

}  // namespace

absl::string_view RpcMethodName(RpcMethod m) {
  static constexpr const char* kNames[kNumRpcMethods] = {"CreateNamespace",
                                                         "DescribeNamespace",
                                                         "ListNamespaces",
                                                         "DeleteNamespace",
                                                         "Match",
                                                         "Insert",
                                                         "Fetch",
                                                         "Release",
                                                         "ExtendLease",
                                                         "Evict",
                                                         "Stats",
                                                         "DumpTree",
                                                         "GetCalibration",
                                                         "Demote",
                                                         "UploadCalibration",
                                                         "ListCalibrations",
                                                         "PinCalibration",
                                                         "GetDeviceHandles",
                                                         "GetHostHandles",
                                                         "DeviceInsert"};
  const int i = static_cast<int>(m);
  return i >= 0 && i < kNumRpcMethods ? kNames[i] : "unknown";
}

absl::string_view GrpcCodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

ServerMetrics::ServerMetrics() {
  latency_ = registry_.AddHistogram(
      "kvharbor_rpc_duration_seconds",
      "KvHarbor call latency from the handler until gRPC is done with the "
      "call, by method.",
      {"method"}, LatencyBounds());
  handled_ = registry_.AddCounter(
      "kvharbor_rpcs_handled_total",
      "KvHarbor calls completed, by method and gRPC status code.",
      {"method", "code"});
  match_prefix_ = registry_.AddHistogram(
      "kvharbor_match_prefix_tokens",
      "Matched prefix length of Match requests, in tokens.", {"namespace"},
      PrefixBounds());
  for (int m = 0; m < kNumRpcMethods; ++m) {
    methods_[m].latency = latency_->WithLabels(
        {std::string(RpcMethodName(static_cast<RpcMethod>(m)))});
  }
}

void ServerMetrics::RecordRpc(RpcMethod method, grpc::StatusCode code,
                              double seconds) {
  const int m = static_cast<int>(method);
  int c = static_cast<int>(code);
  if (m < 0 || m >= kNumRpcMethods) return;
  if (c < 0 || c >= kNumCodes) c = static_cast<int>(grpc::StatusCode::UNKNOWN);
  PerMethod& pm = methods_[m];
  pm.latency->Observe(seconds);
  metrics::Counter* counter = pm.handled[c].load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter =
        handled_
            ->WithLabels(
                {std::string(RpcMethodName(method)),
                 std::string(GrpcCodeName(static_cast<grpc::StatusCode>(c)))})
            .get();
    pm.handled[c].store(counter, std::memory_order_release);
  }
  counter->Inc();
}

void ServerMetrics::ObserveMatch(const std::string& ns, uint64_t tokens) {
  std::shared_ptr<metrics::Histogram> h;
  {
    absl::ReaderMutexLock lock(&prefix_mu_);
    auto it = prefix_by_ns_.find(ns);
    if (it != prefix_by_ns_.end()) h = it->second;
  }
  if (h == nullptr) {
    absl::MutexLock lock(&prefix_mu_);
    std::shared_ptr<metrics::Histogram>& slot = prefix_by_ns_[ns];
    if (slot == nullptr) slot = match_prefix_->WithLabels({ns});
    h = slot;
  }
  h->Observe(static_cast<double>(tokens));
}

void ServerMetrics::ForgetNamespace(const std::string& ns) {
  absl::MutexLock lock(&prefix_mu_);
  prefix_by_ns_.erase(ns);
  match_prefix_->Remove({ns});
}

void ServerMetrics::AttachStore(const Store* store,
                                std::function<CallCounters()> calls) {
  registry_.AddCollector([store, calls = std::move(calls)](
                             std::vector<metrics::CollectedFamily>* out) {
    if (store != nullptr) CollectStore(*store, calls, out);
  });
}

}  // namespace kvharbor
