// Byte format of the KVTC payload inside the common envelope
// (core/codec/envelope.h): three sections (keys, values, sinks), each a
// 32-byte section header followed by its range records; a range record is
// the seed's 40-byte KvtcRangeHeader, then (IntX only) rows float32 minimums
// then rows float32 maximums, then the packed bytes. docs/kvtc_format.md has
// the byte tables; this header is the single implementation the CPU and CUDA
// codecs share, so that either can decode what the other encodes.
//
// All integers are little-endian; floats are IEEE binary32 little-endian.
// Parsing functions check every field and every size against the payload's
// length with overflow-safe arithmetic before reading. Pure functions; no
// state; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_FORMAT_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

enum class KvtcSectionKind : uint32_t {
  kKeys = 1,
  kValues = 2,
  kSinks = 3,
};
inline constexpr size_t kKvtcSectionHeaderBytes = 32;
inline constexpr size_t kKvtcRangeHeaderBytes = 40;
inline constexpr uint32_t kKvtcNumSections = 3;
static_assert(kKvtcNumSections <= kEnvelopeMaxSections &&
                  static_cast<uint32_t>(KvtcRowKind::kPerPage) <=
                      kEnvelopeMaxRowKind,
              "the envelope parser accepts every KVTC buffer");

// The seed's KvtcRangeHeader, byte-compatible (40 bytes, little-endian).
struct KvtcRangeHeader {
  int32_t quant_type = 0;  // 0 = FP8, 1 = IntX
  int32_t int_bits = 0;
  uint64_t start_idx = 0;
  uint64_t end_idx = 0;
  uint64_t packed_data_bytes = 0;
  uint64_t metadata_bytes = 0;
};
void WriteKvtcRangeHeader(const KvtcRangeHeader& h, uint8_t* out);
KvtcRangeHeader ReadKvtcRangeHeader(const uint8_t* in);  // 40 readable bytes

// Packed bytes of one row of an IntX range: ceil(width / (8 / bits)); a row
// starts on a byte boundary, values LSB-first within each byte.
uint64_t IntXBytesPerRow(uint64_t width, int bits);

struct KvtcRangeLayout {
  KvtcRange range;
  uint64_t header_offset = 0;    // of the 40-byte record header
  uint64_t metadata_offset = 0;  // mins at +0, maxs at +4*rows
  uint64_t metadata_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
};

struct KvtcSectionLayout {
  KvtcSectionKind kind = KvtcSectionKind::kKeys;
  uint64_t offset = 0;  // of the 32-byte section header
  uint64_t rows = 0;
  uint64_t features = 0;
  uint64_t components = 0;
  std::vector<KvtcRangeLayout> ranges;
  uint64_t end = 0;  // offset just past the section
};

// Where everything lies in a KVTC raw payload. Offsets are from the start of
// the raw payload.
struct KvtcPayloadLayout {
  uint64_t projected_rows = 0;  // rows of the keys section (= values)
  uint64_t sink_rows = 0;       // tokens stored in FP8
  KvtcSectionLayout sections[kKvtcNumSections];  // keys, values, sinks
  uint64_t raw_payload_bytes = 0;
};

// Tokens of the batch at positions < sink_tokens.
uint64_t CountSinkTokens(const uint64_t* first_positions, size_t num_pages,
                         uint32_t page_size, uint32_t sink_tokens);

// Layout of a batch of `num_pages` pages of which `sink_rows` tokens are
// sinks. Per token: projected_rows = num_pages * page_size - sink_rows; per
// page: num_pages * num_layers. Sinks section: one FP8 range over
// 2 * num_layers * num_kv_heads * head_dim features (keys then values).
// OutOfRange when a size would overflow 64 bits.
absl::StatusOr<KvtcPayloadLayout> ComputeKvtcPayloadLayout(
    const KvtcCalibration& cal, uint64_t num_pages, uint64_t sink_rows);

// Writes every section header and range record header of `layout`.
void WriteKvtcPayloadHeaders(const KvtcPayloadLayout& layout, uint8_t* payload);
// Checks that `payload` is exactly `layout` (length, every section header
// field and every range header field); messages name the section and range.
absl::Status CheckKvtcPayloadHeaders(const KvtcPayloadLayout& layout,
                                     absl::Span<const uint8_t> payload);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_FORMAT_H_
