#include "core/codec/envelope.h"

#include <xxh3.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {

namespace {

// Envelope field offsets (docs/kvtc_format.md, table 1).
enum EnvOffset : size_t {
  kOffMagic = 0,
  kOffVersion = 4,
  kOffHeaderBytes = 6,
  kOffCodecId = 8,
  kOffFlags = 12,
  kOffDType = 16,
  kOffLayout = 20,
  kOffLayers = 24,
  kOffKvHeads = 28,
  kOffHeadDim = 32,
  kOffPageSize = 36,
  kOffNumPages = 40,
  kOffRowKind = 44,
  kOffNumSections = 48,
  kOffReserved0 = 52,
  kOffFingerprint = 56,
  kOffPayloadBytes = 64,
  kOffRawPayloadBytes = 72,
  kOffBodyChecksum = 80,
  kOffReserved1 = 88,  // 32 zero bytes
  kOffHeaderChecksum = 120,
};

}  // namespace

absl::Status BufferCorrupt(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("buffer: ", field, ": ", what));
}

uint64_t EnvelopeTotalBytes(const EnvelopeHeader& header) {
  return kEnvelopeHeaderBytes + uint64_t{8} * header.num_pages +
         header.payload_bytes;
}

void WriteEnvelopeHeader(const EnvelopeHeader& h, uint8_t* out) {
  std::memset(out, 0, kEnvelopeHeaderBytes);
  std::memcpy(out + kOffMagic, kEnvelopeMagic, 4);
  StoreLe<uint16_t>(out, kOffVersion, kEnvelopeVersion);
  StoreLe<uint16_t>(out, kOffHeaderBytes, kEnvelopeHeaderBytes);
  StoreLe<uint32_t>(out, kOffCodecId, static_cast<uint32_t>(h.codec_id));
  StoreLe<uint32_t>(out, kOffFlags, h.flags);
  StoreLe<uint32_t>(out, kOffDType, static_cast<uint32_t>(h.geometry.dtype));
  StoreLe<uint32_t>(out, kOffLayout, static_cast<uint32_t>(h.geometry.layout));
  StoreLe<uint32_t>(out, kOffLayers, h.geometry.num_layers);
  StoreLe<uint32_t>(out, kOffKvHeads, h.geometry.num_kv_heads);
  StoreLe<uint32_t>(out, kOffHeadDim, h.geometry.head_dim);
  StoreLe<uint32_t>(out, kOffPageSize, h.geometry.page_size);
  StoreLe<uint32_t>(out, kOffNumPages, h.num_pages);
  StoreLe<uint32_t>(out, kOffRowKind, h.row_kind);
  StoreLe<uint32_t>(out, kOffNumSections, h.num_sections);
  StoreLe<uint64_t>(out, kOffFingerprint, h.calibration_fingerprint);
  StoreLe<uint64_t>(out, kOffPayloadBytes, h.payload_bytes);
  StoreLe<uint64_t>(out, kOffRawPayloadBytes, h.raw_payload_bytes);
  StoreLe<uint64_t>(out, kOffBodyChecksum, h.body_checksum);
  StoreLe<uint64_t>(out, kOffHeaderChecksum,
                    XXH3_64bits(out, kOffHeaderChecksum));
}

uint64_t ComputeBodyChecksum(absl::Span<const uint8_t> body) {
  return XXH3_64bits(body.data(), body.size());
}

void ResealEnvelopeForTesting(absl::Span<uint8_t> buffer) {
  if (buffer.size() < kEnvelopeHeaderBytes) return;
  uint8_t* p = buffer.data();
  StoreLe<uint64_t>(p, kOffBodyChecksum,
                    XXH3_64bits(p + kEnvelopeHeaderBytes,
                                buffer.size() - kEnvelopeHeaderBytes));
  StoreLe<uint64_t>(p, kOffHeaderChecksum, XXH3_64bits(p, kOffHeaderChecksum));
}

uint64_t ParsedEnvelope::position(size_t page) const {
  return LoadLe<uint64_t>(positions, page * 8);
}

