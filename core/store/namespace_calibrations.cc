#include "core/store/namespace_calibrations.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kvharbor {

namespace {

constexpr uint32_t kMaxSource =
    static_cast<uint32_t>(CalibrationSource::kOnline);

}  // namespace

NamespaceCalibrations::NamespaceCalibrations(const NamespaceConfig& config)
    : config_(config) {}

NamespaceCalibrations::Record NamespaceCalibrations::MakeRecord(
    std::unique_ptr<Codec> codec, std::shared_ptr<const std::string> bytes,
    CalibrationSource source) const {
  Record rec;
  rec.codec = config_.codec;
  rec.fingerprint = codec->calibration_fingerprint();
  rec.bytes = std::move(bytes);
  rec.impl = std::shared_ptr<const Codec>(std::move(codec));
  rec.source = source;
  rec.created = absl::Now();
  return rec;
}

absl::Status NamespaceCalibrations::AttachDeviceCodecs(Record* rec) const {
  if (config_.device_tier == nullptr || config_.host_compressed_bytes == 0) {
    return absl::OkStatus();
  }
  DeviceEncoderParams params;
  params.codec = rec->codec;
  params.geometry = config_.geometry;
  params.calibration_bytes = rec->bytes;
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<PageBatchEncoder> encoder,
                       config_.device_tier->CreateEncoder(params));
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<PageBatchDecoder> decoder,
                       config_.device_tier->CreateDecoder(params));
  rec->gpu_encoder = std::move(encoder);
  rec->gpu_decoder = std::move(decoder);
  return absl::OkStatus();
}

void NamespaceCalibrations::AttachDeviceCodecsOrWarn(Record* rec) const {
  const absl::Status s = AttachDeviceCodecs(rec);
  if (!s.ok()) {
    LogWarning(config_,
               absl::StrFormat("calibration %#x has no GPU encoder / decoder, "
                               "its pages encode and decode on the CPU: %s",
                               rec->fingerprint, s.message()));
  }
}

std::shared_ptr<PageBatchEncoder> NamespaceCalibrations::GpuEncoderOf(
    const Codec* codec) const {
  absl::MutexLock l(&cal_mu_);
  const Record* r = RecordOfLocked(codec);
  return r != nullptr ? r->gpu_encoder : nullptr;
}

std::shared_ptr<PageBatchDecoder> NamespaceCalibrations::GpuDecoderOf(
    const Codec* codec) const {
  absl::MutexLock l(&cal_mu_);
  const Record* r = RecordOfLocked(codec);
  return r != nullptr ? r->gpu_decoder : nullptr;
}

const NamespaceCalibrations::Record* NamespaceCalibrations::RecordOfLocked(
    const Codec* codec) const {
  for (const Record& r : calibrations_) {
    if (r.impl.get() == codec) return &r;
  }
  return nullptr;
}

std::vector<NamespaceCalibrations::Record>::iterator
NamespaceCalibrations::FindLocked(absl::string_view codec,
                                  uint64_t fingerprint) {
  return std::find_if(calibrations_.begin(), calibrations_.end(),
                      [&](const Record& r) {
                        return r.codec == codec && r.fingerprint == fingerprint;
                      });
}

absl::Status NamespaceCalibrations::Init() {
  Record rec;
  if (!config_.calibration.empty()) {
    rec.codec = config_.codec;
    rec.fingerprint = config_.calibration_fingerprint;
    rec.bytes = std::make_shared<const std::string>(config_.calibration);
    rec.impl = config_.tier_codec;
    rec.source = CalibrationSource::kConfig;
    rec.created = absl::Now();
    // At creation a GPU that cannot take the calibration is an error (the
    // store names spec.codec), not a silent CPU fallback.
    if (absl::Status s = AttachDeviceCodecs(&rec); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("codec: ", s.message()));
    }
  }
  absl::MutexLock l(&cal_mu_);
  active_codec_ = config_.tier_codec;
  active_fingerprint_ = config_.calibration_fingerprint;
  if (rec.impl != nullptr) calibrations_.push_back(std::move(rec));
  if (config_.online.enabled) {
    KVH_RETURN_IF_ERROR(ValidateOnlineCalibration(
        config_.online, config_.geometry, "online_calibration"));
    sampler_ = std::make_unique<PageSampler>(config_.geometry, config_.online);
    state_ = CalibrationState::kSampling;
    next_request_tokens_.store(config_.online.min_tokens);
    sampling_.store(true);
  }
  return absl::OkStatus();
}

