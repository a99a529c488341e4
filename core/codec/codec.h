// Page codecs: turn a batch of KV pages into one self-describing buffer and
// back, and a registry that lets a namespace pick its codec by name.
//
// A batch is a list of pages given by pointer (pages are scattered in a pool),
// each with the absolute position of its first token in its sequence (KVTC
// needs it for attention sinks and RoPE). Encode writes into a caller-owned
// output span sized with MaxEncodedSize (or exactly with EncodedSize when the
// codec has no entropy stage); Decode writes into caller-owned pages. Every
// buffer starts with the common envelope of core/codec/envelope.h
// (magic, version, codec id, geometry, checksums), so the identity codec's
// buffers are checked exactly like KVTC's.
//
// Memory: the codec owns only its immutable configuration (KVTC: a shared
// pointer to its calibration). Per-call scratch lives in a CodecWorkspace the
// caller owns and reuses, so steady-state calls allocate nothing.
//
// Thread-safety: a Codec is immutable after creation; Encode/Decode are const
// and may run concurrently on different threads as long as each call has its
// own CodecWorkspace. CodecRegistry is thread-safe.
#ifndef KVHARBOR_CORE_CODEC_CODEC_H_
#define KVHARBOR_CORE_CODEC_CODEC_H_

#include <cstddef>
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
#include "absl/types/span.h"
#include "types/geometry.h"
#include "types/stats.h"

namespace kvharbor {

struct KvtcCalibration;  // core/codec/kvtc/kvtc_calibration.h

// Codec ids as stored in the envelope. Never renumber. The envelope accepts
// any non-zero id; each codec checks that a buffer carries its own.
enum class CodecId : uint32_t {
  kIdentity = 1,
  kKvtc = 2,
  kInt8C8 = 3,  // core/codec/c8/int8_c8_codec.h
  kCommVq = 4,  // core/codec/commvq/commvq_codec.h
  kFp8 = 5,     // core/codec/fp8/fp8_codec.h
};
absl::string_view CodecIdName(CodecId id);

// A page to encode: geometry().PageBytes() readable bytes at `data` (no
// alignment required), holding tokens first_position .. first_position +
// page_size - 1 of its sequence.
struct PageRef {
  const uint8_t* data = nullptr;
  uint64_t first_position = 0;
};

// A page to decode into: PageBytes() writable bytes. first_position must
// equal the one stored in the buffer (a mismatch means the caller would
// scatter into the wrong pages, and is refused).
struct MutablePageRef {
  uint8_t* data = nullptr;
  uint64_t first_position = 0;
};

// Largest first_position accepted: positions stay exact in a double (RoPE
// angles are computed in double) and position + page_size never overflows.
inline constexpr uint64_t kMaxFirstPosition = (uint64_t{1} << 53) - 1;
// Largest batch one buffer holds (the envelope stores num_pages as u32).
inline constexpr size_t kMaxPagesPerBuffer = size_t{1} << 20;

// Scratch buffers reused across Encode/Decode calls. They only grow; a
// workspace is tied to no codec. Not thread-safe: one per thread.
class CodecWorkspace {
 public:
  static constexpr int kFloatSlots = 4;
  static constexpr int kByteSlots = 2;
  // Returns at least `n` floats in slot `slot` (contents unspecified).
  float* Floats(int slot, size_t n);
  // Returns at least `n` bytes in slot `slot` (contents unspecified).
  uint8_t* Bytes(int slot, size_t n);
  // Total bytes currently reserved, for memory accounting.
  size_t ReservedBytes() const;

 private:
  std::vector<float> floats_[kFloatSlots];
  std::vector<uint8_t> bytes_[kByteSlots];
};

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  virtual absl::string_view name() const = 0;
  virtual const Geometry& geometry() const = 0;

  // Upper bound on the encoded size of any batch of `num_pages` pages,
  // whatever their positions and content. InvalidArgument when num_pages is
  // 0 or over kMaxPagesPerBuffer.
  virtual absl::StatusOr<size_t> MaxEncodedSize(size_t num_pages) const = 0;

  // Encoded size of this batch before any entropy stage (exact when the
  // codec's entropy stage is off; otherwise an upper bound). Checks the
  // positions like Encode does.
  virtual absl::StatusOr<size_t> EncodedSize(
      absl::Span<const PageRef> pages) const = 0;

