#include "core/kvtc_format.h"

#include <xxh3.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace kvharbor {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "kvharbor's binary formats assume a little-endian host");

namespace {

template <typename T>
void Put(uint8_t* p, size_t offset, T v) {
  std::memcpy(p + offset, &v, sizeof(T));
}

template <typename T>
T Get(const uint8_t* p, size_t offset) {
  T v;
  std::memcpy(&v, p + offset, sizeof(T));
  return v;
}

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

bool MulOk(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
bool AddOk(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

absl::Status Corrupt(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("buffer: ", field, ": ", what));
}

}  // namespace

uint64_t EnvelopeTotalBytes(const EnvelopeHeader& header) {
  return kEnvelopeHeaderBytes + uint64_t{8} * header.num_pages +
         header.payload_bytes;
}

void WriteEnvelopeHeader(const EnvelopeHeader& h, uint8_t* out) {
  std::memset(out, 0, kEnvelopeHeaderBytes);
  std::memcpy(out + kOffMagic, kEnvelopeMagic, 4);
  Put<uint16_t>(out, kOffVersion, kEnvelopeVersion);
  Put<uint16_t>(out, kOffHeaderBytes, kEnvelopeHeaderBytes);
  Put<uint32_t>(out, kOffCodecId, static_cast<uint32_t>(h.codec_id));
  Put<uint32_t>(out, kOffFlags, h.flags);
  Put<uint32_t>(out, kOffDType, static_cast<uint32_t>(h.geometry.dtype));
  Put<uint32_t>(out, kOffLayout, static_cast<uint32_t>(h.geometry.layout));
  Put<uint32_t>(out, kOffLayers, h.geometry.num_layers);
  Put<uint32_t>(out, kOffKvHeads, h.geometry.num_kv_heads);
  Put<uint32_t>(out, kOffHeadDim, h.geometry.head_dim);
  Put<uint32_t>(out, kOffPageSize, h.geometry.page_size);
  Put<uint32_t>(out, kOffNumPages, h.num_pages);
  Put<uint32_t>(out, kOffRowKind, h.row_kind);
  Put<uint32_t>(out, kOffNumSections, h.num_sections);
  Put<uint64_t>(out, kOffFingerprint, h.calibration_fingerprint);
  Put<uint64_t>(out, kOffPayloadBytes, h.payload_bytes);
  Put<uint64_t>(out, kOffRawPayloadBytes, h.raw_payload_bytes);
  Put<uint64_t>(out, kOffBodyChecksum, h.body_checksum);
  Put<uint64_t>(out, kOffHeaderChecksum, XXH3_64bits(out, kOffHeaderChecksum));
}

uint64_t ComputeBodyChecksum(absl::Span<const uint8_t> body) {
  return XXH3_64bits(body.data(), body.size());
}

void ResealEnvelopeForTesting(absl::Span<uint8_t> buffer) {
  if (buffer.size() < kEnvelopeHeaderBytes) return;
  uint8_t* p = buffer.data();
  Put<uint64_t>(p, kOffBodyChecksum,
                XXH3_64bits(p + kEnvelopeHeaderBytes,
                            buffer.size() - kEnvelopeHeaderBytes));
  Put<uint64_t>(p, kOffHeaderChecksum, XXH3_64bits(p, kOffHeaderChecksum));
}

uint64_t ParsedEnvelope::position(size_t page) const {
  return Get<uint64_t>(positions, page * 8);
}

namespace {

absl::Status ParseHeaderFields(const uint8_t* p, EnvelopeHeader* h) {
  // Any codec may use the envelope; the decoding codec checks that the id is
  // its own (CheckEnvelopeMatches).
  const uint32_t codec_id = Get<uint32_t>(p, kOffCodecId);
  if (codec_id == 0) return Corrupt("codec_id", "is 0");
  h->codec_id = static_cast<CodecId>(codec_id);
  h->flags = Get<uint32_t>(p, kOffFlags);
  if ((h->flags & ~kEnvelopeKnownFlags) != 0) {
    return Corrupt("flags", absl::StrFormat("unknown bits 0x%x",
                                            h->flags & ~kEnvelopeKnownFlags));
  }
  h->geometry.dtype = static_cast<DType>(Get<uint32_t>(p, kOffDType));
  h->geometry.layout = static_cast<PageLayout>(Get<uint32_t>(p, kOffLayout));
  h->geometry.num_layers = Get<uint32_t>(p, kOffLayers);
  h->geometry.num_kv_heads = Get<uint32_t>(p, kOffKvHeads);
  h->geometry.head_dim = Get<uint32_t>(p, kOffHeadDim);
  h->geometry.page_size = Get<uint32_t>(p, kOffPageSize);
  KVH_RETURN_IF_ERROR(h->geometry.Validate("buffer: geometry"));
  h->num_pages = Get<uint32_t>(p, kOffNumPages);
  if (h->num_pages == 0 || h->num_pages > kMaxPagesPerBuffer) {
    return Corrupt("num_pages",
                   absl::StrFormat("%u is out of range [1, %u]", h->num_pages,
                                   kMaxPagesPerBuffer));
  }
  h->row_kind = Get<uint32_t>(p, kOffRowKind);
  if (h->row_kind > static_cast<uint32_t>(KvtcRowKind::kPerPage)) {
    return Corrupt("row_kind", absl::StrCat("unknown value ", h->row_kind));
  }
  h->num_sections = Get<uint32_t>(p, kOffNumSections);
  if (h->num_sections > kKvtcNumSections) {
    return Corrupt("num_sections", absl::StrCat(h->num_sections, " is over ",
                                                kKvtcNumSections));
  }
  if (Get<uint32_t>(p, kOffReserved0) != 0) {
    return Corrupt("reserved", "must be 0");
  }
  for (size_t i = kOffReserved1; i < kOffHeaderChecksum; ++i) {
    if (p[i] != 0) return Corrupt("reserved", "must be 0");
  }
  h->calibration_fingerprint = Get<uint64_t>(p, kOffFingerprint);
  h->payload_bytes = Get<uint64_t>(p, kOffPayloadBytes);
  h->raw_payload_bytes = Get<uint64_t>(p, kOffRawPayloadBytes);
  h->body_checksum = Get<uint64_t>(p, kOffBodyChecksum);
  const bool zstd = (h->flags & kEnvelopeFlagZstd) != 0;
  if (!zstd && h->raw_payload_bytes != h->payload_bytes) {
    return Corrupt("raw_payload_bytes",
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
    return Corrupt("length", "shorter than the envelope header");
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
    return Corrupt("length", absl::StrFormat("%u bytes is shorter than the "
                                             "%u-byte envelope header",
                                             buf.size(), kEnvelopeHeaderBytes));
  }
  const uint8_t* p = buf.data();
  if (std::memcmp(p + kOffMagic, kEnvelopeMagic, 4) != 0) {
    return Corrupt("magic", "not a kvharbor codec buffer");
  }
  const uint16_t version = Get<uint16_t>(p, kOffVersion);
  if (version != kEnvelopeVersion) {
    return Corrupt("format_version",
                   absl::StrFormat("%u is not supported (this build reads "
                                   "version %u)",
                                   version, kEnvelopeVersion));
  }
  const uint16_t header_bytes = Get<uint16_t>(p, kOffHeaderBytes);
  if (header_bytes != kEnvelopeHeaderBytes) {
    return Corrupt("header_bytes", absl::StrFormat("%u, want %u", header_bytes,
                                                   kEnvelopeHeaderBytes));
  }
  const uint64_t stored = Get<uint64_t>(p, kOffHeaderChecksum);
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
    return Corrupt(
        "length", absl::StrFormat("buffer is %u bytes but the header describes "
                                  "128 + 8 * %u pages + payload_bytes %u",
                                  buf.size(), h.num_pages, h.payload_bytes));
  }
  if (check_body) KVH_RETURN_IF_ERROR(CheckBodyChecksum(buf, h.body_checksum));
  env.positions = p + kEnvelopeHeaderBytes;
  env.payload = buf.subspan(kEnvelopeHeaderBytes + table);
  for (size_t i = 0; i < h.num_pages; ++i) {
    if (env.position(i) > kMaxFirstPosition) {
      return Corrupt(
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
                                  absl::Span<const MutablePageRef> pages) {
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
    if (pages[i].data == nullptr) {
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
    Put<uint64_t>(out.data(), kEnvelopeHeaderBytes + 8 * i,
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
    return Corrupt("raw_payload_bytes",
                   absl::StrFormat("%u, but this batch's layout needs %u",
                                   h.raw_payload_bytes, expected_raw_bytes));
  }
  if ((h.flags & kEnvelopeFlagZstd) == 0) return env.payload;
  const void* src = env.payload.data();
  const size_t src_size = env.payload.size();
  const size_t frame = ZSTD_findFrameCompressedSize(src, src_size);
  if (ZSTD_isError(frame) || frame != src_size) {
    return Corrupt("payload", "is not exactly one zstd frame");
  }
  const unsigned long long content = ZSTD_getFrameContentSize(src, src_size);
  if (content == ZSTD_CONTENTSIZE_ERROR ||
      content == ZSTD_CONTENTSIZE_UNKNOWN || content != expected_raw_bytes) {
    return Corrupt("payload",
                   "zstd frame content size is missing or differs "
                   "from raw_payload_bytes");
  }
  uint8_t* dst = scratch->Bytes(0, expected_raw_bytes);
  const size_t n = ZSTD_decompress(dst, expected_raw_bytes, src, src_size);
  if (ZSTD_isError(n) || n != expected_raw_bytes) {
    return Corrupt(
        "payload",
        absl::StrCat("zstd decompression failed: ",
                     ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
  }
  return absl::MakeConstSpan(dst, expected_raw_bytes);
}

// ------------------------------------------------------------ KVTC payload
void WriteKvtcRangeHeader(const KvtcRangeHeader& h, uint8_t* out) {
  Put<int32_t>(out, 0, h.quant_type);
  Put<int32_t>(out, 4, h.int_bits);
  Put<uint64_t>(out, 8, h.start_idx);
  Put<uint64_t>(out, 16, h.end_idx);
  Put<uint64_t>(out, 24, h.packed_data_bytes);
  Put<uint64_t>(out, 32, h.metadata_bytes);
}

KvtcRangeHeader ReadKvtcRangeHeader(const uint8_t* in) {
  KvtcRangeHeader h;
  h.quant_type = Get<int32_t>(in, 0);
  h.int_bits = Get<int32_t>(in, 4);
  h.start_idx = Get<uint64_t>(in, 8);
  h.end_idx = Get<uint64_t>(in, 16);
  h.packed_data_bytes = Get<uint64_t>(in, 24);
  h.metadata_bytes = Get<uint64_t>(in, 32);
  return h;
}

uint64_t IntXBytesPerRow(uint64_t width, int bits) {
  const uint64_t per_byte = 8 / static_cast<uint64_t>(bits);
  return width / per_byte + (width % per_byte != 0 ? 1 : 0);
}

uint64_t CountSinkTokens(const uint64_t* first_positions, size_t num_pages,
                         uint32_t page_size, uint32_t sink_tokens) {
  uint64_t n = 0;
  for (size_t i = 0; i < num_pages; ++i) {
    if (first_positions[i] < sink_tokens) {
      n += std::min<uint64_t>(page_size, sink_tokens - first_positions[i]);
    }
  }
  return n;
}

namespace {

absl::Status LayoutSection(KvtcSectionKind kind, uint64_t rows,
                           uint64_t features, uint64_t components,
                           const std::vector<KvtcRange>& ranges,
                           uint64_t offset, KvtcSectionLayout* s) {
  s->kind = kind;
  s->offset = offset;
  s->rows = rows;
  s->features = features;
  s->components = components;
  s->ranges.clear();
  uint64_t pos = offset + kKvtcSectionHeaderBytes;
  for (const KvtcRange& r : ranges) {
    KvtcRangeLayout rl;
    rl.range = r;
    rl.header_offset = pos;
    const uint64_t width = r.end_idx - r.start_idx;
    bool ok = true;
    if (r.quant_type == KvtcQuantType::kIntX) {
      ok = MulOk(rows, 8, &rl.metadata_bytes) &&
           MulOk(rows, IntXBytesPerRow(width, r.int_bits), &rl.data_bytes);
    } else {
      ok = MulOk(rows, width, &rl.data_bytes);
    }
    ok = ok && AddOk(pos, kKvtcRangeHeaderBytes, &rl.metadata_offset) &&
         AddOk(rl.metadata_offset, rl.metadata_bytes, &rl.data_offset) &&
         AddOk(rl.data_offset, rl.data_bytes, &pos);
    if (!ok) {
      return absl::OutOfRangeError(
          "kvtc: batch too large, payload size overflows 64 bits");
    }
    s->ranges.push_back(rl);
  }
  s->end = pos;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvtcPayloadLayout> ComputeKvtcPayloadLayout(
    const KvtcCalibration& cal, uint64_t num_pages, uint64_t sink_rows) {
  KvtcPayloadLayout l;
  uint64_t tokens = 0;
  if (!MulOk(num_pages, cal.page_size, &tokens) || sink_rows > tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvtc: %u sink rows for %u pages of %u tokens",
                        sink_rows, num_pages, cal.page_size));
  }
  l.sink_rows = sink_rows;
  if (cal.row_kind == KvtcRowKind::kPerToken) {
    l.projected_rows = tokens - sink_rows;
  } else if (!MulOk(num_pages, cal.num_layers, &l.projected_rows)) {
    return absl::OutOfRangeError("kvtc: batch too large");
  }
  const uint64_t sink_features =
      uint64_t{2} * cal.num_layers * cal.num_kv_heads * cal.head_dim;
  const std::vector<KvtcRange> sink_ranges = {
      {KvtcQuantType::kFp8, 0, 0, sink_features}};
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kKeys, l.projected_rows,
                                    cal.keys.features, cal.keys.components,
                                    cal.keys.ranges, 0, &l.sections[0]));
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kValues, l.projected_rows,
                                    cal.values.features, cal.values.components,
                                    cal.values.ranges, l.sections[0].end,
                                    &l.sections[1]));
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kSinks, sink_rows,
                                    sink_features, sink_features, sink_ranges,
                                    l.sections[1].end, &l.sections[2]));
  l.raw_payload_bytes = l.sections[2].end;
  return l;
}

void WriteKvtcPayloadHeaders(const KvtcPayloadLayout& layout,
                             uint8_t* payload) {
  for (const KvtcSectionLayout& s : layout.sections) {
    uint8_t* h = payload + s.offset;
    Put<uint32_t>(h, 0, static_cast<uint32_t>(s.kind));
    Put<uint32_t>(h, 4, static_cast<uint32_t>(s.ranges.size()));
    Put<uint64_t>(h, 8, s.rows);
    Put<uint64_t>(h, 16, s.features);
    Put<uint64_t>(h, 24, s.components);
    for (const KvtcRangeLayout& r : s.ranges) {
      KvtcRangeHeader rh;
      rh.quant_type = static_cast<int32_t>(r.range.quant_type);
      rh.int_bits = r.range.int_bits;
      rh.start_idx = r.range.start_idx;
      rh.end_idx = r.range.end_idx;
      rh.packed_data_bytes = r.data_bytes;
      rh.metadata_bytes = r.metadata_bytes;
      WriteKvtcRangeHeader(rh, payload + r.header_offset);
    }
  }
}

namespace {

absl::Status CheckField(absl::string_view where, absl::string_view field,
                        uint64_t got, uint64_t want) {
  if (got == want) return absl::OkStatus();
  return Corrupt(absl::StrCat(where, ".", field),
                 absl::StrFormat("%u, expected %u", got, want));
}

}  // namespace

absl::Status CheckKvtcPayloadHeaders(const KvtcPayloadLayout& layout,
                                     absl::Span<const uint8_t> payload) {
  if (payload.size() != layout.raw_payload_bytes) {
    return Corrupt("payload",
                   absl::StrFormat("%u bytes, expected %u", payload.size(),
                                   layout.raw_payload_bytes));
  }
  static constexpr const char* kNames[] = {"keys", "values", "sinks"};
  for (int si = 0; si < static_cast<int>(kKvtcNumSections); ++si) {
    const KvtcSectionLayout& s = layout.sections[si];
    const std::string where =
        absl::StrCat("sections[", si, "](", kNames[si], ")");
    const uint8_t* h = payload.data() + s.offset;
    KVH_RETURN_IF_ERROR(CheckField(where, "kind", Get<uint32_t>(h, 0),
                                   static_cast<uint32_t>(s.kind)));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "num_ranges", Get<uint32_t>(h, 4), s.ranges.size()));
    KVH_RETURN_IF_ERROR(CheckField(where, "rows", Get<uint64_t>(h, 8), s.rows));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "features", Get<uint64_t>(h, 16), s.features));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "components", Get<uint64_t>(h, 24), s.components));
    for (size_t ri = 0; ri < s.ranges.size(); ++ri) {
      const KvtcRangeLayout& r = s.ranges[ri];
      const std::string rw = absl::StrCat(where, ".ranges[", ri, "]");
      const KvtcRangeHeader got =
          ReadKvtcRangeHeader(payload.data() + r.header_offset);
      // Compared as unsigned so that negative values print unambiguously.
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "quant_type", static_cast<uint32_t>(got.quant_type),
                     static_cast<uint32_t>(r.range.quant_type)));
      KVH_RETURN_IF_ERROR(CheckField(rw, "int_bits",
                                     static_cast<uint32_t>(got.int_bits),
                                     static_cast<uint32_t>(r.range.int_bits)));
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "start_idx", got.start_idx, r.range.start_idx));
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "end_idx", got.end_idx, r.range.end_idx));
      KVH_RETURN_IF_ERROR(CheckField(rw, "packed_data_bytes",
                                     got.packed_data_bytes, r.data_bytes));
      KVH_RETURN_IF_ERROR(CheckField(rw, "metadata_bytes", got.metadata_bytes,
                                     r.metadata_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
