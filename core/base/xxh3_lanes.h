// XXH3-64 (seed 0, default secret; what XXH3_64bits of libxxhash 0.8
// computes) written as eight independent lanes: the formulation the GPU
// checksum kernel (cuda/kernels/xxh3_checksum.h) runs with one thread per lane,
// so that CI checks its arithmetic against libxxhash on the CPU
// (tests/core/base/xxh3_lanes_test.cc) and the GPU test only has to check
// the kernel's loads and launch.
//
// XXH3 of more than 240 bytes keeps eight 64-bit accumulators; accumulator i
// of a 64-byte stripe reads only input words i and i ^ 1 and secret words,
// and the scramble after each 1024-byte block acts on each accumulator
// alone, so lane i can run over the whole input by itself
// (Xxh3LongLane) and the eight lanes meet once at the end (Xxh3MergeLanes).
// Inputs of at most 240 bytes (Xxh3Short) are a few multiplies and run on
// one thread.
//
// Plain constexpr C++ with no header of its own beyond <cstdint>: the
// kernel calls the same functions from device code (nvcc
// --expt-relaxed-constexpr). Memory is read through the caller's `Load`
// functor or a byte pointer; nothing is allocated. Thread-safe.
#ifndef KVHARBOR_CORE_BASE_XXH3_LANES_H_
#define KVHARBOR_CORE_BASE_XXH3_LANES_H_

#include <cstddef>
#include <cstdint>

namespace kvharbor {
namespace xxh3 {

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

inline constexpr size_t kSecretBytes = 192;
inline constexpr size_t kStripeBytes = 64;
inline constexpr size_t kLanes = 8;
inline constexpr size_t kStripesPerBlock = (kSecretBytes - kStripeBytes) / 8;
inline constexpr size_t kBlockBytes = kStripeBytes * kStripesPerBlock;
inline constexpr size_t kMidsizeMax = 240;

// XXH3_kSecret: the default secret (the kernel keeps a copy in shared
// memory; Xxh3* take it as a pointer so that device code reads that copy).
inline constexpr uint8_t kSecret[kSecretBytes] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
    0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
    0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
    0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
    0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
    0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
    0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

constexpr uint64_t ReadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
constexpr uint32_t ReadLE32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}
constexpr uint64_t Rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
constexpr uint64_t Swap64(uint64_t x) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((x >> (8 * i)) & 0xff);
  return r;
}
constexpr uint64_t Mul32To64(uint64_t x, uint64_t y) {
  return (x & 0xFFFFFFFF) * (y & 0xFFFFFFFF);
}
// Low xor high half of the 128-bit product (XXH3_mul128_fold64).
constexpr uint64_t Mul128Fold64(uint64_t lhs, uint64_t rhs) {
  const uint64_t lo_lo = Mul32To64(lhs, rhs);
  const uint64_t hi_lo = Mul32To64(lhs >> 32, rhs);
  const uint64_t lo_hi = Mul32To64(lhs, rhs >> 32);
  const uint64_t hi_hi = Mul32To64(lhs >> 32, rhs >> 32);
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFF) + lo_hi;
  const uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
  const uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFF);
  return lower ^ upper;
}
constexpr uint64_t Avalanche3(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
constexpr uint64_t Avalanche64(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
constexpr uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
constexpr uint64_t Mix16(const uint8_t* in, const uint8_t* secret) {
  return Mul128Fold64(ReadLE64(in) ^ ReadLE64(secret),
                      ReadLE64(in + 8) ^ ReadLE64(secret + 8));
}

// XXH3_64bits of `len` <= 240 bytes at `in` (bytes read one at a time).
constexpr uint64_t Xxh3Short(const uint8_t* in, size_t len,
                             const uint8_t* secret) {
  if (len == 0) {
    return Avalanche64(ReadLE64(secret + 56) ^ ReadLE64(secret + 64));
  }
  if (len <= 3) {
    const uint32_t combined =
        uint32_t{in[0]} << 16 | uint32_t{in[len >> 1]} << 24 |
        uint32_t{in[len - 1]} | static_cast<uint32_t>(len) << 8;
    const uint64_t bitflip = ReadLE32(secret) ^ ReadLE32(secret + 4);
    return Avalanche64(uint64_t{combined} ^ bitflip);
  }
  if (len <= 8) {
    const uint64_t input64 =
        ReadLE32(in + len - 4) + (uint64_t{ReadLE32(in)} << 32);
    const uint64_t bitflip = ReadLE64(secret + 8) ^ ReadLE64(secret + 16);
    return Rrmxmx(input64 ^ bitflip, len);
  }
  if (len <= 16) {
    const uint64_t lo =
        ReadLE64(in) ^ (ReadLE64(secret + 24) ^ ReadLE64(secret + 32));
    const uint64_t hi = ReadLE64(in + len - 8) ^
                        (ReadLE64(secret + 40) ^ ReadLE64(secret + 48));
    return Avalanche3(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16(in + 48, secret + 96);
          acc += Mix16(in + len - 64, secret + 112);
        }
        acc += Mix16(in + 32, secret + 64);
        acc += Mix16(in + len - 48, secret + 80);
      }
      acc += Mix16(in + 16, secret + 32);
      acc += Mix16(in + len - 32, secret + 48);
    }
    acc += Mix16(in, secret);
    acc += Mix16(in + len - 16, secret + 16);
    return Avalanche3(acc);
  }
  for (size_t i = 0; i < 8; ++i) acc += Mix16(in + 16 * i, secret + 16 * i);
  acc = Avalanche3(acc);
  const size_t rounds = len / 16;
  for (size_t i = 8; i < rounds; ++i) {
    acc += Mix16(in + 16 * i, secret + 16 * (i - 8) + 3);
  }
  // XXH3_SECRET_SIZE_MIN (136) - XXH3_MIDSIZE_LASTOFFSET (17).
  acc += Mix16(in + len - 16, secret + 136 - 17);
  return Avalanche3(acc);
}