namespace {

absl::Status ParseHeaderFields(const uint8_t* p, EnvelopeHeader* h) {
  // Any codec may use the envelope; the decoding codec checks that the id is
  // its own (CheckEnvelopeMatches).
  const uint32_t codec_id = LoadLe<uint32_t>(p, kOffCodecId);
  if (codec_id == 0) return BufferCorrupt("codec_id", "is 0");
  h->codec_id = static_cast<CodecId>(codec_id);
  h->flags = LoadLe<uint32_t>(p, kOffFlags);
  if ((h->flags & ~kEnvelopeKnownFlags) != 0) {
    return BufferCorrupt(
        "flags",
        absl::StrFormat("unknown bits 0x%x", h->flags & ~kEnvelopeKnownFlags));
  }
  h->geometry.dtype = static_cast<DType>(LoadLe<uint32_t>(p, kOffDType));
  h->geometry.layout = static_cast<PageLayout>(LoadLe<uint32_t>(p, kOffLayout));
  h->geometry.num_layers = LoadLe<uint32_t>(p, kOffLayers);
  h->geometry.num_kv_heads = LoadLe<uint32_t>(p, kOffKvHeads);
  h->geometry.head_dim = LoadLe<uint32_t>(p, kOffHeadDim);
  h->geometry.page_size = LoadLe<uint32_t>(p, kOffPageSize);
  KVH_RETURN_IF_ERROR(h->geometry.Validate("buffer: geometry"));
  h->num_pages = LoadLe<uint32_t>(p, kOffNumPages);
  if (h->num_pages == 0 || h->num_pages > kMaxPagesPerBuffer) {
    return BufferCorrupt(
        "num_pages", absl::StrFormat("%u is out of range [1, %u]", h->num_pages,
                                     kMaxPagesPerBuffer));
  }
  h->row_kind = LoadLe<uint32_t>(p, kOffRowKind);
  if (h->row_kind > kEnvelopeMaxRowKind) {
    return BufferCorrupt("row_kind",
                         absl::StrCat("unknown value ", h->row_kind));
  }
  h->num_sections = LoadLe<uint32_t>(p, kOffNumSections);
  if (h->num_sections > kEnvelopeMaxSections) {
    return BufferCorrupt(
        "num_sections",
        absl::StrCat(h->num_sections, " is over ", kEnvelopeMaxSections));
  }
  if (LoadLe<uint32_t>(p, kOffReserved0) != 0) {
    return BufferCorrupt("reserved", "must be 0");
  }
  for (size_t i = kOffReserved1; i < kOffHeaderChecksum; ++i) {
    if (p[i] != 0) return BufferCorrupt("reserved", "must be 0");
  }
  h->calibration_fingerprint = LoadLe<uint64_t>(p, kOffFingerprint);
  h->payload_bytes = LoadLe<uint64_t>(p, kOffPayloadBytes);
  h->raw_payload_bytes = LoadLe<uint64_t>(p, kOffRawPayloadBytes);
  h->body_checksum = LoadLe<uint64_t>(p, kOffBodyChecksum);
  const bool zstd = (h->flags & kEnvelopeFlagZstd) != 0;
  if (!zstd && h->raw_payload_bytes != h->payload_bytes) {
    return BufferCorrupt(
        "raw_payload_bytes",
        absl::StrFormat("%u differs from payload_bytes %u without "
                        "the zstd flag",
                        h->raw_payload_bytes, h->payload_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBodyChecksum(absl::Span<const uint8_t> buf,
                               uint64_t expected) {
  if (buf.size() < kEnvelopeHeaderBytes) {
    return BufferCorrupt("length", "shorter than the envelope header");
  }
  const uint64_t body = XXH3_64bits(buf.data() + kEnvelopeHeaderBytes,
                                    buf.size() - kEnvelopeHeaderBytes);
  if (body != expected) {
    return absl::DataLossError(absl::StrFormat(
        "buffer: body_checksum mismatch (stored %016x, computed %016x)",
        expected, body));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<ParsedEnvelope> Parse(absl::Span<const uint8_t> buf,
                                     bool check_body) {
  if (buf.size() < kEnvelopeHeaderBytes) {
    return BufferCorrupt("length",
                         absl::StrFormat("%u bytes is shorter than the "
                                         "%u-byte envelope header",
                                         buf.size(), kEnvelopeHeaderBytes));
  }
  const uint8_t* p = buf.data();
  if (std::memcmp(p + kOffMagic, kEnvelopeMagic, 4) != 0) {
    return BufferCorrupt("magic", "not a kvharbor codec buffer");
  }
  KVH_RETURN_IF_ERROR(CheckFormatVersion("buffer", "format_version",
                                         LoadLe<uint16_t>(p, kOffVersion),
                                         kEnvelopeVersion));
  KVH_RETURN_IF_ERROR(CheckFixedField("buffer", "header_bytes",
                                      LoadLe<uint16_t>(p, kOffHeaderBytes),
                                      kEnvelopeHeaderBytes));
  const uint64_t stored = LoadLe<uint64_t>(p, kOffHeaderChecksum);
  const uint64_t computed = XXH3_64bits(p, kOffHeaderChecksum);
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "buffer: header_checksum mismatch (stored %016x, computed %016x)",
        stored, computed));
  }
  ParsedEnvelope env;
  KVH_RETURN_IF_ERROR(ParseHeaderFields(p, &env.header));
  const EnvelopeHeader& h = env.header;
  const uint64_t after_header = buf.size() - kEnvelopeHeaderBytes;
  const uint64_t table = uint64_t{8} * h.num_pages;  // < 2^24, no overflow
  if (table > after_header || h.payload_bytes != after_header - table) {
    return BufferCorrupt(
        "length", absl::StrFormat("buffer is %u bytes but the header describes "
                                  "128 + 8 * %u pages + payload_bytes %u",
                                  buf.size(), h.num_pages, h.payload_bytes));
  }
  if (check_body) KVH_RETURN_IF_ERROR(CheckBodyChecksum(buf, h.body_checksum));
  env.positions = p + kEnvelopeHeaderBytes;
  env.payload = buf.subspan(kEnvelopeHeaderBytes + table);
  for (size_t i = 0; i < h.num_pages; ++i) {
    if (env.position(i) > kMaxFirstPosition) {
      return BufferCorrupt(
          absl::StrCat("positions[", i, "]"),
          absl::StrFormat("%u exceeds %u", env.position(i), kMaxFirstPosition));
    }
  }
  return env;
}

}  // namespace

absl::StatusOr<ParsedEnvelope> ParseEnvelope(absl::Span<const uint8_t> buf) {
  return Parse(buf, /*check_body=*/true);
}

absl::StatusOr<ParsedEnvelope> ParseEnvelopeDeferBodyChecksum(
    absl::Span<const uint8_t> buf) {
  return Parse(buf, /*check_body=*/false);
}

absl::Status CheckEnvelopeMatches(const ParsedEnvelope& env, CodecId codec_id,
                                  const Geometry& g,
                                  absl::Span<const MutablePageRef> pages,
                                  PageDataUse data_use) {
  const EnvelopeHeader& h = env.header;
  if (h.codec_id != codec_id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "buffer: codec_id is %u (%s), but this codec is %u (%s)",
        static_cast<uint32_t>(h.codec_id), CodecIdName(h.codec_id),
        static_cast<uint32_t>(codec_id), CodecIdName(codec_id)));
  }
  const Geometry& b = h.geometry;
  if (b.num_layers != g.num_layers || b.num_kv_heads != g.num_kv_heads ||
      b.head_dim != g.head_dim || b.page_size != g.page_size ||
      b.dtype != g.dtype || b.layout != g.layout) {
    Geometry bg = b;
    bg.rope_theta = g.rope_theta;
    return absl::FailedPreconditionError(
        absl::StrCat("buffer: geometry {", bg.DebugString(),
                     "} differs from the codec's {", g.DebugString(), "}"));
  }
  if (pages.size() != h.num_pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages: %u given, but the buffer holds %u pages",
                        pages.size(), h.num_pages));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i].data == nullptr && data_use == PageDataUse::kWritten) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "].data: is null"));
    }
    if (pages[i].first_position != env.position(i)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%u].first_position: %u, but the buffer's page %u starts at "
          "position %u",
          i, pages[i].first_position, i, env.position(i)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> FixedPayloadEnvelopeBytes(size_t num_pages,
                                                 size_t page_payload_bytes) {
  if (num_pages == 0 || num_pages > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_pages: %u is out of range [1, %u]", num_pages,
                        kMaxPagesPerBuffer));
  }
  return kEnvelopeHeaderBytes + num_pages * (8 + page_payload_bytes);
}

