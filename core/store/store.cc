#include "core/store/store.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/codec/codec.h"
#include "core/codec/fp8/fp8_codec.h"
#include "core/memory/page_pool.h"
#include "core/transform/kvcm_compressor.h"
#include "core/transform/kvcm_format.h"

namespace kvharbor {

absl::Status ValidateNamespaceName(absl::string_view name,
                                   absl::string_view field) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a namespace name has 1 to 128 characters, got %u",
                        field, name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' has a character outside [A-Za-z0-9_.-]",
                          field, absl::CHexEscape(name)));
    }
  }
  return absl::OkStatus();
}

namespace {

// The namespace's codec, built through the default registry from its
// calibration (spec.calibration_path read by the codec's reader, or the
// canonical bytes inline in spec.calibration), into `config`. Errors name
// the spec field.
absl::Status ResolveCodec(const NamespaceSpec& spec, const std::string& codec,
                          NamespaceConfig* config) {
  const CodecRegistry& registry = CodecRegistry::Default();
  absl::StatusOr<bool> takes = registry.TakesCalibration(codec);
  if (!takes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("spec.codec: unknown codec '%s' (available: %s)", codec,
                        absl::StrJoin(registry.Names(), ", ")));
  }
  const bool has_path = !spec.calibration_path.empty();
  const bool has_inline = !spec.calibration.empty();
  const char* field =
      has_inline ? "spec.calibration: " : "spec.calibration_path: ";
  const OnlineCalibrationOptions& online = spec.online_calibration;
  if (online.enabled) {
    if (codec != "kvtc") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "spec.online_calibration: needs spec.codec kvtc, not '%s'", codec));
    }
    KVH_RETURN_IF_ERROR(ValidateOnlineCalibration(online, spec.geometry,
                                                  "spec.online_calibration"));
    config->online = ResolveOnlineCalibration(online, spec.geometry);
    if (!has_path && !has_inline) {
      // Calibration-free start: the fp8 fallback until calibrated.
      CodecParams params;
      params.geometry = spec.geometry;
      KVH_ASSIGN_OR_RETURN(config->tier_codec,
                           registry.Create(kFp8CodecName, params));
      return absl::OkStatus();
    }
  }
  if (!*takes) {
    if (has_path || has_inline) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "the ", codec,
          " codec takes no calibration (only calibrated codecs do)"));
    }
  } else if (has_path == has_inline) {
    return absl::InvalidArgumentError(
        has_path ? "spec.calibration: give spec.calibration_path or "
                   "spec.calibration, not both"
                 : absl::StrCat("spec.calibration_path: required by the ",
                                codec, " codec (or spec.calibration inline)"));
  }
  CodecParams params;
  params.geometry = spec.geometry;
  if (has_inline) {
    params.calibration_bytes =
        std::make_shared<const std::string>(spec.calibration);
  } else if (has_path) {
    absl::StatusOr<std::string> bytes =
        registry.ReadCalibration(codec, spec.calibration_path, spec.geometry);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, bytes.status().message()));
    }
    params.calibration_bytes =
        std::make_shared<const std::string>(*std::move(bytes));
  }
  absl::StatusOr<std::unique_ptr<Codec>> c = registry.Create(codec, params);
  if (!c.ok()) {
    // Calibrated codecs fail on their calibration (the geometry is valid).
    return absl::InvalidArgumentError(
        absl::StrCat(*takes ? field : "spec.codec: ", c.status().message()));
  }
  if (params.calibration_bytes != nullptr) {
    config->calibration = *params.calibration_bytes;
  }
  config->calibration_fingerprint = (*c)->calibration_fingerprint();
  config->tier_codec = std::shared_ptr<const Codec>(*std::move(c));
  return absl::OkStatus();
}