// One stripe's step of lane `lane`: `own` and `partner` are the stripe's
// input words `lane` and `lane ^ 1`, `key` the secret word for this lane
// and stripe.
constexpr uint64_t LaneStep(uint64_t acc, uint64_t own, uint64_t partner,
                            uint64_t key) {
  const uint64_t k = own ^ key;
  return acc + partner + Mul32To64(k, k >> 32);
}

constexpr uint64_t LaneInit(size_t lane) {
  constexpr uint64_t kInit[kLanes] = {kPrime32_3, kPrime64_1, kPrime64_2,
                                      kPrime64_3, kPrime64_4, kPrime32_2,
                                      kPrime64_5, kPrime32_1};
  return kInit[lane];
}

// Accumulator `lane` (0..7) of XXH3_64bits over `len` > 240 bytes. `load(o)`
// returns the input word (8 bytes, little-endian) at byte offset o; the lane
// asks for words 8*lane and 8*(lane^1) of each stripe, in order, with the
// same sequence of offsets in every lane.
template <class Load>
constexpr uint64_t Xxh3LongLane(size_t lane, uint64_t len, Load load,
                                const uint8_t* secret) {
  uint64_t acc = LaneInit(lane);
  const uint64_t own = 8 * lane;
  const uint64_t partner = 8 * (lane ^ 1);
  const uint64_t blocks = (len - 1) / kBlockBytes;
  const uint64_t scramble_key =
      ReadLE64(secret + kSecretBytes - kStripeBytes + own);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t base = b * kBlockBytes;
    for (size_t s = 0; s < kStripesPerBlock; ++s) {
      const uint64_t o = base + s * kStripeBytes;
      acc = LaneStep(acc, load(o + own), load(o + partner),
                     ReadLE64(secret + 8 * s + own));
    }
    acc ^= acc >> 47;
    acc ^= scramble_key;
    acc *= kPrime32_1;
  }
  const uint64_t base = blocks * kBlockBytes;
  const uint64_t stripes = ((len - 1) - base) / kStripeBytes;
  for (uint64_t s = 0; s < stripes; ++s) {
    const uint64_t o = base + s * kStripeBytes;
    acc = LaneStep(acc, load(o + own), load(o + partner),
                   ReadLE64(secret + 8 * s + own));
  }
  // The last stripe ends at the input's end (it may overlap the previous
  // one), with a secret offset that is not a multiple of 8.
  const uint64_t last = len - kStripeBytes;
  return LaneStep(acc, load(last + own), load(last + partner),
                  ReadLE64(secret + kSecretBytes - kStripeBytes - 7 + own));
}

// The hash from the eight lanes' accumulators.
constexpr uint64_t Xxh3MergeLanes(const uint64_t* acc, uint64_t len,
                                  const uint8_t* secret) {
  uint64_t result = len * kPrime64_1;
  for (size_t i = 0; i < 4; ++i) {
    const uint8_t* s = secret + 11 + 16 * i;
    result += Mul128Fold64(acc[2 * i] ^ ReadLE64(s),
                           acc[2 * i + 1] ^ ReadLE64(s + 8));
  }
  return Avalanche3(result);
}

// XXH3_64bits of `len` bytes at `in`, lane after lane: the CPU reference of
// the kernel's arithmetic (slow: bytes assembled one at a time).
constexpr uint64_t Xxh3ByLanes(const uint8_t* in, uint64_t len,
                               const uint8_t* secret = kSecret) {
  if (len <= kMidsizeMax) return Xxh3Short(in, len, secret);
  uint64_t acc[kLanes] = {};
  for (size_t lane = 0; lane < kLanes; ++lane) {
    acc[lane] = Xxh3LongLane(
        lane, len, [in](uint64_t o) { return ReadLE64(in + o); }, secret);
  }
  return Xxh3MergeLanes(acc, len, secret);
}

}  // namespace xxh3
}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_XXH3_LANES_H_
