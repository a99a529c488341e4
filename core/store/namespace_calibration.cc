// Namespace: calibrations (the active tier codec, the calibrations stored
// pages reference, uploads and pins) and online calibration (sampling and
// the switch). See namespace.h and docs/calibration.md.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::string_view Namespace::PinnedPages::codec_name(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->name() : absl::string_view();
}

uint64_t Namespace::PinnedPages::calibration_fingerprint(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->calibration_fingerprint() : 0;
}

absl::Status Namespace::AttachDeviceCodecs(CalibrationRecord* rec) const {
  if (config_.device_tier == nullptr || !tiered()) return absl::OkStatus();
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

std::shared_ptr<PageBatchEncoder> Namespace::GpuEncoderOf(
    const Codec* codec) const {
  absl::MutexLock l(&cal_mu_);
  const CalibrationRecord* r = RecordOfLocked(codec);
  return r != nullptr ? r->gpu_encoder : nullptr;
}

std::shared_ptr<PageBatchDecoder> Namespace::GpuDecoderOf(
    const Codec* codec) const {
  absl::MutexLock l(&cal_mu_);
  const CalibrationRecord* r = RecordOfLocked(codec);
  return r != nullptr ? r->gpu_decoder : nullptr;
}

const Namespace::CalibrationRecord* Namespace::RecordOfLocked(
    const Codec* codec) const {
  for (const CalibrationRecord& r : calibrations_) {
    if (r.impl.get() == codec) return &r;
  }
  return nullptr;
}

void Namespace::AttachDeviceCodecsOrWarn(CalibrationRecord* rec) const {
  const absl::Status s = AttachDeviceCodecs(rec);
  if (!s.ok()) {
    Log(absl::StrFormat(
        "calibration %#x has no GPU encoder / decoder, its pages encode and "
        "decode on the CPU: %s",
        rec->fingerprint, s.message()));
  }
}

absl::Status Namespace::InitCalibration() {
  CalibrationRecord rec;
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
    cal_state_ = CalibrationState::kSampling;
    next_request_tokens_.store(config_.online.min_tokens);
    sampling_.store(true);
  }
  return absl::OkStatus();
}

std::shared_ptr<const Codec> Namespace::tier_codec() const {
  absl::MutexLock l(&cal_mu_);
  return active_codec_;
}

Namespace::CalibrationStatus Namespace::calibration_status() const {
  CalibrationStatus s;
  if (sampler_ != nullptr) {
    s.tokens_offered = sampler_->tokens_offered();
    s.tokens_sampled = sampler_->tokens_sampled();
  }
  absl::MutexLock l(&cal_mu_);
  s.state = cal_state_;
  s.active_codec = std::string(active_codec_->name());
  s.active_fingerprint = active_fingerprint_;
  s.pinned = pinned_;
  return s;
}

void Namespace::ActivateLocked(CalibrationRecord rec) {
  active_codec_ = rec.impl;
  active_fingerprint_ = rec.fingerprint;
  pinned_ = false;
  auto same = [&](const CalibrationRecord& r) {
    return r.fingerprint == rec.fingerprint && r.codec == rec.codec;
  };
  for (const CalibrationRecord& r : calibrations_) {
    if (same(r)) rec.persisted = rec.persisted || r.persisted;
  }
  calibrations_.erase(
      std::remove_if(calibrations_.begin(), calibrations_.end(), same),
      calibrations_.end());
  calibrations_.push_back(std::move(rec));
}