// Codec, calibration and tier budgets of `spec` into `config`; errors name
// the spec field.
absl::Status ResolveTiers(const NamespaceSpec& spec, const std::string& codec,
                          NamespaceConfig* config) {
  KVH_RETURN_IF_ERROR(ResolveCodec(spec, codec, config));
  if (!spec.disk_dir.empty() && spec.host_compressed_bytes == 0) {
    return absl::InvalidArgumentError(
        "spec.disk_dir: a disk tier needs spec.host_compressed_bytes > 0");
  }
  if (spec.disk_bytes > 0 && spec.disk_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec.disk_bytes: set without spec.disk_dir");
  }
  config->host_compressed_bytes = spec.host_compressed_bytes;
  config->disk_dir = spec.disk_dir;
  config->disk_bytes = spec.disk_bytes;
  return absl::OkStatus();
}

// The KVCM compressor of spec.kvcm_path, checked against the geometry, into
// `config`; errors name spec.kvcm_path.
absl::Status ResolveKvcm(const NamespaceSpec& spec, NamespaceConfig* config) {
  if (spec.kvcm_path.empty()) return absl::OkStatus();
  absl::StatusOr<KvcmWeights> weights = ReadKvcmWeightsFile(spec.kvcm_path);
  if (!weights.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.kvcm_path: ", weights.status().message()));
  }
  const Geometry& g = spec.geometry;
  absl::StatusOr<std::unique_ptr<KvcmCompressor>> compressor =
      KvcmCompressor::Create(
          std::make_shared<const KvcmWeights>(*std::move(weights)),
          g.num_layers, g.num_kv_heads, g.head_dim);
  if (!compressor.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.kvcm_path: '", spec.kvcm_path,
        "' does not fit the geometry: ", compressor.status().message()));
  }
  config->kvcm_path = spec.kvcm_path;
  config->kvcm = std::shared_ptr<const KvTransform>(*std::move(compressor));
  return absl::OkStatus();
}

// `dir` absolute, without "." / ".." / repeated or trailing separators, so
// that two spellings of one directory compare equal ("" stays "").
std::string NormalDir(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) p = dir;
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

}  // namespace

struct Store::Members {
  absl::Mutex mu;
  std::vector<std::weak_ptr<Namespace>> namespaces ABSL_GUARDED_BY(mu);

  void Add(const std::shared_ptr<Namespace>& ns) {
    absl::MutexLock l(&mu);
    namespaces.erase(std::remove_if(namespaces.begin(), namespaces.end(),
                                    [](const auto& w) { return w.expired(); }),
                     namespaces.end());
    namespaces.push_back(ns);
  }
  std::vector<std::shared_ptr<Namespace>> Live() {
    absl::MutexLock l(&mu);
    std::vector<std::shared_ptr<Namespace>> out;
    for (const auto& w : namespaces) {
      if (auto ns = w.lock()) out.push_back(std::move(ns));
    }
    return out;
  }
  // Takes memory from the namespace holding the most, down towards the next
  // largest, in steps, so that under pressure the largest shrink first and
  // no one namespace is emptied to feed another of the same size.
  uint64_t Reclaim(uint64_t bytes) {
    std::vector<std::shared_ptr<Namespace>> all = Live();
    uint64_t freed = 0;
    while (freed < bytes && !all.empty()) {
      std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
        return a->memory_bytes() > b->memory_bytes();
      });
      const uint64_t top = all[0]->memory_bytes();
      const uint64_t next = all.size() > 1 ? all[1]->memory_bytes() : 0;
      const uint64_t left = bytes - freed;
      const uint64_t step = std::min(left, std::max(top - next, left / 4 + 1));
      const uint64_t got = all[0]->ReclaimMemory(step);
      if (got == 0) {
        all.erase(all.begin());  // holds nothing it can give back
        continue;
      }
      freed += got;
    }
    return freed;
  }
};

Store::Store(StoreOptions options)
    : options_(std::move(options)),
      budget_(std::make_shared<MemoryBudget>(options_.pool_budget_bytes)),
      members_(std::make_shared<Members>()),
      calibrator_(
          std::make_shared<OnlineCalibrator>(options_.online_calibrate)) {}

