// Helpers for the GPU codec tests: calibrations over a sweep of range
// layouts, and page sets that live both on the host (for the CPU codec) and
// scattered in device memory (for the GPU codec). Test-only.
#ifndef KVHARBOR_TESTS_CUDA_CODEC_TEST_UTIL_H_
#define KVHARBOR_TESTS_CUDA_CODEC_TEST_UTIL_H_

#include <memory>
#include <random>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace testing {

// Range layouts over `c` components (c >= 8):
//  0: the seed's FP8 / int4 / int2 split;
//  1: int8 / int1 / FP8 with a gap of dropped components;
//  2: all FP8.
inline std::vector<KvtcRange> RangeLayout(int which, uint64_t c) {
  switch (which) {
    case 0:
      return {{KvtcQuantType::kFp8, 0, 0, c / 4},
              {KvtcQuantType::kIntX, 4, c / 4, c / 2},
              {KvtcQuantType::kIntX, 2, c / 2, c}};
    case 1:
      return {{KvtcQuantType::kIntX, 8, 0, c / 8},
              {KvtcQuantType::kIntX, 1, c / 8, c / 2 + 1},
              {KvtcQuantType::kFp8, 0, c / 2 + 3, c - 1}};
    default:
      return {{KvtcQuantType::kFp8, 0, 0, c}};
  }
}

enum class BasisKind { kIdentity, kRandom };

inline std::shared_ptr<KvtcCalibration> MakeCalibration(
    const Geometry& g, KvtcRowKind kind, RopeStyle rope, uint32_t sinks,
    BasisKind basis, int ranges, uint64_t components, std::mt19937_64& rng) {
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = kind;
  cal->num_layers = g.num_layers;
  cal->num_kv_heads = g.num_kv_heads;
  cal->head_dim = g.head_dim;
  cal->page_size = g.page_size;
  cal->sink_tokens = sinks;
  cal->rope_style = rope;
  cal->rope_theta = rope == RopeStyle::kNone ? 0.0f : 10000.0f;
  const uint64_t f = cal->ExpectedFeatures();
  std::normal_distribution<float> d(0.0f, 0.2f);
  for (int kv = 0; kv < 2; ++kv) {
    KvtcBasis b =
        basis == BasisKind::kIdentity
            ? IdentityBasis(f, components, RangeLayout(ranges, components))
            : RandomOrthonormalBasis(f, components, rng(),
                                     RangeLayout(ranges, components));
    for (float& m : b.mean) m = d(rng);  // exercise mean subtract / add
    (kv == 0 ? cal->keys : cal->values) = std::move(b);
  }
  return cal;
}

// Pages on the host and, scattered in reverse order with gaps, on the device.
struct PageSet {
  Geometry g;
  std::vector<uint64_t> positions;
  std::vector<std::vector<uint8_t>> host;
  std::unique_ptr<DeviceBuf> arena;
  std::vector<size_t> offsets;

  size_t stride() const { return g.PageBytes() + 512; }
  std::vector<PageRef> HostRefs() const {
    std::vector<PageRef> r;
    for (size_t i = 0; i < host.size(); ++i) {
      r.push_back({host[i].data(), positions[i]});
    }
    return r;
  }
  std::vector<PageRef> DeviceRefs() const {
    std::vector<PageRef> r;
    for (size_t i = 0; i < host.size(); ++i) {
      r.push_back({arena->bytes() + offsets[i], positions[i]});
    }
    return r;
  }
  std::vector<MutablePageRef> DeviceOut() const {
    std::vector<MutablePageRef> r;
    for (size_t i = 0; i < host.size(); ++i) {
      r.push_back({arena->bytes() + offsets[i], positions[i]});
    }
    return r;
  }
  // Device pages as host vectors.
  std::vector<std::vector<uint8_t>> Download() const {
    std::vector<std::vector<uint8_t>> out(host.size());
    for (size_t i = 0; i < host.size(); ++i) {
      out[i].resize(g.PageBytes());
      arena->Download(out[i].data(), out[i].size(), offsets[i]);
    }
    return out;
  }
  void UploadAll() {
    for (size_t i = 0; i < host.size(); ++i) {
      arena->Upload(host[i].data(), host[i].size(), offsets[i]);
    }
  }
};

inline PageSet MakePages(const Geometry& g, std::vector<uint64_t> positions,
                         std::mt19937_64& rng) {
  PageSet s;
  s.g = g;
  s.positions = std::move(positions);
  const size_t n = s.positions.size();
  s.arena = std::make_unique<DeviceBuf>(n * s.stride());
  for (size_t i = 0; i < n; ++i) {
    s.host.push_back(RandomElements(g.dtype, g.ElementsPerPage(), 1.0f, rng));
    s.offsets.push_back((n - 1 - i) * s.stride() + 256);
  }
  s.UploadAll();
  return s;
}

// Host pages that are to be decoded into (filled with a sentinel).
inline std::vector<std::vector<uint8_t>> SentinelPages(const PageSet& s,
                                                       uint8_t v) {
  return std::vector<std::vector<uint8_t>>(
      s.host.size(), std::vector<uint8_t>(s.g.PageBytes(), v));
}
inline std::vector<MutablePageRef> Refs(std::vector<std::vector<uint8_t>>& p,
                                        const std::vector<uint64_t>& pos) {
  std::vector<MutablePageRef> r;
  for (size_t i = 0; i < p.size(); ++i) r.push_back({p[i].data(), pos[i]});
  return r;
}

}  // namespace testing
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CUDA_CODEC_TEST_UTIL_H_
