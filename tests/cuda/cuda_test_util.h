// Helpers for the GPU tests: RAII device / pinned buffers, random page data
// per dtype, sentinel fills and tolerance checks. Test-only; not thread-safe.
#ifndef KVHARBOR_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define KVHARBOR_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/float_formats.h"
#include "types/geometry.h"

namespace kvharbor {
namespace gpu {
namespace testing {

#define KVH_CUDA_REQUIRE(call)                         \
  do {                                                 \
    const cudaError_t kvh_e_ = (call);                 \
    INFO(#call << ": " << cudaGetErrorString(kvh_e_)); \
    REQUIRE(kvh_e_ == cudaSuccess);                    \
  } while (0)

#define KVH_STATUS_REQUIRE(expr)              \
  do {                                        \
    const absl::Status kvh_s_ = (expr);       \
    INFO(#expr << ": " << kvh_s_.ToString()); \
    REQUIRE(kvh_s_.ok());                     \
  } while (0)

// Device memory, freed on destruction.
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t bytes) : n_(bytes) {
    KVH_CUDA_REQUIRE(cudaMalloc(&p_, bytes == 0 ? 1 : bytes));
  }
  ~DeviceBuf() { cudaFree(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  uint8_t* bytes() const { return static_cast<uint8_t*>(p_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }
  void Upload(const void* src, size_t n, size_t offset = 0) {
    KVH_CUDA_REQUIRE(
        cudaMemcpy(bytes() + offset, src, n, cudaMemcpyHostToDevice));
  }
  void Download(void* dst, size_t n, size_t offset = 0) const {
    KVH_CUDA_REQUIRE(
        cudaMemcpy(dst, bytes() + offset, n, cudaMemcpyDeviceToHost));
  }
  void Fill(uint8_t v) { KVH_CUDA_REQUIRE(cudaMemset(p_, v, n_)); }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// Pinned, mapped host memory, freed on destruction.
class PinnedBuf {
 public:
  explicit PinnedBuf(size_t bytes) : n_(bytes) {
    KVH_CUDA_REQUIRE(
        cudaHostAlloc(&p_, bytes == 0 ? 1 : bytes, cudaHostAllocMapped));
  }
  ~PinnedBuf() { cudaFreeHost(p_); }
  PinnedBuf(const PinnedBuf&) = delete;
  PinnedBuf& operator=(const PinnedBuf&) = delete;
  uint8_t* bytes() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return n_; }
  void Fill(uint8_t v) { std::memset(p_, v, n_); }

 private:
  void* p_ = nullptr;
  size_t n_;
};

inline float ElementToFloat(DType d, const uint8_t* p) {
  uint16_t h;
  float f;
  switch (d) {
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    case DType::kFP16:
      std::memcpy(&h, p, 2);
      return Fp16ToFloat(h);
    case DType::kFP32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::kFP8E4M3:
      return Fp8E4M3ToFloat(*p);
    case DType::kUnspecified:
      break;
  }
  return 0.0f;
}

inline void FloatToElement(DType d, float v, uint8_t* p) {
  uint16_t h;
  switch (d) {
    case DType::kBF16:
      h = FloatToBf16(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::kFP16:
      h = FloatToFp16(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::kFP32:
      std::memcpy(p, &v, 4);
      return;
    case DType::kFP8E4M3:
      *p = FloatToFp8E4M3(v);
      return;
    case DType::kUnspecified:
      break;
  }
}

// `n` elements of dtype `d`, Gaussian with the given scale, none exactly 0.
inline std::vector<uint8_t> RandomElements(DType d, size_t n, float scale,
                                           std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  const size_t es = DTypeSize(d);
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    float v = dist(rng);
    if (std::fabs(v) < 1e-3f * scale) v = 1e-3f * scale;
    FloatToElement(d, v, out.data() + i * es);
  }
  return out;
}

// Bitwise float equality (NaN payloads and signed zeros included).
inline bool SameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Relative step of a dtype near 1 (one unit in the last place).
inline float DTypeUlp(DType d) {
  switch (d) {
    case DType::kBF16:
      return 1.0f / 128;
    case DType::kFP16:
      return 1.0f / 1024;
    case DType::kFP32:
      return 1.0f / 8388608;
    case DType::kFP8E4M3:
      return 1.0f / 8;
    case DType::kUnspecified:
      break;
  }
  return 1.0f;
}

}  // namespace testing
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CUDA_CUDA_TEST_UTIL_H_