uint64_t Store::Reclaim(uint64_t bytes) { return members_->Reclaim(bytes); }

absl::StatusOr<std::unique_ptr<PagePool>> Store::CreatePool(
    uint64_t page_bytes, uint32_t pages, const NamespaceSpec& spec,
    NamespaceConfig* config) const {
  DeviceTier* device = options_.device_tier.get();
  if (device == nullptr) {
    absl::StatusOr<std::unique_ptr<HostPagePool>> pool =
        HostPagePool::Create(page_bytes, pages, options_.host_arena);
    if (!pool.ok()) {
      return absl::Status(
          pool.status().code(),
          absl::StrCat("spec.capacity_bytes: ", pool.status().message()));
    }
    return std::unique_ptr<PagePool>(*std::move(pool));
  }
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      device->CreatePool(page_bytes, pages);
  if (!pool.ok()) {
    return absl::Status(
        pool.status().code(),
        absl::StrCat("spec.capacity_bytes: ", pool.status().message()));
  }
  // The namespace makes its GPU encoders and decoders from the tier, one
  // pair per calibration it uses (core/store/device_tier.h).
  config->device_tier = options_.device_tier;
  return pool;
}

absl::StatusOr<std::pair<std::shared_ptr<Namespace>, bool>>
Store::CreateNamespace(const NamespaceSpec& spec, bool if_not_exists) {
  KVH_RETURN_IF_ERROR(ValidateNamespaceName(spec.name, "spec.name"));
  KVH_RETURN_IF_ERROR(spec.geometry.Validate("spec.geometry"));
  const std::string codec = spec.codec.empty() ? "identity" : spec.codec;
  NamespaceConfig config;
  KVH_RETURN_IF_ERROR(ResolveTiers(spec, codec, &config));
  KVH_RETURN_IF_ERROR(ResolveKvcm(spec, &config));
  const uint64_t page_bytes = spec.geometry.PageBytes();

  KVH_ASSIGN_OR_RETURN(config.topology,
                       spec.topology.Resolved(spec.geometry, "spec.topology"));
  const std::string disk_dir = NormalDir(spec.disk_dir);
  absl::MutexLock l(&mu_);
  if (auto it = namespaces_.find(spec.name); it != namespaces_.end()) {
    // Another tenant's namespace is never handed out; the message does not
    // describe it either.
    const NamespaceConfig& have = it->second->config();
    if (!if_not_exists || have.tenant != spec.tenant) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "spec.name: namespace '%s' already exists", spec.name));
    }
    // Processes whose pages differ (model, stage, rank, dtype, ...) must
    // not share a namespace: name what differs (issue 32 item 2).
    const std::string diff =
        NamespaceIdentityDiff({have.geometry, have.key_kind, have.topology},
                              {spec.geometry, spec.key_kind, config.topology});
    if (diff.empty()) return std::make_pair(it->second, false);
    return absl::AlreadyExistsError(absl::StrFormat(
        "spec.%s: namespace '%s' already exists with another identity; its "
        "pages would be read as this spec's",
        diff, spec.name));
  }
  if (!disk_dir.empty()) KVH_RETURN_IF_ERROR(CheckDiskDirFreeLocked(disk_dir));
  KVH_ASSIGN_OR_RETURN(const uint32_t pages,
                       CapacityPagesLocked(spec, page_bytes));
  const uint64_t bytes = uint64_t{pages} * page_bytes;
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool,
                       CreatePool(page_bytes, pages, spec, &config));
  config.capacity_bytes = bytes;
  config.codec = codec;
  config.budget = budget_;
  std::weak_ptr<Members> members = members_;
  config.reclaim = [members](uint64_t n) -> uint64_t {
    auto m = members.lock();
    return m != nullptr ? m->Reclaim(n) : 0;
  };
  FillConfig(spec, &config);
  absl::StatusOr<std::shared_ptr<Namespace>> created =
      Namespace::Create(std::move(config), std::move(pool));
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat("spec.", created.status().message()));
  }
  std::shared_ptr<Namespace> ns = *std::move(created);
  if (reserves_capacity()) reserved_bytes_ += bytes;
  members_->Add(ns);
  namespaces_.emplace(spec.name, ns);
  if (!disk_dir.empty()) disk_dirs_[disk_dir] = ns;
  return std::make_pair(ns, true);
}

