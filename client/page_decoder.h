// PageDecoder: turns the codec buffers of a compressed Fetch back into raw
// pages on the CPU, with the codecs of core/codec/codec.h's default registry
// (identity, kvtc, int8_c8, commvq).
//
// A buffer is self-describing (core/codec/envelope.h envelope: codec,
// geometry, calibration fingerprint, first position), so the decoder needs from
// the daemon only a namespace's calibration, which it asks for through a loader
// the first time it meets a (namespace, codec, fingerprint) and then keeps
// with the codec built from it. A page whose fingerprint differs from the
// calibration the daemon returns (the namespace was recreated meanwhile) is
// refused (FAILED_PRECONDITION), never decoded with the wrong calibration.
//
// Internal to the SDK (not installed). Owns its cached codecs and
// calibrations. Thread-safe: mu_ guards the cache; decoding runs outside it
// with a workspace per call.
#ifndef KVHARBOR_CLIENT_PAGE_DECODER_H_
#define KVHARBOR_CLIENT_PAGE_DECODER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kvharbor/types.h"
#include "types/geometry.h"

namespace kvharbor {

class Codec;  // core/codec/codec.h

namespace client {

class PageDecoder {
 public:
  // Fetches the namespace's calibration with this fingerprint from the
  // daemon (GetCalibration): a namespace keeps every calibration its pages
  // reference, so pages of an older calibration decode too.
  using CalibrationLoader =
      std::function<absl::StatusOr<Calibration>(uint64_t fingerprint)>;

  PageDecoder();
  ~PageDecoder();

  // Decodes `page` (one page in one buffer) of namespace `ns` into `out`,
  // resized to the page's raw size. Calls `load` at most once per (ns,
  // codec, fingerprint) while the result is cached. DATA_LOSS for a corrupt
  // buffer, INVALID_ARGUMENT for one that does not match its announced
  // codec or fingerprint.
  absl::Status Decode(absl::string_view ns, const CompressedPage& page,
                      const CalibrationLoader& load, std::vector<uint8_t>* out);

  // How many calibrations were loaded (tests check the caching).
  uint64_t calibrations_loaded() const;

 private:
  absl::StatusOr<std::shared_ptr<const Codec>> CodecFor(
      const std::string& key, const CompressedPage& page,
      const kvharbor::Geometry& geometry, const CalibrationLoader& load);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Codec>> codecs_
      ABSL_GUARDED_BY(mu_);
  uint64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_PAGE_DECODER_H_