  // Fingerprint of the calibration this codec was built from, as written
  // into every buffer it encodes (0 for codecs without one).
  virtual uint64_t calibration_fingerprint() const { return 0; }
  virtual CalibrationEstimate calibration_estimate() const { return {}; }

  // Encodes `pages` into `out` and returns the number of bytes written.
  // `out` must hold at least EncodedSize(pages) bytes (ResourceExhausted
  // otherwise). `workspace` may be null (a temporary one is used).
  virtual absl::StatusOr<size_t> Encode(absl::Span<const PageRef> pages,
                                        absl::Span<uint8_t> out,
                                        CodecWorkspace* workspace) const = 0;

  // Decodes `buffer` (exactly one encoded batch, nothing after it) into
  // `pages`, which must match the buffer's page count and positions. Checks
  // every field, size and checksum before writing anything: a truncated,
  // corrupt or foreign buffer (other codec, geometry or calibration) gives
  // an error and leaves the pages untouched.
  virtual absl::Status Decode(absl::Span<const uint8_t> buffer,
                              absl::Span<const MutablePageRef> pages,
                              CodecWorkspace* workspace) const = 0;

  // Convenience: Encode into a new string of the exact size.
  absl::StatusOr<std::string> EncodeToString(absl::Span<const PageRef> pages,
                                             CodecWorkspace* workspace) const;
};

// What a codec factory receives. A calibrated codec (kvtc, int8_c8, commvq)
// parses its calibration from `calibration_bytes`, the canonical serialized
// form a namespace stores and GetCalibration serves
// (core/codec/codec_calibrations.h says which format each codec takes). KVTC
// alone may instead be given an already parsed `calibration`, which then wins.
// The identity codec ignores both.
struct CodecParams {
  Geometry geometry;
  std::shared_ptr<const KvtcCalibration> calibration;
  std::shared_ptr<const std::string> calibration_bytes;
  // Lossless zstd stage over the quantized bytes (KVTC) or raw bytes
  // (identity). Kept only when it makes the buffer smaller.
  bool zstd = false;
  int zstd_level = 1;
};

// Identity codec: the pages' bytes verbatim inside the envelope.
absl::StatusOr<std::unique_ptr<Codec>> CreateIdentityCodec(
    const CodecParams& params);

// Name -> factory, and for calibrated codecs a reader of their
// calibration_path. Default() has "identity", "fp8", "kvtc", "int8_c8"
// and "commvq".
class CodecRegistry {
 public:
  using Factory =
      std::function<absl::StatusOr<std::unique_ptr<Codec>>(const CodecParams&)>;
  // Reads the calibration at `path` (a file, or a directory for int8_c8)
  // for a namespace of `geometry` and returns it in the codec's canonical
  // form (CodecParams::calibration_bytes). Errors say what is wrong with
  // the file without naming the spec field (the caller adds it).
  using CalibrationReader = std::function<absl::StatusOr<std::string>(
      const std::string& path, const Geometry& geometry)>;

  static CodecRegistry& Default();

  // AlreadyExists when `name` is taken; InvalidArgument for an empty name.
  // A codec registered with a `reader` takes a calibration (and needs one).
  absl::Status Register(absl::string_view name, Factory factory,
                        CalibrationReader reader = nullptr);
  // NotFound (listing the known names) for an unknown name; otherwise the
  // factory's result.
  absl::StatusOr<std::unique_ptr<Codec>> Create(
      absl::string_view name, const CodecParams& params) const;
  // NotFound for an unknown name.
  absl::StatusOr<bool> TakesCalibration(absl::string_view name) const;
  // NotFound for an unknown name, FailedPrecondition for a codec without a
  // calibration; otherwise the reader's result.
  absl::StatusOr<std::string> ReadCalibration(absl::string_view name,
                                              const std::string& path,
                                              const Geometry& geometry) const;
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    Factory factory;
    CalibrationReader reader;
  };
  // A copy of the entry for `name`, or NotFound listing the known names.
  absl::StatusOr<Entry> Find(absl::string_view name) const;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> factories_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_CODEC_H_
