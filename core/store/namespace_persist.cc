// Namespace: calibrations persisted in disk_dir for a warm restart
// (core/calibration/calibration_store.h, docs/calibration.md "Warm restart").
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

namespace {

constexpr uint32_t kMaxSource =
    static_cast<uint32_t>(Namespace::CalibrationSource::kOnline);

}  // namespace

void Namespace::RestoreCalibrations() {
  CalibrationStore::ScanResult scan = cal_store_->Scan();
  for (const std::string& line : scan.dropped) {
    Log(absl::StrCat(line, " (disk pages encoded with it are dropped)"));
  }
  const CodecRegistry& registry = CodecRegistry::Default();
  std::vector<CalibrationRecord> restored;
  for (PersistedCalibration& p : scan.calibrations) {
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
      cal_store_->Remove(p.fingerprint);
      Log(absl::StrCat("dropped persisted calibration file ",
                       cal_store_->PathOf(p.fingerprint), ": ",
                       codec.status().message(),
                       " (disk pages encoded with it are dropped)"));
      continue;
    }
    CalibrationRecord rec;
    rec.codec = p.codec;
    rec.fingerprint = p.fingerprint;
    rec.bytes = params.calibration_bytes;
    rec.impl = std::shared_ptr<const Codec>(*std::move(codec));
    rec.source = static_cast<CalibrationSource>(p.source);
    rec.created = absl::FromUnixMicros(p.created_unix_micros);
    rec.persisted = true;
    restored.push_back(std::move(rec));
  }
  absl::MutexLock l(&cal_mu_);
  for (CalibrationRecord& rec : restored) {
    auto it = std::find_if(
        calibrations_.begin(), calibrations_.end(), [&](const auto& r) {
          return r.codec == rec.codec && r.fingerprint == rec.fingerprint;
        });
    if (it != calibrations_.end()) {
      it->persisted = true;  // the spec's own calibration
    } else {
      calibrations_.push_back(std::move(rec));
    }
  }
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
  auto it = std::find_if(calibrations_.begin(), calibrations_.end(),
                         [&](const auto& r) {
                           return r.codec == st.active_codec &&
                                  r.fingerprint == st.active_fingerprint;
                         });
  if (it == calibrations_.end()) {
    Log(absl::StrFormat(
        "the active calibration before the restart (%s %#x) was not "
        "restored; starting with %s",
        st.active_codec, st.active_fingerprint, active_codec_->name()));
    return;
  }
  active_codec_ = it->impl;
  active_fingerprint_ = it->fingerprint;
  pinned_ = st.pinned;
  // Calibrated already: online calibration does not run again.
  cal_state_ = CalibrationState::kReady;
  sampling_.store(false);
  LogEvent(absl::StrFormat(
      "calibration %s %#x restored from %s as the active one%s", it->codec,
      it->fingerprint, config_.disk_dir, pinned_ ? " (pinned)" : ""));
}

std::shared_ptr<const Codec> Namespace::CodecForRestoredPage(
    const std::string& codec, uint64_t fingerprint) {
  {
    absl::MutexLock l(&cal_mu_);
    for (const CalibrationRecord& r : calibrations_) {
      if (r.codec == codec && r.fingerprint == fingerprint) return r.impl;
    }
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

absl::Status Namespace::PersistCalibrationOf(const Codec& codec) {
  const uint64_t fp = codec.calibration_fingerprint();
  if (cal_store_ == nullptr || fp == 0) return absl::OkStatus();
  absl::MutexLock p(&persist_mu_);
  return PersistRecordLocked(codec.name(), fp);
}

absl::Status Namespace::PersistRecordLocked(absl::string_view codec,
                                            uint64_t fingerprint) {
  PersistedCalibration pc;
  {
    absl::MutexLock l(&cal_mu_);
    auto it = std::find_if(
        calibrations_.begin(), calibrations_.end(), [&](const auto& r) {
          return r.codec == codec && r.fingerprint == fingerprint;
        });
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
  KVH_RETURN_IF_ERROR(cal_store_->Write(pc));
  absl::MutexLock l(&cal_mu_);
  for (CalibrationRecord& r : calibrations_) {
    if (r.codec == codec && r.fingerprint == fingerprint) r.persisted = true;
  }
  return absl::OkStatus();
}

void Namespace::PersistCalibrationState() {
  if (cal_store_ == nullptr) return;
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
  if (s.ok()) s = cal_store_->WriteState(st);
  if (!s.ok()) {
    Log(
        absl::StrCat("could not persist the calibration state (a restart "
                     "starts from the spec's calibration): ",
                     s.message()));
  }
}

void Namespace::ForgetUnusedCalibrations() {
  absl::MutexLock p(&persist_mu_);
  std::vector<uint64_t> files;
  {
    absl::MutexLock l(&cal_mu_);
    // Only the record holds the codec: no cold page, move in flight or
    // fetch uses it, and none can start (only the active codec is handed
    // out).
    auto unused = [&](const CalibrationRecord& r) {
      const bool gone =
          r.fingerprint != active_fingerprint_ && r.impl.use_count() == 1;
      if (gone && r.persisted) files.push_back(r.fingerprint);
      return gone;
    };
    calibrations_.erase(
        std::remove_if(calibrations_.begin(), calibrations_.end(), unused),
        calibrations_.end());
  }
  for (uint64_t fp : files) cal_store_->Remove(fp);
}

}  // namespace kvharbor