absl::StatusOr<ParsedEnvelope> ParseFlatEnvelope(
    absl::Span<const uint8_t> buffer, CodecId codec_id, const Geometry& g,
    absl::Span<const MutablePageRef> pages, uint64_t calibration_fingerprint,
    absl::string_view calibration_name) {
  KVH_ASSIGN_OR_RETURN(ParsedEnvelope env, ParseEnvelope(buffer));
  KVH_RETURN_IF_ERROR(CheckEnvelopeMatches(env, codec_id, g, pages));
  const EnvelopeHeader& h = env.header;
  if (h.row_kind != kEnvelopeNoRowKind || h.num_sections != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer: ", CodecIdName(codec_id),
                     " buffers must have row_kind 0 and num_sections 0"));
  }
  if (h.calibration_fingerprint != calibration_fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "buffer: calibration_fingerprint %016x differs from this codec's %s "
        "(%016x): encoded with another calibration",
        h.calibration_fingerprint, calibration_name, calibration_fingerprint));
  }
  return env;
}

absl::Status CheckPagesToEncode(absl::Span<const PageRef> pages) {
  if (pages.empty() || pages.size() > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages: %u pages is out of range [1, %u]", pages.size(),
                        kMaxPagesPerBuffer));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i].data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "].data: is null"));
    }
    if (pages[i].first_position > kMaxFirstPosition) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages[%u].first_position: %u exceeds %u", i,
                          pages[i].first_position, kMaxFirstPosition));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> FinishEnvelope(EnvelopeHeader header,
                                      absl::Span<const PageRef> pages,
                                      uint64_t raw_payload_bytes, bool zstd,
                                      int zstd_level, absl::Span<uint8_t> out,
                                      CodecWorkspace* scratch) {
  const size_t table = 8 * pages.size();
  uint8_t* payload = out.data() + kEnvelopeHeaderBytes + table;
  header.num_pages = static_cast<uint32_t>(pages.size());
  header.flags = 0;
  header.raw_payload_bytes = raw_payload_bytes;
  header.payload_bytes = raw_payload_bytes;
  if (zstd && raw_payload_bytes > 0) {
    const size_t bound = ZSTD_compressBound(raw_payload_bytes);
    uint8_t* tmp = scratch->Bytes(0, bound);
    const size_t n =
        ZSTD_compress(tmp, bound, payload, raw_payload_bytes, zstd_level);
    if (ZSTD_isError(n)) {
      return absl::InternalError(
          absl::StrCat("zstd compression failed: ", ZSTD_getErrorName(n)));
    }
    if (n < raw_payload_bytes) {
      std::memcpy(payload, tmp, n);
      header.flags |= kEnvelopeFlagZstd;
      header.payload_bytes = n;
    }
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    StoreLe<uint64_t>(out.data(), kEnvelopeHeaderBytes + 8 * i,
                      pages[i].first_position);
  }
  header.body_checksum = ComputeBodyChecksum(absl::MakeConstSpan(
      out.data() + kEnvelopeHeaderBytes, table + header.payload_bytes));
  WriteEnvelopeHeader(header, out.data());
  return static_cast<size_t>(EnvelopeTotalBytes(header));
}

