// Helpers shared by the codec tests (and usable by the CUDA codec tests):
// page storage, element access by (kv, layer, token, head, dim), and small
// geometries and calibrations.
#ifndef KVHARBOR_TESTS_CORE_CODEC_KVTC_KVTC_TEST_UTIL_H_
#define KVHARBOR_TESTS_CORE_CODEC_KVTC_KVTC_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "types/geometry.h"

namespace kvharbor {
namespace testing {

inline Geometry SmallGeometry(
    DType dtype = DType::kFP32,
    PageLayout layout = PageLayout::kKvLayerTokenHeadDim) {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = dtype;
  g.layout = layout;
  return g;
}

// Element index in a page of (kv, layer, token, head, dim).
inline uint64_t ElementIndex(const Geometry& g, int kv, uint32_t l, uint32_t t,
                             uint32_t h, uint32_t d) {
  const uint64_t block = uint64_t{g.page_size} * g.num_kv_heads * g.head_dim;
  const uint64_t b = g.layout == PageLayout::kKvLayerTokenHeadDim
                         ? uint64_t(kv) * g.num_layers + l
                         : uint64_t{l} * 2 + kv;
  return b * block + (uint64_t{t} * g.num_kv_heads + h) * g.head_dim + d;
}

inline float ReadElement(const Geometry& g, const uint8_t* page, uint64_t i) {
  switch (g.dtype) {
    case DType::kFP32: {
      float v;
      std::memcpy(&v, page + 4 * i, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, page + 2 * i, 2);
      return Bf16ToFloat(v);
    }
    case DType::kFP16: {
      uint16_t v;
      std::memcpy(&v, page + 2 * i, 2);
      return Fp16ToFloat(v);
    }
    case DType::kFP8E4M3:
      return Fp8E4M3ToFloat(page[i]);
    case DType::kUnspecified:
      break;
  }
  return 0;
}

inline void WriteElement(const Geometry& g, uint8_t* page, uint64_t i,
                         float v) {
  switch (g.dtype) {
    case DType::kFP32:
      std::memcpy(page + 4 * i, &v, 4);
      return;
    case DType::kBF16: {
      const uint16_t b = FloatToBf16(v);
      std::memcpy(page + 2 * i, &b, 2);
      return;
    }
    case DType::kFP16: {
      const uint16_t b = FloatToFp16(v);
      std::memcpy(page + 2 * i, &b, 2);
      return;
    }
    case DType::kFP8E4M3:
      page[i] = FloatToFp8E4M3(v);
      return;
    case DType::kUnspecified:
      break;
  }
}

// A batch of pages with their own storage.
struct PageSet {
  Geometry g;
  std::vector<std::vector<uint8_t>> data;
  std::vector<uint64_t> positions;

  PageSet(const Geometry& geometry, std::vector<uint64_t> first_positions)
      : g(geometry), positions(std::move(first_positions)) {
    data.assign(positions.size(), std::vector<uint8_t>(g.PageBytes(), 0xCD));
  }
  std::vector<PageRef> Refs() const {
    std::vector<PageRef> r;
    for (size_t i = 0; i < data.size(); ++i) {
      r.push_back({data[i].data(), positions[i]});
    }
    return r;
  }
  std::vector<MutablePageRef> MutableRefs() {
    std::vector<MutablePageRef> r;
    for (size_t i = 0; i < data.size(); ++i) {
      r.push_back({data[i].data(), positions[i]});
    }
    return r;
  }
  uint64_t Elements() const { return g.ElementsPerPage(); }
  float At(size_t p, uint64_t i) const {
    return ReadElement(g, data[p].data(), i);
  }
  void Set(size_t p, uint64_t i, float v) {
    WriteElement(g, data[p].data(), i, v);
  }
  // Gaussian values times `scale`, rounded to the page dtype.
  void FillRandom(uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    for (size_t p = 0; p < data.size(); ++p) {
      for (uint64_t i = 0; i < Elements(); ++i) Set(p, i, dist(rng));
    }
  }
};

inline std::vector<KvtcRange> Fp8All(uint64_t components) {
  return {{KvtcQuantType::kFp8, 0, 0, components}};
}

inline std::vector<KvtcRange> IntXAll(uint64_t components, int bits) {
  return {{KvtcQuantType::kIntX, bits, 0, components}};
}

// A calibration for `g` with the given bases (features must fit the kind).
inline std::shared_ptr<KvtcCalibration> MakeCalibration(
    const Geometry& g, KvtcRowKind kind, KvtcBasis keys, KvtcBasis values,
    uint32_t sink_tokens = 0) {
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = kind;
  cal->num_layers = g.num_layers;
  cal->num_kv_heads = g.num_kv_heads;
  cal->head_dim = g.head_dim;
  cal->page_size = g.page_size;
  cal->sink_tokens = sink_tokens;
  cal->keys = std::move(keys);
  cal->values = std::move(values);
  return cal;
}

inline uint64_t FeaturesFor(const Geometry& g, KvtcRowKind kind) {
  const uint64_t hd = uint64_t{g.num_kv_heads} * g.head_dim;
  return kind == KvtcRowKind::kPerToken ? hd * g.num_layers : hd * g.page_size;
}

// Lower bound on the smallest squared cosine of the principal angles between
// the first `rank` columns of `a` and of `b` (orthonormal columns both, same
// features): the squared cosines are the squared singular values of A^T B,
// each <= 1, so the smallest is >= ||A^T B||_F^2 - (rank - 1).
inline double SubspaceMinCos2(const KvtcBasis& a, const KvtcBasis& b,
                              uint64_t rank) {
  double sum = 0;
  for (uint64_t i = 0; i < rank; ++i) {
    for (uint64_t j = 0; j < rank; ++j) {
      double dot = 0;
      for (uint64_t f = 0; f < a.features; ++f) {
        dot += double{a.projection[f * a.components + i]} *
               b.projection[f * b.components + j];
      }
      sum += dot * dot;
    }
  }
  return sum - static_cast<double>(rank - 1);
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CORE_CODEC_KVTC_KVTC_TEST_UTIL_H_