absl::StatusOr<uint32_t> Store::CapacityPagesLocked(const NamespaceSpec& spec,
                                                    uint64_t page_bytes) const {
  const uint64_t budget = options_.pool_budget_bytes;
  if (spec.host_compressed_bytes > budget) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec.host_compressed_bytes: %u bytes is more than the daemon's "
        "memory budget of %u bytes (store.pool_budget_bytes), which the host "
        "tier shares with the pools",
        spec.host_compressed_bytes, budget));
  }
  if (spec.capacity_bytes > budget) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec.capacity_bytes: %u bytes is more than the daemon's memory "
        "budget of %u bytes (store.pool_budget_bytes)",
        spec.capacity_bytes, budget));
  }
  // Private pools: a cap, charged as pages are written. An arena: reserved.
  const uint64_t left = reserves_capacity() ? budget - reserved_bytes_ : budget;
  uint64_t want = spec.capacity_bytes;
  if (want == 0) {
    want = options_.default_namespace_bytes;
    if (want == 0) {
      want = reserves_capacity() ? std::min(uint64_t{1} << 30, left) : budget;
    }
    want = std::min(want, left);
  }
  uint64_t pages = std::min<uint64_t>(want / page_bytes, UINT32_MAX - 1);
  if (pages == 0) {
    if (spec.capacity_bytes == 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "spec.capacity_bytes: the daemon's pool budget has %u bytes left, "
          "less than one page of %u bytes",
          left, page_bytes));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec.capacity_bytes: %u bytes hold no page of %u bytes",
        spec.capacity_bytes, page_bytes));
  }
  const uint64_t bytes = pages * page_bytes;
  if (reserves_capacity() && bytes > left) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "spec.capacity_bytes: %u bytes requested, %u left in the daemon's pool "
        "budget of %u bytes (with %s, capacities are reserved up front)",
        bytes, left, budget,
        options_.device_tier != nullptr ? "a device tier"
                                        : "store.host_ipc_socket"));
  }
  return static_cast<uint32_t>(pages);
}

void Store::FillConfig(const NamespaceSpec& spec,
                       NamespaceConfig* config) const {
  config->name = spec.name;
  config->tenant = spec.tenant;
  config->geometry = spec.geometry;
  config->key_kind = spec.key_kind;
  config->default_lease_ttl = options_.default_lease_ttl;
  config->max_lease_ttl = options_.max_lease_ttl;
  config->max_tokens_per_request = options_.max_tokens_per_request;
  config->promote_on_fetch = options_.promote_on_fetch;
  if (options_.log) {
    config->log = [log = options_.log, name = spec.name](const std::string& l) {
      log(name, l);
    };
  }
  if (options_.warn) {
    config->warn = [warn = options_.warn,
                    name = spec.name](const std::string& l) { warn(name, l); };
  }
  if (config->online.enabled) {
    // Weak: a namespace that outlives the store (held by a late reader)
    // finds the calibrator gone and is simply not calibrated.
    std::weak_ptr<OnlineCalibrator> weak = calibrator_;
    config->request_calibration = [weak](std::weak_ptr<Namespace> ns) {
      if (auto calibrator = weak.lock()) calibrator->Enqueue(std::move(ns));
    };
  }
}

