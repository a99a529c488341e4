// The envelope every codec's buffer starts with: magic, version, codec id,
// geometry, page positions, payload sizes and checksums, and the optional
// zstd stage around the payload. docs/kvtc_format.md has the byte table; the
// CPU and CUDA codecs of every codec (identity, fp8, int8_c8, commvq, KVTC)
// write and check their buffers through this one implementation.
//
// All integers are little-endian.
// Buffer:  [envelope header, 128 B][positions: num_pages x u64][payload]
// The payload is a zstd frame when kEnvelopeFlagZstd is set, else the raw
// payload; what the raw payload holds is the codec's (KVTC:
// core/codec/kvtc/kvtc_format.h).
//
// Parsing functions check every field and every size against the buffer's
// length with overflow-safe arithmetic before reading, and never read out of
// bounds on any input. Pure functions; no state; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_ENVELOPE_H_
#define KVHARBOR_CORE_CODEC_ENVELOPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "types/geometry.h"

namespace kvharbor {

inline constexpr uint8_t kEnvelopeMagic[4] = {'K', 'V', 'H', 'B'};
inline constexpr uint16_t kEnvelopeVersion = 1;
inline constexpr size_t kEnvelopeHeaderBytes = 128;
// Payload is one zstd frame whose content is the raw payload.
inline constexpr uint32_t kEnvelopeFlagZstd = 1u << 0;
inline constexpr uint32_t kEnvelopeKnownFlags = kEnvelopeFlagZstd;
// Envelope row_kind for codecs without rows (identity).
inline constexpr uint32_t kEnvelopeNoRowKind = 0;
// Largest row_kind and section count any codec writes (KVTC: per-page rows,
// three sections; core/codec/kvtc/kvtc_format.h asserts it fits).
inline constexpr uint32_t kEnvelopeMaxRowKind = 2;
inline constexpr uint32_t kEnvelopeMaxSections = 3;

struct EnvelopeHeader {
  CodecId codec_id = CodecId::kIdentity;
  uint32_t flags = 0;
  // Only num_layers, num_kv_heads, head_dim, page_size, dtype and layout are
  // stored; rope_theta lives in the calibration.
  Geometry geometry;
  uint32_t num_pages = 0;
  uint32_t row_kind = kEnvelopeNoRowKind;  // KvtcRowKind value for KVTC
  uint32_t num_sections = 0;               // 3 for KVTC, 0 for identity
  uint64_t calibration_fingerprint = 0;    // 0 for identity
  uint64_t payload_bytes = 0;      // stored bytes after the positions table
  uint64_t raw_payload_bytes = 0;  // after zstd; == payload_bytes without it
  uint64_t body_checksum = 0;      // XXH3-64 of positions table + payload
};

// InvalidArgument "buffer: <field>: <what>", the message every envelope and
// payload check of a malformed buffer gives.
absl::Status BufferCorrupt(absl::string_view field, absl::string_view what);

// Size of a whole buffer with this header: 128 + 8 * num_pages +
// payload_bytes (no overflow for values a parser accepted).
uint64_t EnvelopeTotalBytes(const EnvelopeHeader& header);

// Writes the 128-byte header (and its header checksum) to `out`. The caller
// fills body_checksum (ComputeBodyChecksum) before calling.
void WriteEnvelopeHeader(const EnvelopeHeader& header, uint8_t* out);
// XXH3-64 (seed 0) of the bytes after the header.
uint64_t ComputeBodyChecksum(absl::Span<const uint8_t> body);

// Recomputes the body checksum (when the header's page count and the buffer
// length allow) and the header checksum of a possibly modified buffer, so
// tests and the fuzzer can reach the checks behind the checksums. Does
// nothing to buffers shorter than the header.
void ResealEnvelopeForTesting(absl::Span<uint8_t> buffer);

// A checked view of an encoded buffer.
struct ParsedEnvelope {
  EnvelopeHeader header;
  const uint8_t* positions = nullptr;  // num_pages little-endian u64
  absl::Span<const uint8_t> payload;   // stored payload (maybe zstd)
  uint64_t position(size_t page) const;
};

// Checks magic, version, header size, header checksum, codec id, flags,
// geometry, page count, that the buffer is exactly EnvelopeTotalBytes long,
// every position, and the body checksum. Does not look inside the payload.
absl::StatusOr<ParsedEnvelope> ParseEnvelope(absl::Span<const uint8_t> buffer);

// ParseEnvelope without the body checksum, for decoders that overlap that
// checksum (one sequential pass over the whole buffer) with their own work:
// every other check, sizes included, is done, so the result is safe to index
// with; the caller must pass the buffer to CheckBodyChecksum before
// reporting any decoded value as valid.
absl::StatusOr<ParsedEnvelope> ParseEnvelopeDeferBodyChecksum(
    absl::Span<const uint8_t> buffer);
// DataLoss naming body_checksum unless XXH3 of buffer[128:] is `expected`
// (the header's body_checksum). `buffer` must be at least 128 bytes.
absl::Status CheckBodyChecksum(absl::Span<const uint8_t> buffer,
                               uint64_t expected);

// Whether CheckEnvelopeMatches requires each page's data pointer: a decode
// that writes somewhere else (the GPU decode into an engine's paged layout)
// or a check that writes nothing passes kNotWritten.
enum class PageDataUse { kWritten, kNotWritten };

// Checks that a parsed envelope was made for `codec_id` and `geometry`
// (dims, dtype, layout) and holds pages at exactly `pages`' positions, and,
// with kWritten, that every page has a data pointer.
absl::Status CheckEnvelopeMatches(const ParsedEnvelope& env, CodecId codec_id,
                                  const Geometry& geometry,
                                  absl::Span<const MutablePageRef> pages,
                                  PageDataUse data_use = PageDataUse::kWritten);

// Size of an envelope of `num_pages` pages whose payloads are
// `page_payload_bytes` each (the codecs with a fixed payload per page:
// identity, fp8, int8_c8, commvq). InvalidArgument naming num_pages when it
// is 0 or over kMaxPagesPerBuffer.
absl::StatusOr<size_t> FixedPayloadEnvelopeBytes(size_t num_pages,
                                                 size_t page_payload_bytes);

// ParseEnvelope + CheckEnvelopeMatches for codecs whose buffers have no row
// kind and no sections (identity, int8_c8, commvq), and a check that the
// buffer was encoded with the calibration of fingerprint
// `calibration_fingerprint` (0 for none); `calibration_name` says what that
// calibration is in the error ("C8 scales", "codebooks").
absl::StatusOr<ParsedEnvelope> ParseFlatEnvelope(
    absl::Span<const uint8_t> buffer, CodecId codec_id,
    const Geometry& geometry, absl::Span<const MutablePageRef> pages,
    uint64_t calibration_fingerprint, absl::string_view calibration_name);

// Checks a batch to encode: page count in [1, kMaxPagesPerBuffer], non-null
// data, positions <= kMaxFirstPosition. Messages name "pages[i]".
absl::Status CheckPagesToEncode(absl::Span<const PageRef> pages);

// Writes the envelope around a raw payload already placed at
// out + kEnvelopeHeaderBytes + 8 * pages.size(). With `zstd`, compresses the
// payload (staging it through `scratch`) and keeps the result only when it
// is smaller. Returns the total size. `out` must hold the uncompressed size.
absl::StatusOr<size_t> FinishEnvelope(EnvelopeHeader header,
                                      absl::Span<const PageRef> pages,
                                      uint64_t raw_payload_bytes, bool zstd,
                                      int zstd_level, absl::Span<uint8_t> out,
                                      CodecWorkspace* scratch);

// Returns the raw payload of a parsed envelope: the stored payload itself,
// or, with kEnvelopeFlagZstd, its decompression into `scratch` (refused
// unless the frame's content size equals `expected_raw_bytes`).
absl::StatusOr<absl::Span<const uint8_t>> RawPayload(
    const ParsedEnvelope& env, uint64_t expected_raw_bytes,
    CodecWorkspace* scratch);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_ENVELOPE_H_