std::vector<Namespace::CalibrationInfo> Namespace::ListCalibrations() {
  ForgetUnusedCalibrations();
  absl::flat_hash_map<uint64_t, uint64_t> pages;  // fingerprint -> pages
  {
    absl::MutexLock l(&mu_);
    for (const auto& [h, c] : cold_) {
      if (c.codec != nullptr) ++pages[c.codec->calibration_fingerprint()];
    }
  }
  std::vector<CalibrationInfo> out;
  absl::MutexLock l(&cal_mu_);
  for (const CalibrationRecord& r : calibrations_) {
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
Namespace::GetCalibration(uint64_t fingerprint) const {
  absl::MutexLock l(&cal_mu_);
  const uint64_t want = fingerprint == 0 ? active_fingerprint_ : fingerprint;
  for (const CalibrationRecord& r : calibrations_) {
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

absl::StatusOr<uint64_t> Namespace::UploadCalibration(std::string bytes,
                                                      bool pin,
                                                      absl::string_view field) {
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
  CalibrationRecord rec;
  rec.codec = config_.codec;
  rec.fingerprint = (*codec)->calibration_fingerprint();
  rec.bytes = params.calibration_bytes;
  rec.impl = std::shared_ptr<const Codec>(*std::move(codec));
  rec.source = CalibrationSource::kUploaded;
  rec.created = absl::Now();
  AttachDeviceCodecsOrWarn(&rec);
  const uint64_t fp = rec.fingerprint;
  absl::ReleasableMutexLock l(&cal_mu_);
  if (pinned_ && fp != active_fingerprint_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "namespace: the active calibration %#x of '%s' is pinned; unpin it "
        "first",
        active_fingerprint_, config_.name));
  }
  ActivateLocked(std::move(rec));
  pinned_ = pin;
  if (cal_state_ == CalibrationState::kNone)
    cal_state_ = CalibrationState::kReady;
  LogEvent(
      absl::StrFormat("calibration switched to an uploaded %s calibration "
                      "(fingerprint %#x%s)",
                      config_.codec, fp, pin ? ", pinned" : ""));
  l.Release();
  PersistCalibrationState();
  return fp;
}

absl::Status Namespace::PinCalibration(uint64_t fingerprint, bool pinned) {
  absl::ReleasableMutexLock l(&cal_mu_);
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
  l.Release();
  PersistCalibrationState();
  return absl::OkStatus();
}

void Namespace::SamplePage(const uint8_t* page, uint64_t first_position) {
  if (!sampling_.load(std::memory_order_relaxed)) return;
  sampler_->Offer(page, first_position);
  if (sampler_->tokens_offered() < next_request_tokens_.load()) return;
  {
    absl::MutexLock l(&cal_mu_);
    if (cal_state_ != CalibrationState::kSampling) return;
    cal_state_ = CalibrationState::kCalibrating;
    sampling_.store(false);
  }
  if (config_.request_calibration)
    config_.request_calibration(weak_from_this());
}

void Namespace::RunCalibrationJob(const OnlineCalibrateFn& fn,
                                  const std::function<bool()>& cancelled) {
  {
    absl::MutexLock l(&cal_mu_);
    if (cal_state_ != CalibrationState::kCalibrating) return;
  }
  const KvSamples samples = sampler_->Snapshot();
  const uint64_t tokens = samples.tokens;
  const absl::Time t0 = absl::Now();
  auto stop = [&] { return deleted() || (cancelled && cancelled()); };
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
  CalibrationRecord rec;
  if (codec.ok()) {
    rec.codec = config_.codec;
    rec.fingerprint = (*codec)->calibration_fingerprint();
    rec.bytes = params.calibration_bytes;
    rec.impl = std::shared_ptr<const Codec>(*std::move(codec));
    rec.source = CalibrationSource::kOnline;
    AttachDeviceCodecsOrWarn(&rec);
  }
  absl::ReleasableMutexLock l(&cal_mu_);
  if (!codec.ok()) {
    // Sample more before the next try rather than retrying in a loop.
    cal_state_ = CalibrationState::kSampling;
    next_request_tokens_.store(sampler_->tokens_offered() +
                               config_.online.min_tokens);
    sampling_.store(true);
    Log(
        absl::StrFormat("online calibration failed after %.2fs on %u "
                        "sampled tokens; sampling on: %s",
                        seconds, tokens, codec.status().message()));
    return;
  }
  cal_state_ = CalibrationState::kReady;
  const uint64_t fp = rec.fingerprint;
  if (pinned_) {
    LogEvent(
        absl::StrFormat("online calibration %#x (%u tokens, %.2fs) not "
                        "installed: the active calibration %#x is pinned",
                        fp, tokens, seconds, active_fingerprint_));
    return;
  }
  rec.created = absl::Now();
  const std::string from(active_codec_->name());
  ActivateLocked(std::move(rec));
  LogEvent(
      absl::StrFormat("calibration switched from %s to online %s "
                      "(fingerprint %#x, %u tokens sampled, calibrated in "
                      "%.2fs)",
                      from, config_.codec, fp, tokens, seconds));
  l.Release();
  PersistCalibrationState();
}

}  // namespace kvharbor