absl::Status Store::CheckDiskDirFreeLocked(const std::string& dir) {
  for (auto it = disk_dirs_.begin(); it != disk_dirs_.end();) {
    it = it->second.expired() ? disk_dirs_.erase(it) : std::next(it);
  }
  auto it = disk_dirs_.find(dir);
  if (it == disk_dirs_.end()) return absl::OkStatus();
  const std::shared_ptr<Namespace> user = it->second.lock();
  if (user == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "spec.disk_dir: '%s' is the disk tier of namespace '%s'%s", dir,
      user->name(),
      user->deleted() ? ", which was deleted but is still used by requests "
                        "in flight; retry when they are done"
                      : ""));
}

absl::StatusOr<std::shared_ptr<Namespace>> Store::Get(
    absl::string_view name) const {
  absl::MutexLock l(&mu_);
  auto it = namespaces_.find(name);
  if (it == namespaces_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("namespace: '%s' does not exist", name));
  }
  return it->second;
}

std::vector<std::shared_ptr<Namespace>> Store::List() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Namespace>> out;
  out.reserve(namespaces_.size());
  for (const auto& [name, ns] : namespaces_) out.push_back(ns);
  return out;
}

absl::Status Store::DeleteNamespace(absl::string_view name, bool force) {
  absl::MutexLock l(&mu_);
  auto it = namespaces_.find(name);
  if (it == namespaces_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("namespace: '%s' does not exist", name));
  }
  std::shared_ptr<Namespace> ns = it->second;
  if (ns->Busy() && !force) {
    const NamespaceStats c = ns->Counters();
    return absl::FailedPreconditionError(absl::StrFormat(
        "namespace: '%s' has %u active leases and %u uploads in flight; "
        "set force to delete it anyway",
        name, c.active_leases, c.uploads_in_flight));
  }
  ns->MarkDeleted();  // a running online calibration is dropped
  if (ns->Busy()) ns->ReleaseAllLeases();
  // Readers and uploads still holding the namespace keep it alive; its
  // reservation goes back now because no new work can reach it (what it
  // holds in the budget goes when the last holder lets go).
  if (reserves_capacity()) reserved_bytes_ -= ns->config().capacity_bytes;
  namespaces_.erase(it);
  return absl::OkStatus();
}

absl::Status Store::Release(uint64_t lease_id) {
  for (const auto& ns : List()) {
    if (ns->HasLease(lease_id)) return ns->Release(lease_id);
  }
  return absl::NotFoundError(
      absl::StrFormat("lease_id: %u is not an active lease", lease_id));
}

absl::StatusOr<absl::Time> Store::ExtendLease(uint64_t lease_id,
                                              absl::Duration ttl) {
  for (const auto& ns : List()) {
    if (ns->HasLease(lease_id)) return ns->ExtendLease(lease_id, ttl);
  }
  return absl::NotFoundError(
      absl::StrFormat("lease_id: %u is not an active lease", lease_id));
}

size_t Store::ReapExpiredLeases(absl::Time now) {
  size_t n = 0;
  for (const auto& ns : List()) n += ns->ReapExpiredLeases(now);
  return n;
}

GlobalStats Store::Counters() const {
  GlobalStats c;
  c.pool_budget_bytes = options_.pool_budget_bytes;
  std::vector<std::shared_ptr<Namespace>> all = List();
  {
    absl::MutexLock l(&mu_);
    c.pool_reserved_bytes = reserved_bytes_;
  }
  c.memory_used_bytes = budget_->used();
  c.namespaces = all.size();
  for (const auto& ns : all) AddNamespaceStats(ns->Counters(), &c);
  return c;
}

void AddNamespaceStats(const NamespaceStats& n, GlobalStats* c) {
  c->hit_tokens += n.hit_tokens;
  c->miss_tokens += n.miss_tokens;
  c->bytes_in += n.bytes_in;
  c->bytes_out += n.bytes_out;
  c->cached_pages += n.cached_pages;
  c->active_leases += n.active_leases;
}

}  // namespace kvharbor