absl::StatusOr<absl::Span<const uint8_t>> RawPayload(
    const ParsedEnvelope& env, uint64_t expected_raw_bytes,
    CodecWorkspace* scratch) {
  const EnvelopeHeader& h = env.header;
  if (h.raw_payload_bytes != expected_raw_bytes) {
    return BufferCorrupt(
        "raw_payload_bytes",
        absl::StrFormat("%u, but this batch's layout needs %u",
                        h.raw_payload_bytes, expected_raw_bytes));
  }
  if ((h.flags & kEnvelopeFlagZstd) == 0) return env.payload;
  const void* src = env.payload.data();
  const size_t src_size = env.payload.size();
  const size_t frame = ZSTD_findFrameCompressedSize(src, src_size);
  if (ZSTD_isError(frame) || frame != src_size) {
    return BufferCorrupt("payload", "is not exactly one zstd frame");
  }
  const unsigned long long content = ZSTD_getFrameContentSize(src, src_size);
  if (content == ZSTD_CONTENTSIZE_ERROR ||
      content == ZSTD_CONTENTSIZE_UNKNOWN || content != expected_raw_bytes) {
    return BufferCorrupt("payload",
                         "zstd frame content size is missing or differs "
                         "from raw_payload_bytes");
  }
  uint8_t* dst = scratch->Bytes(0, expected_raw_bytes);
  const size_t n = ZSTD_decompress(dst, expected_raw_bytes, src, src_size);
  if (ZSTD_isError(n) || n != expected_raw_bytes) {
    return BufferCorrupt(
        "payload",
        absl::StrCat("zstd decompression failed: ",
                     ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
  }
  return absl::MakeConstSpan(dst, expected_raw_bytes);
}

}  // namespace kvharbor
