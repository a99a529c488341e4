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

constexpr const char* kKvName[2] = {"K", "V"};

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

}  // namespace

CommVqCodec::CommVqCodec(const CodecParams& params,
                         std::unique_ptr<CommVqEncoder> e)
    : geometry_(params.geometry),
      encoder_(std::move(e)),
      fingerprint_(encoder_->codebooks().Fingerprint()),
      key_record_bytes_(
          (encoder_->codebooks().config.key_bits_per_token() + 7) / 8),
      value_record_bytes_(
          (encoder_->codebooks().config.value_bits_per_token() + 7) / 8),
      zstd_(params.zstd),
      zstd_level_(params.zstd_level) {}

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
  return uint64_t{geometry_.num_layers} * geometry_.page_size *
         (key_record_bytes_ + value_record_bytes_);
}

absl::StatusOr<size_t> CommVqCodec::Encode(absl::Span<const PageRef> pages,
                                           absl::Span<uint8_t> out,
                                           CodecWorkspace* workspace) const {
  KVH_RETURN_IF_ERROR(CheckEncodeOut(pages, out).status());
  const Geometry& g = geometry_;
  const CommVqConfig& c = codebooks().config;
  const uint32_t d = c.dim(), half = g.head_dim / 2;
  const size_t es = DTypeSize(g.dtype);
  const bool rope = c.rope_style != RopeStyle::kNone;
  CodecWorkspace local;
  CodecWorkspace* ws = workspace != nullptr ? workspace : &local;
  float* vec = ws->Floats(kSlotVec, d);
  float* scratch = ws->Floats(kSlotScratch, encoder_->ScratchFloats());
  float* cos = ws->Floats(kSlotRope, 2 * size_t{g.page_size} * half);
  float* sin = cos + size_t{g.page_size} * half;
  auto* codes = reinterpret_cast<uint16_t*>(
      ws->Bytes(kSlotCodes, sizeof(uint16_t) * c.key_codes()));
  uint8_t* rec = out.data() + kEnvelopeHeaderBytes + 8 * pages.size();
  for (size_t p = 0; p < pages.size(); ++p) {
    if (rope) PageRopeTables(g, c, pages[p].first_position, cos, sin);
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t base = PageBlockElementOffset(g, kv, l);
        for (uint32_t t = 0; t < g.page_size; ++t) {
          LoadElements(g.dtype, pages[p].data + (base + uint64_t{t} * d) * es,
                       d, vec);
          const size_t bad = FirstNonFinite(vec, d);
          if (bad != d) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "pages[%u]: %s of layer %u, token %u, element %u is %g; "
                "commvq cannot encode non-finite values",
                p, kKvName[kv], l, t, bad, vec[bad]));
          }
          if (kv == 0) {
            for (uint32_t h = 0; rope && h < g.num_kv_heads; ++h) {
              RotateRope(vec + size_t{h} * g.head_dim, g.head_dim, c.rope_style,
                         cos + size_t{t} * half, sin + size_t{t} * half,
                         /*inverse=*/true);
            }
            encoder_->EncodeKey(l, vec, codes, scratch);
            PackCodes(codes, c.key_codes(), c.key_code_bits(), rec);
            rec += key_record_bytes_;
          } else {
            encoder_->EncodeValue(l, vec, rec, scratch);
            rec += value_record_bytes_;
          }
        }
      }
    }
  }
  EnvelopeHeader h;
  h.codec_id = kCodecIdCommVq;
  h.geometry = g;
  h.calibration_fingerprint = fingerprint_;
  return FinishEnvelope(h, pages, pages.size() * PagePayloadBytes(), zstd_,
                        zstd_level_, out, ws);
}

absl::Status CommVqCodec::CheckPadding(absl::Span<const uint8_t> raw,
                                       size_t num_pages) const {
  const CommVqConfig& c = codebooks().config;
  const uint8_t* rec = raw.data();
  const uint64_t records = num_pages * geometry_.num_layers;
  // The page_size records of one kind (key / value) of record group r.
  auto check = [&](uint64_t r, const char* kind, uint64_t bytes,
                   uint64_t bits) -> absl::Status {
    for (uint32_t t = 0; t < geometry_.page_size; ++t, rec += bytes) {
      if (!PaddingClear(rec, bytes, bits)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "buffer: payload: %s record %u has nonzero padding bits", kind,
            r * geometry_.page_size + t));
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

absl::Status CommVqCodec::Decode(absl::Span<const uint8_t> buffer,
                                 absl::Span<const MutablePageRef> pages,
                                 CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(const ParsedEnvelope env,
                       ParseFlatEnvelope(buffer, kCodecIdCommVq, geometry_,
                                         pages, fingerprint_, "codebooks"));
  const Geometry& g = geometry_;
  const CommVqCodebooks& cb = codebooks();
  const CommVqConfig& c = cb.config;
  const uint32_t d = c.dim(), half = g.head_dim / 2;
  const size_t es = DTypeSize(g.dtype);
  const bool rope = c.rope_style != RopeStyle::kNone;
  CodecWorkspace local;
  CodecWorkspace* ws = workspace != nullptr ? workspace : &local;
  KVH_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> raw,
                       RawPayload(env, pages.size() * PagePayloadBytes(), ws));
  KVH_RETURN_IF_ERROR(CheckPadding(raw, pages.size()));
  float* vec = ws->Floats(kSlotVec, d);
  float* cos = ws->Floats(kSlotRope, 2 * size_t{g.page_size} * half);
  float* sin = cos + size_t{g.page_size} * half;
  auto* codes = reinterpret_cast<uint16_t*>(
      ws->Bytes(kSlotCodes, sizeof(uint16_t) * c.key_codes()));
  const uint8_t* rec = raw.data();
  for (size_t p = 0; p < pages.size(); ++p) {
    if (rope) PageRopeTables(g, c, pages[p].first_position, cos, sin);
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t base = PageBlockElementOffset(g, kv, l);
        for (uint32_t t = 0; t < g.page_size; ++t) {
          if (kv == 0) {
            UnpackCodes(rec, c.key_codes(), c.key_code_bits(), codes);
            DecodeCommVqKey(cb, l, codes, vec);
            for (uint32_t hh = 0; rope && hh < g.num_kv_heads; ++hh) {
              RotateRope(vec + size_t{hh} * g.head_dim, g.head_dim,
                         c.rope_style, cos + size_t{t} * half,
                         sin + size_t{t} * half, /*inverse=*/false);
            }
            rec += key_record_bytes_;
          } else {
            DecodeCommVqValue(cb, l, rec, vec);
            rec += value_record_bytes_;
          }
          StoreElements(g.dtype, vec, d,
                        pages[p].data + (base + uint64_t{t} * d) * es);
        }
      }
    }
  }
  return absl::OkStatus();
}

CodecRegistry::Factory CommVqCodecFactory(
    std::shared_ptr<const CommVqCodebooks> codebooks) {
  return
      [codebooks = std::move(codebooks)](
          const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        KVH_ASSIGN_OR_RETURN(std::unique_ptr<CommVqCodec> c,
                             CommVqCodec::Create(params, codebooks));
        return std::unique_ptr<Codec>(std::move(c));
      };
}

}  // namespace kvharbor
