// The GPU XXH3-64 kernel (cuda/kernels/xxh3_checksum.h) equals libxxhash's
// XXH3_64bits over every length to 1.1 KiB, the code paths' and blocks'
// boundaries, page sizes up to 4 MiB, batches that fill warps partly,
// unaligned inputs, and through Xxh3Checksummer; then prints its throughput
// on 1 GiB of 2 MiB pages (the Llama-3.1-8B page of 16 tokens).
#include "cuda/kernels/xxh3_checksum.h"

#include <cuda_runtime_api.h>
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace testing {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t k = 0; k < 8 && i + k < n; ++k) v[i + k] = uint8_t(r >> 8 * k);
  }
  return v;
}

// Hashes `count` inputs of `bytes` at `offsets` into `dev` on the GPU.
std::vector<uint64_t> GpuHashes(const DeviceBuf& dev,
                                const std::vector<uint64_t>& offsets,
                                uint64_t bytes) {
  std::vector<uint64_t> addrs;
  for (uint64_t o : offsets) {
    addrs.push_back(reinterpret_cast<uint64_t>(dev.bytes() + o));
  }
  DeviceBuf table(addrs.size() * 8), out(addrs.size() * 8);
  table.Upload(addrs.data(), addrs.size() * 8);
  Xxh3ChecksumArgs a;
  a.inputs = table.as<uint64_t>();
  a.bytes = bytes;
  a.count = static_cast<uint32_t>(addrs.size());
  a.out = out.as<uint64_t>();
  KVH_STATUS_REQUIRE(LaunchXxh3Checksum(a, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<uint64_t> h(addrs.size());
  out.Download(h.data(), h.size() * 8);
  return h;
}

TEST_CASE("GPU XXH3: every length to 1.1 KiB, aligned and not", "[gpu][xxh3]") {
  const std::vector<uint8_t> host = RandomBytes(1200, 1);
  DeviceBuf dev(host.size());
  dev.Upload(host.data(), host.size());
  size_t checked = 0;
  for (uint64_t len = 0; len <= 1100; ++len) {
    // Two inputs per launch: at offset 0 (aligned) and at offset 3.
    const std::vector<uint64_t> h = GpuHashes(dev, {0, 3}, len);
    INFO("len " << len);
    REQUIRE(h[0] == XXH3_64bits(host.data(), len));
    REQUIRE(h[1] == XXH3_64bits(host.data() + 3, len));
    checked += 2;
  }
  std::printf("xxh3 gpu: %zu hashes of lengths 0..1100 equal XXH3_64bits\n",
              checked);
}

TEST_CASE("GPU XXH3: block boundaries, page sizes, partial warps",
          "[gpu][xxh3]") {
  std::vector<uint64_t> sizes = {
      1023,  1024,  1025,   2047,    2048,    2049,    4096,
      65536, 65599, 512000, 1 << 20, 2 << 20, 4 << 20, (4 << 20) - 1};
  for (uint64_t b = 2; b <= 12; ++b) {
    for (int d = -64; d <= 64; d += 32) sizes.push_back(b * 1024 + d);
  }
  const std::vector<uint8_t> host = RandomBytes((4 << 20) + 4096, 2);
  DeviceBuf dev(host.size());
  dev.Upload(host.data(), host.size());
  for (uint64_t len : sizes) {
    // 37 inputs: one full warp-block of groups (32) and a partial one, at
    // staggered (and some unaligned) offsets inside the buffer.
    std::vector<uint64_t> offsets;
    for (uint64_t i = 0; i < 37; ++i) {
      offsets.push_back((i * 97 + (i % 5 == 4 ? 1 : 0)) %
                        (host.size() - len + 1));
    }
    const std::vector<uint64_t> h = GpuHashes(dev, offsets, len);
    for (size_t i = 0; i < offsets.size(); ++i) {
      INFO("len " << len << " input " << i << " offset " << offsets[i]);
      REQUIRE(h[i] == XXH3_64bits(host.data() + offsets[i], len));
    }
  }
  std::printf("xxh3 gpu: %zu page sizes x 37 inputs equal XXH3_64bits\n",
              sizes.size());
}

TEST_CASE("GPU XXH3: Xxh3Checksummer hashes host lists of device pages",
          "[gpu][xxh3]") {
  absl::StatusOr<std::unique_ptr<Xxh3Checksummer>> c =
      Xxh3Checksummer::Create(0);
  KVH_STATUS_REQUIRE(c.status());
  constexpr uint64_t kPage = 64 * 1024 + 512;
  for (size_t n : {1, 5, 40, 300}) {  // grows its tables
    const std::vector<uint8_t> host = RandomBytes(n * kPage, uint32_t(n));
    DeviceBuf dev(host.size());
    dev.Upload(host.data(), host.size());
    std::vector<const uint8_t*> pages;
    for (size_t i = 0; i < n; ++i) pages.push_back(dev.bytes() + i * kPage);
    absl::StatusOr<std::vector<uint64_t>> h = (*c)->Checksum(pages, kPage);
    KVH_STATUS_REQUIRE(h.status());
    REQUIRE(h->size() == n);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE((*h)[i] == XXH3_64bits(host.data() + i * kPage, kPage));
    }
  }
  absl::StatusOr<std::vector<uint64_t>> none = (*c)->Checksum({}, kPage);
  KVH_STATUS_REQUIRE(none.status());
  CHECK(none->empty());
}

TEST_CASE("GPU XXH3: throughput on 2 MiB pages", "[gpu][xxh3][perf]") {
  constexpr uint64_t kPage = 2 << 20;  // 16 tokens, Llama-3.1-8B, bf16
  constexpr size_t kPages = 512;       // 1 GiB
  DeviceBuf dev(kPage * kPages);
  KVH_CUDA_REQUIRE(cudaMemset(dev.bytes(), 0x5a, dev.size()));
  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < kPages; ++i) offsets.push_back(i * kPage);
  GpuHashes(dev, offsets, kPage);  // warm-up
  cudaEvent_t t0, t1;
  KVH_CUDA_REQUIRE(cudaEventCreate(&t0));
  KVH_CUDA_REQUIRE(cudaEventCreate(&t1));
  std::vector<uint64_t> addrs;
  for (uint64_t o : offsets) {
    addrs.push_back(reinterpret_cast<uint64_t>(dev.bytes() + o));
  }
  DeviceBuf table(kPages * 8), out(kPages * 8);
  table.Upload(addrs.data(), kPages * 8);
  Xxh3ChecksumArgs a{table.as<uint64_t>(), kPage, uint32_t(kPages),
                     out.as<uint64_t>()};
  KVH_CUDA_REQUIRE(cudaEventRecord(t0));
  KVH_STATUS_REQUIRE(LaunchXxh3Checksum(a, nullptr));
  KVH_CUDA_REQUIRE(cudaEventRecord(t1));
  KVH_CUDA_REQUIRE(cudaEventSynchronize(t1));
  float ms = 0;
  KVH_CUDA_REQUIRE(cudaEventElapsedTime(&ms, t0, t1));
  std::printf(
      "xxh3 gpu: %zu pages of %llu bytes (1 GiB) in %.3f ms: %.1f GB/s\n",
      kPages, static_cast<unsigned long long>(kPage), ms,
      kPage * kPages / (ms * 1e6));
  std::vector<uint64_t> h(kPages);
  out.Download(h.data(), kPages * 8);
  std::vector<uint8_t> page(kPage, 0x5a);
  CHECK(h[kPages - 1] == XXH3_64bits(page.data(), kPage));
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
}

}  // namespace
}  // namespace testing
}  // namespace gpu
}  // namespace kvharbor