std::shared_ptr<const Codec> NamespaceCalibrations::tier_codec() const {
  absl::MutexLock l(&cal_mu_);
  return active_codec_;
}

CalibrationStats NamespaceCalibrations::status() const {
  CalibrationStats s;
  if (sampler_ != nullptr) {
    s.tokens_seen = sampler_->tokens_offered();
    s.tokens_sampled = sampler_->tokens_sampled();
  }
  absl::MutexLock l(&cal_mu_);
  s.state = state_;
  s.codec = std::string(active_codec_->name());
  s.fingerprint = active_fingerprint_;
  s.pinned = pinned_;
  s.expected = active_codec_->calibration_estimate();
  return s;
}

void NamespaceCalibrations::ActivateLocked(Record rec) {
  active_codec_ = rec.impl;
  active_fingerprint_ = rec.fingerprint;
  pinned_ = false;
  auto same = [&](const Record& r) {
    return r.fingerprint == rec.fingerprint && r.codec == rec.codec;
  };
  for (const Record& r : calibrations_) {
    if (same(r)) rec.persisted = rec.persisted || r.persisted;
  }
  calibrations_.erase(
      std::remove_if(calibrations_.begin(), calibrations_.end(), same),
      calibrations_.end());
  calibrations_.push_back(std::move(rec));
}

std::vector<CalibrationInfo> NamespaceCalibrations::List(
    const absl::flat_hash_map<uint64_t, uint64_t>& pages) const {
  std::vector<CalibrationInfo> out;
  absl::MutexLock l(&cal_mu_);
  for (const Record& r : calibrations_) {
    CalibrationInfo info;
    info.codec = r.codec;
    info.fingerprint = r.fingerprint;
    info.source = r.source;
    info.created = r.created;
    info.active = r.fingerprint == active_fingerprint_;
    info.pinned = info.active && pinned_;
    info.gpu = r.gpu_encoder != nullptr && r.gpu_decoder != nullptr;
    auto it = pages.find(r.fingerprint);
    info.pages = it == pages.end() ? 0 : it->second;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.active != b.active) return a.active;
    return a.created > b.created;
  });
  return out;
}

absl::StatusOr<std::pair<std::string, std::shared_ptr<const std::string>>>
NamespaceCalibrations::Get(uint64_t fingerprint) const {
  absl::MutexLock l(&cal_mu_);
  const uint64_t want = fingerprint == 0 ? active_fingerprint_ : fingerprint;
  for (const Record& r : calibrations_) {
    if (r.fingerprint == want) return std::make_pair(r.codec, r.bytes);
  }
  if (fingerprint == 0) {  // the active codec takes no calibration
    return std::make_pair(std::string(active_codec_->name()),
                          std::make_shared<const std::string>());
  }
  return absl::NotFoundError(absl::StrFormat(
      "calibration_fingerprint: %#x is not a calibration of namespace '%s'",
      fingerprint, config_.name));
}

absl::StatusOr<uint64_t> NamespaceCalibrations::Upload(
    std::string bytes, bool pin, absl::string_view field) {
  const CodecRegistry& registry = CodecRegistry::Default();
  KVH_ASSIGN_OR_RETURN(const bool takes,
                       registry.TakesCalibration(config_.codec));
  if (!takes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "namespace: '%s' uses codec '%s', which takes no calibration",
        config_.name, config_.codec));
  }
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": is empty"));
  }
  CodecParams params;
  params.geometry = config_.geometry;
  params.calibration_bytes =
      std::make_shared<const std::string>(std::move(bytes));
  // The factory parses and validates the whole calibration and its fit to
  // the geometry (outside every lock: it may be large).
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      registry.Create(config_.codec, params);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", codec.status().message()));
  }
  Record rec = MakeRecord(*std::move(codec), params.calibration_bytes,
                          CalibrationSource::kUploaded);
  AttachDeviceCodecsOrWarn(&rec);
  const uint64_t fp = rec.fingerprint;
  {
    absl::MutexLock l(&cal_mu_);
    if (pinned_ && fp != active_fingerprint_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "namespace: the active calibration %#x of '%s' is pinned; unpin it "
          "first",
          active_fingerprint_, config_.name));
    }
    ActivateLocked(std::move(rec));
    pinned_ = pin;
    if (state_ == CalibrationState::kNone) state_ = CalibrationState::kReady;
    LogEvent(config_,
             absl::StrFormat("calibration switched to an uploaded %s "
                             "calibration (fingerprint %#x%s)",
                             config_.codec, fp, pin ? ", pinned" : ""));
  }
  PersistState();
  return fp;
}

