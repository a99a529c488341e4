#include "client/page_decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/codec/codec.h"
#include "core/codec/envelope.h"

namespace kvharbor {
namespace client {

namespace {

absl::Span<const uint8_t> AsBytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

// The geometry fields a buffer stores (rope_theta lives in the calibration).
bool SameStoredGeometry(const kvharbor::Geometry& a,
                        const kvharbor::Geometry& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.page_size == b.page_size &&
         a.dtype == b.dtype && a.layout == b.layout;
}

}  // namespace

PageDecoder::PageDecoder() = default;
PageDecoder::~PageDecoder() = default;

uint64_t PageDecoder::calibrations_loaded() const {
  absl::MutexLock l(&mu_);
  return loads_;
}

absl::StatusOr<std::shared_ptr<const Codec>> PageDecoder::CodecFor(
    const std::string& key, const CompressedPage& page,
    const kvharbor::Geometry& geometry, const CalibrationLoader& load) {
  {
    absl::MutexLock l(&mu_);
    auto it = codecs_.find(key);
    if (it != codecs_.end() &&
        SameStoredGeometry(it->second->geometry(), geometry)) {
      return it->second;
    }
  }
  const CodecRegistry& registry = CodecRegistry::Default();
  absl::StatusOr<bool> takes = registry.TakesCalibration(page.codec);
  if (!takes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec: '", page.codec, "' cannot be decoded (",
                     absl::StrJoin(registry.Names(), ", "), ")"));
  }
  CodecParams params;
  params.geometry = geometry;
  if (*takes) {
    // Loaded outside mu_ (an RPC); two threads may both load, harmlessly.
    absl::StatusOr<Calibration> cal = load(page.calibration_fingerprint);
    if (!cal.ok()) return cal.status();
    {
      absl::MutexLock l(&mu_);
      ++loads_;
    }
    if (cal->fingerprint != page.calibration_fingerprint) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "calibration_fingerprint: page %u was encoded with calibration "
          "%016x but the namespace now has %016x (recreated?)",
          page.handle, page.calibration_fingerprint, cal->fingerprint));
    }
    params.calibration_bytes =
        std::make_shared<const std::string>(std::move(cal->bytes));
  }
  absl::StatusOr<std::unique_ptr<Codec>> made =
      registry.Create(page.codec, params);
  if (!made.ok()) {
    // The codec parses the calibration the daemon sent: a failure there
    // means the bytes are damaged or not for this geometry.
    return *takes ? absl::DataLossError(
                        absl::StrCat("calibration: ", made.status().message()))
                  : absl::InvalidArgumentError(
                        absl::StrCat("codec: ", made.status().message()));
  }
  if ((*made)->calibration_fingerprint() != page.calibration_fingerprint) {
    return absl::DataLossError(
        "calibration: its bytes do not have the fingerprint announced");
  }
  std::shared_ptr<const Codec> codec(*std::move(made));
  absl::MutexLock l(&mu_);
  codecs_[key] = codec;
  return codec;
}

absl::Status PageDecoder::Decode(absl::string_view ns,
                                 const CompressedPage& page,
                                 const CalibrationLoader& load,
                                 std::vector<uint8_t>* out) {
  const absl::Span<const uint8_t> buffer = AsBytes(page.buffer);
  absl::StatusOr<ParsedEnvelope> env = ParseEnvelope(buffer);
  if (!env.ok()) {
    return absl::DataLossError(
        absl::StrFormat("page %u: not a valid codec buffer: %s", page.handle,
                        env.status().message()));
  }
  const EnvelopeHeader& h = env->header;
  if (h.num_pages != 1) {
    return absl::DataLossError(absl::StrFormat(
        "page %u: buffer holds %u pages, not 1", page.handle, h.num_pages));
  }
  if (CodecIdName(h.codec_id) != page.codec ||
      h.calibration_fingerprint != page.calibration_fingerprint) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codec: page %u announced %s/%016x but its buffer is %s/%016x",
        page.handle, page.codec, page.calibration_fingerprint,
        CodecIdName(h.codec_id), h.calibration_fingerprint));
  }
  const std::string key = absl::StrFormat("%s\n%s\n%016x", ns, page.codec,
                                          page.calibration_fingerprint);
  absl::StatusOr<std::shared_ptr<const Codec>> codec =
      CodecFor(key, page, h.geometry, load);
  if (!codec.ok()) return codec.status();
  out->resize((*codec)->geometry().PageBytes());
  const MutablePageRef dst{out->data(), env->position(0)};
  CodecWorkspace workspace;
  absl::Status s =
      (*codec)->Decode(buffer, absl::MakeConstSpan(&dst, 1), &workspace);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrFormat("page %u: cannot decode: %s",
                                               page.handle, s.message()));
  }
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
