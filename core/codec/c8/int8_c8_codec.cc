#include "core/codec/c8/int8_c8_codec.h"

#include <xxh3.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/envelope.h"
#include "core/codec/page_elements.h"

namespace kvharbor {
namespace {

absl::Status CheckArray(const std::vector<float>& v, const char* name,
                        bool is_scale, uint32_t kv_channels) {
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = v[i];
    const bool ok = is_scale ? ValidC8Scale(x) : ValidC8Offset(x);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "c8 scales: %s[layer %u][channel %u]: %g is invalid (%s)", name,
          i / kv_channels, i % kv_channels, x,
          is_scale ? "must be finite and > 0"
                   : "must be finite and within [-128, 127]"));
    }
  }
  return absl::OkStatus();
}

// Calls f(page, kv, layer, token, idx, code) for every run of `channels`
// elements of `num_pages` pages (one token's K or V of one layer; idx: the
// run's first element in its page, code: its first code in the payload,
// which holds one code per element, page after page), stopping at the first
// error f returns.
template <typename F>
absl::Status ForEachRun(const Geometry& g, uint32_t channels, size_t num_pages,
                        F&& f) {
  const uint64_t elems = g.ElementsPerPage();
  for (size_t p = 0; p < num_pages; ++p) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        const uint64_t base = PageBlockElementOffset(g, kv, l);
        for (uint32_t t = 0; t < g.page_size; ++t) {
          const uint64_t idx = base + uint64_t{t} * channels;
          KVH_RETURN_IF_ERROR(f(p, kv, l, t, idx, p * elems + idx));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status C8Scales::Validate() const {
  if (num_layers == 0 || num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("c8 scales: num_layers: %u is out of range [1, %u]",
                        num_layers, kMaxLayers));
  }
  const uint64_t max_channels = uint64_t{kMaxKvHeads} * kMaxHeadDim;
  if (kv_channels == 0 || kv_channels > max_channels) {
    return absl::InvalidArgumentError(
        absl::StrFormat("c8 scales: kv_channels: %u is out of range [1, %u]",
                        kv_channels, max_channels));
  }
  const uint64_t n = uint64_t{num_layers} * kv_channels;
  const std::pair<const std::vector<float>*, const char*> arrays[] = {
      {&k_scale, "k_scale"},
      {&k_offset, "k_offset"},
      {&v_scale, "v_scale"},
      {&v_offset, "v_offset"}};
  for (const auto& [v, name] : arrays) {
    if (v->size() != n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "c8 scales: %s: %u values, want num_layers * kv_channels = %u", name,
          v->size(), n));
    }
  }
  KVH_RETURN_IF_ERROR(CheckArray(k_scale, "k_scale", true, kv_channels));
  KVH_RETURN_IF_ERROR(CheckArray(k_offset, "k_offset", false, kv_channels));
  KVH_RETURN_IF_ERROR(CheckArray(v_scale, "v_scale", true, kv_channels));
  return CheckArray(v_offset, "v_offset", false, kv_channels);
}

absl::Status C8Scales::CheckGeometry(const Geometry& g) const {
  if (num_layers != g.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "c8 scales: num_layers: %u, but geometry.num_layers is %u", num_layers,
        g.num_layers));
  }
  const uint64_t want = uint64_t{g.num_kv_heads} * g.head_dim;
  if (kv_channels != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "c8 scales: kv_channels: %u, but geometry has num_kv_heads * head_dim "
        "= %u",
        kv_channels, want));
  }
  return absl::OkStatus();
}