absl::Status NamespaceCalibrations::Pin(uint64_t fingerprint, bool pinned) {
  {
    absl::MutexLock l(&cal_mu_);
    if (fingerprint != 0 && fingerprint != active_fingerprint_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "calibration_fingerprint: %#x is not the active calibration of '%s' "
          "(%#x); only the active one can be pinned",
          fingerprint, config_.name, active_fingerprint_));
    }
    if (pinned && active_fingerprint_ == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "namespace: '%s' has no active calibration to pin (codec %s)",
          config_.name, active_codec_->name()));
    }
    pinned_ = pinned;
  }
  PersistState();
  return absl::OkStatus();
}

bool NamespaceCalibrations::Sample(const uint8_t* page,
                                   uint64_t first_position) {
  if (!sampling_.load(std::memory_order_relaxed)) return false;
  sampler_->Offer(page, first_position);
  if (sampler_->tokens_offered() < next_request_tokens_.load()) return false;
  absl::MutexLock l(&cal_mu_);
  if (state_ != CalibrationState::kSampling) return false;
  state_ = CalibrationState::kCalibrating;
  sampling_.store(false);
  return true;
}

void NamespaceCalibrations::RunJob(const OnlineCalibrateFn& fn,
                                   const std::function<bool()>& stop) {
  {
    absl::MutexLock l(&cal_mu_);
    if (state_ != CalibrationState::kCalibrating) return;
  }
  const KvSamples samples = sampler_->Snapshot();
  const uint64_t tokens = samples.tokens;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> bytes =
      fn(samples, config_.online, config_.geometry, stop);
  if (stop()) return;  // deleted or shutting down: nothing to install
  CodecParams params;
  params.geometry = config_.geometry;
  absl::StatusOr<std::unique_ptr<Codec>> codec = absl::UnknownError("");
  if (bytes.ok()) {
    params.calibration_bytes =
        std::make_shared<const std::string>(*std::move(bytes));
    codec = CodecRegistry::Default().Create(config_.codec, params);
  } else {
    codec = bytes.status();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  // The GPU twins are made outside every lock (they upload the calibration
  // to the device); the new calibration's pages then evict and decode on
  // the GPU like the first's.
  Record rec;
  if (codec.ok()) {
    rec = MakeRecord(*std::move(codec), params.calibration_bytes,
                     CalibrationSource::kOnline);
    AttachDeviceCodecsOrWarn(&rec);
  }
  InstallOnline(codec.status(), std::move(rec), tokens, seconds);
}

void NamespaceCalibrations::InstallOnline(absl::Status codec_status, Record rec,
                                          uint64_t tokens, double seconds) {
  {
    absl::MutexLock l(&cal_mu_);
    if (!codec_status.ok()) {
      // Sample more before the next try rather than retrying in a loop.
      state_ = CalibrationState::kSampling;
      next_request_tokens_.store(sampler_->tokens_offered() +
                                 config_.online.min_tokens);
      sampling_.store(true);
      LogWarning(config_,
                 absl::StrFormat("online calibration failed after %.2fs on %u "
                                 "sampled tokens; sampling on: %s",
                                 seconds, tokens, codec_status.message()));
      return;
    }
    state_ = CalibrationState::kReady;
    const uint64_t fp = rec.fingerprint;
    if (pinned_) {
      LogEvent(config_,
               absl::StrFormat("online calibration %#x (%u tokens, %.2fs) not "
                               "installed: the active calibration %#x is "
                               "pinned",
                               fp, tokens, seconds, active_fingerprint_));
      return;
    }
    rec.created = absl::Now();
    const std::string from(active_codec_->name());
    ActivateLocked(std::move(rec));
    LogEvent(config_,
             absl::StrFormat("calibration switched from %s to online %s "
                             "(fingerprint %#x, %u tokens sampled, calibrated "
                             "in %.2fs)",
                             from, config_.codec, fp, tokens, seconds));
  }
  PersistState();
}

// ---------------------------------------------------------------------------
// Persistence (core/calibration/calibration_store.h, docs/calibration.md
// "Warm restart")

void NamespaceCalibrations::Restore() {
  store_ =
      std::make_unique<CalibrationStore>(config_.disk_dir, config_.file_ops);
  CalibrationStore::ScanResult scan = store_->Scan();
  for (const std::string& line : scan.dropped) {
    LogWarning(config_,
               absl::StrCat(line, " (disk pages encoded with it are dropped)"));
  }
  std::vector<Record> restored = LoadPersisted(&scan);
  absl::MutexLock l(&cal_mu_);
  for (Record& rec : restored) {
    auto it = FindLocked(rec.codec, rec.fingerprint);
    if (it != calibrations_.end()) {
      it->persisted = true;  // the spec's own calibration
    } else {
      calibrations_.push_back(std::move(rec));
    }
  }
  RestoreStateLocked(scan);
}

std::vector<NamespaceCalibrations::Record> NamespaceCalibrations::LoadPersisted(
    CalibrationStore::ScanResult* scan) const {
  const CodecRegistry& registry = CodecRegistry::Default();
  std::vector<Record> restored;
  for (PersistedCalibration& p : scan->calibrations) {
    // Full validation: the codec's factory parses the whole calibration and
    // checks its fit to this geometry; the fingerprint must be the one the
    // pages name.
    CodecParams params;
    params.geometry = config_.geometry;
    params.calibration_bytes =
        std::make_shared<const std::string>(std::move(p.bytes));
    absl::StatusOr<std::unique_ptr<Codec>> codec =
        absl::DataLossError(absl::StrCat("source ", p.source));
    if (p.source <= kMaxSource) codec = registry.Create(p.codec, params);
    if (codec.ok() && ((*codec)->name() != p.codec ||
                       (*codec)->calibration_fingerprint() != p.fingerprint)) {
      codec = absl::DataLossError(
          absl::StrFormat("its calibration has fingerprint %#x, not %#x",
                          (*codec)->calibration_fingerprint(), p.fingerprint));
    }
    if (!codec.ok()) {
      store_->Remove(p.fingerprint);
      LogWarning(config_, absl::StrCat("dropped persisted calibration file ",
                                       store_->PathOf(p.fingerprint), ": ",
                                       codec.status().message(),
                                       " (disk pages encoded with it are "
                                       "dropped)"));
      continue;
    }
    Record rec = MakeRecord(*std::move(codec), params.calibration_bytes,
                            static_cast<CalibrationSource>(p.source));
    rec.codec = p.codec;
    rec.created = absl::FromUnixMicros(p.created_unix_micros);
    rec.persisted = true;
    restored.push_back(std::move(rec));
  }
  return restored;
}

void NamespaceCalibrations::RestoreStateLocked(
    const CalibrationStore::ScanResult& scan) {
  // A state persisted under another spec (codec or calibration changed
  // since) does not apply: the new spec decides what is active.
  if (!scan.state.has_value() || scan.state->spec_codec != config_.codec ||
      scan.state->spec_fingerprint != config_.calibration_fingerprint) {
    return;
  }
  const PersistedCalibrationState& st = *scan.state;
  if (st.active_fingerprint == active_fingerprint_) {
    pinned_ = st.pinned && active_fingerprint_ != 0;
    return;
  }
  auto it = FindLocked(st.active_codec, st.active_fingerprint);
  if (it == calibrations_.end()) {
    LogWarning(config_,
               absl::StrFormat("the active calibration before the restart (%s "
                               "%#x) was not restored; starting with %s",
                               st.active_codec, st.active_fingerprint,
                               active_codec_->name()));
    return;
  }
  active_codec_ = it->impl;
  active_fingerprint_ = it->fingerprint;
  pinned_ = st.pinned;
  // Calibrated already: online calibration does not run again.
  state_ = CalibrationState::kReady;
  sampling_.store(false);
  LogEvent(config_,
           absl::StrFormat("calibration %s %#x restored from %s as the active "
                           "one%s",
                           it->codec, it->fingerprint, config_.disk_dir,
                           pinned_ ? " (pinned)" : ""));
}

std::shared_ptr<const Codec> NamespaceCalibrations::CodecForRestoredPage(
    const std::string& codec, uint64_t fingerprint) {
  {
    absl::MutexLock l(&cal_mu_);
    auto it = FindLocked(codec, fingerprint);
    if (it != calibrations_.end()) return it->impl;
  }
  const std::shared_ptr<const Codec>& spec = config_.tier_codec;
  if (spec->name() == codec && spec->calibration_fingerprint() == fingerprint) {
    return spec;
  }
  // A codec without calibration (fp8 before an online switch, or the
  // identity of an earlier spec) needs nothing but the geometry.
  const CodecRegistry& registry = CodecRegistry::Default();
  absl::StatusOr<bool> takes = registry.TakesCalibration(codec);
  if (fingerprint != 0 || !takes.ok() || *takes) return nullptr;
  CodecParams params;
  params.geometry = config_.geometry;
  absl::StatusOr<std::unique_ptr<Codec>> made = registry.Create(codec, params);
  if (!made.ok() || (*made)->calibration_fingerprint() != 0) return nullptr;
  return std::shared_ptr<const Codec>(*std::move(made));
}

absl::Status NamespaceCalibrations::PersistCalibrationOf(const Codec& codec) {
  const uint64_t fp = codec.calibration_fingerprint();
  if (store_ == nullptr || fp == 0) return absl::OkStatus();
  absl::MutexLock p(&persist_mu_);
  return PersistRecordLocked(codec.name(), fp);
}

absl::Status NamespaceCalibrations::PersistRecordLocked(absl::string_view codec,
                                                        uint64_t fingerprint) {
  PersistedCalibration pc;
  {
    absl::MutexLock l(&cal_mu_);
    auto it = FindLocked(codec, fingerprint);
    if (it == calibrations_.end()) {
      return absl::InternalError(absl::StrFormat(
          "calibration %s %#x has no record to persist", codec, fingerprint));
    }
    if (it->persisted) return absl::OkStatus();
    pc.codec = it->codec;
    pc.fingerprint = it->fingerprint;
    pc.source = static_cast<uint32_t>(it->source);
    pc.created_unix_micros = absl::ToUnixMicros(it->created);
    pc.bytes = *it->bytes;
  }
  // Outside cal_mu_ (file I/O); persist_mu_ keeps another writer or a
  // removal of this file away meanwhile.
  KVH_RETURN_IF_ERROR(store_->Write(pc));
  absl::MutexLock l(&cal_mu_);
  for (Record& r : calibrations_) {
    if (r.codec == codec && r.fingerprint == fingerprint) r.persisted = true;
  }
  return absl::OkStatus();
}

void NamespaceCalibrations::PersistState() {
  if (store_ == nullptr) return;
  absl::MutexLock p(&persist_mu_);
  PersistedCalibrationState st;
  st.spec_codec = config_.codec;
  st.spec_fingerprint = config_.calibration_fingerprint;
  {
    absl::MutexLock l(&cal_mu_);
    st.active_codec = std::string(active_codec_->name());
    st.active_fingerprint = active_fingerprint_;
    st.pinned = pinned_;
  }
  absl::Status s =
      st.active_fingerprint == 0
          ? absl::OkStatus()
          : PersistRecordLocked(st.active_codec, st.active_fingerprint);
  if (s.ok()) s = store_->WriteState(st);
  if (!s.ok()) {
    LogWarning(config_,
               absl::StrCat("could not persist the calibration state (a "
                            "restart starts from the spec's calibration): ",
                            s.message()));
  }
}

void NamespaceCalibrations::ForgetUnused() {
  absl::MutexLock p(&persist_mu_);
  std::vector<uint64_t> files;
  {
    absl::MutexLock l(&cal_mu_);
    // Only the record holds the codec: no cold page, move in flight or
    // fetch uses it, and none can start (only the active codec is handed
    // out). Read under cal_mu_ here: the analysis does not see the lock
    // inside the lambda.
    const uint64_t active = active_fingerprint_;
    auto unused = [&](const Record& r) {
      const bool gone = r.fingerprint != active && r.impl.use_count() == 1;
      if (gone && r.persisted) files.push_back(r.fingerprint);
      return gone;
    };
    calibrations_.erase(
        std::remove_if(calibrations_.begin(), calibrations_.end(), unused),
        calibrations_.end());
  }
  for (uint64_t fp : files) store_->Remove(fp);
}

}  // namespace kvharbor
