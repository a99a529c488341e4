#include "core/codec/commvq/commvq_codec.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "core/codec/page_elements.h"

namespace kvharbor {
namespace {

// CodecWorkspace slots. Byte slot 0 belongs to the envelope's zstd stage.
constexpr int kSlotVec = 0;      // one token's D floats
constexpr int kSlotScratch = 1;  // CommVqEncoder scratch
constexpr int kSlotRope = 2;     // cos then sin: [page_size][head_dim / 2]
constexpr int kSlotCodes = 1;    // bytes: key codes as uint16

void PackCodes(const uint16_t* codes, uint32_t n, uint32_t bits, uint8_t* out) {
  uint32_t acc = 0, have = 0;
  for (uint32_t i = 0; i < n; ++i) {
    acc |= uint32_t{codes[i]} << have;
    have += bits;
    while (have >= 8) {
      *out++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      have -= 8;
    }
  }
  if (have > 0) *out = static_cast<uint8_t>(acc);
}

void UnpackCodes(const uint8_t* in, uint32_t n, uint32_t bits,
                 uint16_t* codes) {
  const uint32_t mask = (1u << bits) - 1;
  uint32_t acc = 0, have = 0;
  for (uint32_t i = 0; i < n; ++i) {
    while (have < bits) {
      acc |= uint32_t{*in++} << have;
      have += 8;
    }
    codes[i] = static_cast<uint16_t>(acc & mask);
    acc >>= bits;
    have -= bits;
  }
}

// Whether the bits past `used_bits` in a record of `bytes` bytes are 0.
bool PaddingClear(const uint8_t* record, uint64_t bytes, uint64_t used_bits) {
  const uint32_t used_in_last = used_bits % 8;
  return used_in_last == 0 || (record[bytes - 1] >> used_in_last) == 0;
}

// The RoPE tables of one page's tokens (first at `first_position`): cos
// and sin, [page_size][head_dim / 2] each.
void PageRopeTables(const Geometry& g, const CommVqConfig& c,
                    uint64_t first_position, float* cos, float* sin) {
  const uint32_t half = g.head_dim / 2;
  for (uint32_t t = 0; t < g.page_size; ++t) {
    RopeCosSin(first_position + t, g.head_dim, c.rope_theta,
               cos + size_t{t} * half, sin + size_t{t} * half);
  }
}

// Walks the token records of `pages` in payload order (page, layer, K then
// V, token). Fills page p's RoPE tables into `rope` (page_size * head_dim
// floats) first when the config has RoPE, then calls f(p, kv, layer, token,
// offset, rotate): offset is the byte offset of the token's run in its page,
// rotate(vec, inverse) applies the token's RoPE to a key run (a no-op
// without RoPE). Stops at the first error f returns.
template <typename Pages, typename F>
absl::Status ForEachRecord(const Geometry& g, const CommVqConfig& c,
                           Pages pages, float* rope, F&& f) {
  const uint32_t d = c.dim(), half = g.head_dim / 2;
  const size_t es = DTypeSize(g.dtype);
  const bool has_rope = c.rope_style != RopeStyle::kNone;
  float* cos = rope;
  float* sin = rope + size_t{g.page_size} * half;
  for (size_t p = 0; p < pages.size(); ++p) {
    if (has_rope) PageRopeTables(g, c, pages[p].first_position, cos, sin);
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t base = PageBlockElementOffset(g, kv, l);
        for (uint32_t t = 0; t < g.page_size; ++t) {
          auto rotate = [&](float* vec, bool inverse) {
            for (uint32_t h = 0; has_rope && h < g.num_kv_heads; ++h) {
              RotateRope(vec + size_t{h} * g.head_dim, g.head_dim, c.rope_style,
                         cos + size_t{t} * half, sin + size_t{t} * half,
                         inverse);
            }
          };
          KVH_RETURN_IF_ERROR(
              f(p, kv, l, t, (base + uint64_t{t} * d) * es, rotate));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

CommVqCodec::CommVqCodec(const CodecParams& params,
                         std::unique_ptr<CommVqEncoder> e)
    : FixedPayloadCodec(params),
      encoder_(std::move(e)),
      fingerprint_(encoder_->codebooks().Fingerprint()),
      key_record_bytes_(
          (encoder_->codebooks().config.key_bits_per_token() + 7) / 8),
      value_record_bytes_(
          (encoder_->codebooks().config.value_bits_per_token() + 7) / 8) {}

absl::StatusOr<std::unique_ptr<CommVqCodec>> CommVqCodec::Create(
    const CodecParams& params,
    std::shared_ptr<const CommVqCodebooks> codebooks) {
  KVH_RETURN_IF_ERROR(params.geometry.Validate());
  if (codebooks == nullptr) {
    return absl::InvalidArgumentError(
        "commvq: codebooks: missing (read them with ReadCommVqCodebooksFile)");
  }
  KVH_RETURN_IF_ERROR(codebooks->Validate());
  KVH_RETURN_IF_ERROR(codebooks->CheckGeometry(params.geometry));
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<CommVqEncoder> e,
                       CommVqEncoder::Create(std::move(codebooks)));
  return std::unique_ptr<CommVqCodec>(new CommVqCodec(params, std::move(e)));
}

uint64_t CommVqCodec::PagePayloadBytes() const {
  return uint64_t{geometry().num_layers} * geometry().page_size *
         (key_record_bytes_ + value_record_bytes_);
}

absl::Status CommVqCodec::EncodePayload(absl::Span<const PageRef> pages,
                                        uint8_t* payload,
                                        CodecWorkspace* ws) const {
  const CommVqConfig& c = codebooks().config;
  const uint32_t d = c.dim();
  float* vec = ws->Floats(kSlotVec, d);
  float* scratch = ws->Floats(kSlotScratch, encoder_->ScratchFloats());
  float* rope =
      ws->Floats(kSlotRope, size_t{geometry().page_size} * geometry().head_dim);
  auto* codes = reinterpret_cast<uint16_t*>(
      ws->Bytes(kSlotCodes, sizeof(uint16_t) * c.key_codes()));
  uint8_t* rec = payload;
  return ForEachRecord(
      geometry(), c, pages, rope,
      [&](size_t p, int kv, uint32_t l, uint32_t t, uint64_t offset,
          const auto& rotate) -> absl::Status {
        LoadElements(geometry().dtype, pages[p].data + offset, d, vec);
        KVH_RETURN_IF_ERROR(
            CheckRunFinite(vec, d, p, kv, l, t, "element", "commvq"));
        if (kv == 0) {
          rotate(vec, /*inverse=*/true);
          encoder_->EncodeKey(l, vec, codes, scratch);
          PackCodes(codes, c.key_codes(), c.key_code_bits(), rec);
          rec += key_record_bytes_;
        } else {
          encoder_->EncodeValue(l, vec, rec, scratch);
          rec += value_record_bytes_;
        }
        return absl::OkStatus();
      });
}

absl::Status CommVqCodec::CheckPadding(absl::Span<const uint8_t> raw,
                                       size_t num_pages) const {
  const CommVqConfig& c = codebooks().config;
  const uint8_t* rec = raw.data();
  const uint64_t records = num_pages * geometry().num_layers;
  // The page_size records of one kind (key / value) of record group r.
  auto check = [&](uint64_t r, const char* kind, uint64_t bytes,
                   uint64_t bits) -> absl::Status {
    for (uint32_t t = 0; t < geometry().page_size; ++t, rec += bytes) {
      if (!PaddingClear(rec, bytes, bits)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "buffer: payload: %s record %u has nonzero padding bits", kind,
            r * geometry().page_size + t));
      }
    }
    return absl::OkStatus();
  };
  for (uint64_t r = 0; r < records; ++r) {
    KVH_RETURN_IF_ERROR(
        check(r, "key", key_record_bytes_, c.key_bits_per_token()));
    KVH_RETURN_IF_ERROR(
        check(r, "value", value_record_bytes_, c.value_bits_per_token()));
  }
  return absl::OkStatus();
}

absl::Status CommVqCodec::DecodePayload(absl::Span<const uint8_t> raw,
                                        absl::Span<const MutablePageRef> pages,
                                        CodecWorkspace* ws) const {
  const CommVqCodebooks& cb = codebooks();
  const CommVqConfig& c = cb.config;
  const uint32_t d = c.dim();
  KVH_RETURN_IF_ERROR(CheckPadding(raw, pages.size()));
  float* vec = ws->Floats(kSlotVec, d);
  float* rope =
      ws->Floats(kSlotRope, size_t{geometry().page_size} * geometry().head_dim);
  auto* codes = reinterpret_cast<uint16_t*>(
      ws->Bytes(kSlotCodes, sizeof(uint16_t) * c.key_codes()));
  const uint8_t* rec = raw.data();
  return ForEachRecord(
      geometry(), c, pages, rope,
      [&](size_t p, int kv, uint32_t l, uint32_t, uint64_t offset,
          const auto& rotate) -> absl::Status {
        if (kv == 0) {
          UnpackCodes(rec, c.key_codes(), c.key_code_bits(), codes);
          DecodeCommVqKey(cb, l, codes, vec);
          rotate(vec, /*inverse=*/false);
          rec += key_record_bytes_;
        } else {
          DecodeCommVqValue(cb, l, rec, vec);
          rec += value_record_bytes_;
        }
        StoreElements(geometry().dtype, vec, d, pages[p].data + offset);
        return absl::OkStatus();
      });
}

CodecRegistry::Factory CommVqCodecFactory(
    std::shared_ptr<const CommVqCodebooks> codebooks) {
  return FixedCalibrationFactory<CommVqCodec>(std::move(codebooks));
}

}  // namespace kvharbor