uint64_t C8Scales::Fingerprint() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const uint32_t dims[2] = {num_layers, kv_channels};
  XXH3_64bits_update(st, dims, sizeof(dims));
  for (const auto* v : {&k_scale, &k_offset, &v_scale, &v_offset}) {
    XXH3_64bits_update(st, v->data(), v->size() * sizeof(float));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

int8_t QuantizeC8(float x, float scale, float offset) {
  const float t = x / scale + offset;
  float r = std::nearbyint(t);  // default rounding mode: ties to even
  r = r < kC8Min ? kC8Min : (r > kC8Max ? kC8Max : r);
  return static_cast<int8_t>(r);
}

float DequantizeC8(int8_t q, float scale, float offset) {
  return (static_cast<float>(q) - offset) * scale;
}

void QuantizeC8Run(const float* x, const float* scale, const float* offset,
                   size_t n, int8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = QuantizeC8(x[i], scale[i], offset[i]);
}

void DequantizeC8Run(const int8_t* q, const float* scale, const float* offset,
                     size_t n, float* out) {
  for (size_t i = 0; i < n; ++i)
    out[i] = DequantizeC8(q[i], scale[i], offset[i]);
}

// ---------------------------------------------------------------- codec

Int8C8Codec::Int8C8Codec(const CodecParams& params,
                         std::shared_ptr<const C8Scales> s)
    : FixedPayloadCodec(params),
      scales_(std::move(s)),
      fingerprint_(scales_->Fingerprint()) {}

absl::StatusOr<std::unique_ptr<Int8C8Codec>> Int8C8Codec::Create(
    const CodecParams& params, std::shared_ptr<const C8Scales> scales) {
  KVH_RETURN_IF_ERROR(params.geometry.Validate());
  if (scales == nullptr) {
    return absl::InvalidArgumentError(
        "int8_c8: scales: missing (load them with "
        "LoadC8ScalesFromMsModelSlim)");
  }
  KVH_RETURN_IF_ERROR(scales->Validate());
  KVH_RETURN_IF_ERROR(scales->CheckGeometry(params.geometry));
  return std::unique_ptr<Int8C8Codec>(
      new Int8C8Codec(params, std::move(scales)));
}

absl::Status Int8C8Codec::EncodePayload(absl::Span<const PageRef> pages,
                                        uint8_t* out,
                                        CodecWorkspace* ws) const {
  const DType dtype = geometry().dtype;
  const size_t es = DTypeSize(dtype);
  const uint32_t c = scales_->kv_channels;
  float* run = ws->Floats(0, c);
  auto* payload = reinterpret_cast<int8_t*>(out);
  return ForEachRun(geometry(), c, pages.size(),
                    [&](size_t p, int kv, uint32_t l, uint32_t t, uint64_t idx,
                        uint64_t code) -> absl::Status {
                      LoadElements(dtype, pages[p].data + idx * es, c, run);
                      KVH_RETURN_IF_ERROR(CheckRunFinite(run, c, p, kv, l, t,
                                                         "channel", "int8_c8"));
                      QuantizeC8Run(run, scales_->scale(kv, l),
                                    scales_->offset(kv, l), c, payload + code);
                      return absl::OkStatus();
                    });
}

absl::Status Int8C8Codec::DecodePayload(absl::Span<const uint8_t> raw,
                                        absl::Span<const MutablePageRef> pages,
                                        CodecWorkspace* ws) const {
  const DType dtype = geometry().dtype;
  const size_t es = DTypeSize(dtype);
  const uint32_t c = scales_->kv_channels;
  float* run = ws->Floats(0, c);
  const auto* q = reinterpret_cast<const int8_t*>(raw.data());
  return ForEachRun(geometry(), c, pages.size(),
                    [&](size_t p, int kv, uint32_t l, uint32_t, uint64_t idx,
                        uint64_t code) -> absl::Status {
                      DequantizeC8Run(q + code, scales_->scale(kv, l),
                                      scales_->offset(kv, l), c, run);
                      StoreElements(dtype, run, c, pages[p].data + idx * es);
                      return absl::OkStatus();
                    });
}

CodecRegistry::Factory Int8C8CodecFactory(
    std::shared_ptr<const C8Scales> scales) {
  return FixedCalibrationFactory<Int8C8Codec>(std::move(scales));
}

}  // namespace kvharbor
