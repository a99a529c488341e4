// GPU CommVQ (cuda/codec/commvq_gpu.h) against the CPU reference of
// core/codec/commvq/commvq_codebooks.h, bit for bit: key / value decoding of
// random codes, the encoder's score tables, and key / value encoding (codes and
// bits identical), over a sweep of configurations (levels 2..256, group sizes,
// residual stages, RoPE pair orders, value rows not a multiple of 8).
#include "cuda/codec/commvq_gpu.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/codec/commvq/commvq_codebooks.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;
using testing::SameBits;

CommVqConfig Config(uint32_t layers, uint32_t heads, uint32_t head_dim,
                    RopeStyle rope, uint32_t levels, uint32_t g, uint32_t r,
                    uint32_t rows, uint32_t stages) {
  CommVqConfig c;
  c.num_layers = layers;
  c.num_kv_heads = heads;
  c.head_dim = head_dim;
  c.rope_style = rope;
  c.rope_theta = rope == RopeStyle::kNone ? 0.0f : 10000.0f;
  c.key_levels = levels;
  c.key_group_pairs = g;
  c.key_stages = r;
  c.value_stage_rows = rows;
  c.value_stages = stages;
  return c;
}

std::shared_ptr<CommVqCodebooks> RandomCodebooks(const CommVqConfig& c,
                                                 std::mt19937_64& rng) {
  auto cb = std::make_shared<CommVqCodebooks>();
  cb->config = c;
  std::normal_distribution<float> n(0.0f, 1.0f);
  cb->key.resize(c.key_floats());
  // Later stages smaller, as trained residual stages are.
  const uint64_t per_stage = uint64_t{c.pairs()} * c.key_levels * 2;
  for (uint64_t i = 0; i < cb->key.size(); ++i) {
    const uint64_t stage = (i / per_stage) % c.key_stages;
    cb->key[i] = n(rng) / float(1 + stage);
  }
  cb->value.resize(c.value_floats());
  for (float& v : cb->value) v = 0.5f * n(rng);
  return cb;
}

template <typename T>
std::vector<T> Download(const DeviceBuf& b, size_t n) {
  std::vector<T> v(n);
  b.Download(v.data(), n * sizeof(T));
  return v;
}

template <typename T>
bool SameFloats(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(a[i], b[i])) return false;
  }
  return true;
}

void RunCommVqCase(const CommVqConfig& c, uint64_t tokens,
                   std::mt19937_64& rng) {
  REQUIRE(c.Validate().ok());
  auto cb = RandomCodebooks(c, rng);
  auto enc_or = CommVqEncoder::Create(cb);
  REQUIRE(enc_or.ok());
  const CommVqEncoder& enc = **enc_or;
  const uint32_t L = c.num_layers, D = c.dim(), kc = c.key_codes();
  const uint64_t vb = CommVqValueBytes(c), lt = uint64_t{L} * tokens;
  INFO("layers " << L << " dim " << D << " levels " << c.key_levels << " g "
                 << c.key_group_pairs << " R " << c.key_stages << " rows "
                 << c.value_stage_rows << "x" << c.value_stages);

  // Inputs: Gaussian keys; values near sums of codebook rows plus noise.
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> row(0, c.value_stage_rows - 1);
  std::vector<float> keys(lt * D), values(lt * D);
  for (float& k : keys) k = 1.5f * n(rng);
  for (uint64_t t = 0; t < lt; ++t) {
    const uint32_t layer = t / tokens;
    for (uint32_t m = 0; m < c.value_stages; ++m) {
      if (row(rng) % 3 == 0) continue;
      const float* r = cb->value_at(layer, m * c.value_stage_rows + row(rng));
      for (uint32_t e = 0; e < D; ++e) values[t * D + e] += r[e];
    }
    for (uint32_t e = 0; e < D; ++e) values[t * D + e] += 0.1f * n(rng);
  }

  DeviceBuf dkcb(cb->key.size() * 4), dvcb(cb->value.size() * 4);
  dkcb.Upload(cb->key.data(), cb->key.size() * 4);
  dvcb.Upload(cb->value.data(), cb->value.size() * 4);

  // Tables.
  DeviceBuf dna(CommVqNaFloats(c) * 4), dm2(CommVqM2Floats(c) * 4),
      dnorm(CommVqValueNormFloats(c) * 4);
  CommVqTablesArgs ta;
  ta.config = c;
  ta.key_codebook = dkcb.as<float>();
  ta.value_codebook = dvcb.as<float>();
  ta.tables = {dna.as<float>(), dm2.as<float>(), dnorm.as<float>()};
  KVH_STATUS_REQUIRE(LaunchCommVqTables(ta, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  {
    const auto na = Download<float>(dna, CommVqNaFloats(c));
    const auto m2 = Download<float>(dm2, CommVqM2Floats(c));
    const uint32_t nl = c.key_levels;
    std::vector<float> wna(nl), wm2(uint64_t{nl} * nl);
    uint64_t bad = 0;
    for (uint32_t l = 0; l < L; ++l) {
      for (uint32_t s = 0; s < c.key_stages; ++s) {
        for (uint32_t q = 0; q < c.key_groups(); ++q) {
          CommVqKeyGroupTables(*cb, l, s, q, wna.data(), wm2.data());
          const uint64_t t =
              (uint64_t{l} * c.key_stages + s) * c.key_groups() + q;
          for (uint32_t i = 0; i < nl; ++i) {
            bad += !SameBits(na[t * nl + i], wna[i]);
          }
          for (uint64_t i = 0; i < wm2.size(); ++i) {
            bad += !SameBits(m2[t * wm2.size() + i], wm2[i]);
          }
        }
      }
    }
    REQUIRE(bad == 0);
  }

  // Encode on both.
  std::vector<uint16_t> want_codes(lt * kc);
  std::vector<uint8_t> want_bits(lt * vb);
  std::vector<float> scratch(enc.ScratchFloats());
  for (uint64_t t = 0; t < lt; ++t) {
    const uint32_t layer = t / tokens;
    enc.EncodeKey(layer, &keys[t * D], &want_codes[t * kc], scratch.data());
    enc.EncodeValue(layer, &values[t * D], &want_bits[t * vb], scratch.data());
  }
  DeviceBuf dkeys(lt * D * 4), dvalues(lt * D * 4), dcodes(lt * kc * 2),
      dbits(lt * vb);
  dkeys.Upload(keys.data(), keys.size() * 4);
  dvalues.Upload(values.data(), values.size() * 4);
  dbits.Fill(0xFF);
  CommVqEncodeArgs ea;
  ea.config = c;
  ea.tokens = tokens;
  ea.key_codebook = dkcb.as<float>();
  ea.value_codebook = dvcb.as<float>();
  ea.tables = ta.tables;
  ea.keys = dkeys.as<float>();
  ea.values = dvalues.as<float>();
  ea.key_codes = dcodes.as<uint16_t>();
  ea.value_bits = dbits.bytes();
  DeviceBuf ws(CommVqEncodeWorkspaceBytes(ea));
  KVH_STATUS_REQUIRE(LaunchCommVqEncode(ea, ws.bytes(), ws.size(), nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  const auto got_codes = Download<uint16_t>(dcodes, lt * kc);
  const auto got_bits = Download<uint8_t>(dbits, lt * vb);
  uint64_t code_mismatch = 0, bit_mismatch = 0, bits_set = 0;
  for (size_t i = 0; i < got_codes.size(); ++i) {
    code_mismatch += got_codes[i] != want_codes[i];
  }
  for (size_t i = 0; i < got_bits.size(); ++i) {
    bit_mismatch += got_bits[i] != want_bits[i];
    bits_set += __builtin_popcount(want_bits[i]);
  }
  CHECK(code_mismatch == 0);
  CHECK(bit_mismatch == 0);
  CHECK(bits_set > 0);  // the value encoder did pick rows

  // Decode random codes (high bits set too: the decoder masks them) and
  // random bit patterns, and the encoder's own output.
  std::uniform_int_distribution<uint32_t> u16(0, 65535), u8(0, 255);
  std::vector<uint16_t> rcodes(lt * kc);
  for (uint16_t& x : rcodes) x = static_cast<uint16_t>(u16(rng));
  std::vector<uint8_t> rbits(lt * vb);
  for (uint8_t& x : rbits) x = static_cast<uint8_t>(u8(rng));
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<uint16_t>& codes = pass == 0 ? rcodes : want_codes;
    const std::vector<uint8_t>& bits = pass == 0 ? rbits : want_bits;
    std::vector<float> wk(lt * D), wv(lt * D);
    for (uint64_t t = 0; t < lt; ++t) {
      DecodeCommVqKey(*cb, t / tokens, &codes[t * kc], &wk[t * D]);
      DecodeCommVqValue(*cb, t / tokens, &bits[t * vb], &wv[t * D]);
    }
    dcodes.Upload(codes.data(), codes.size() * 2);
    dbits.Upload(bits.data(), bits.size());
    DeviceBuf ok(lt * D * 4), ov(lt * D * 4);
    ok.Fill(0xA5);
    ov.Fill(0xA5);
    CommVqDecodeArgs da;
    da.config = c;
    da.tokens = tokens;
    da.key_codebook = dkcb.as<float>();
    da.value_codebook = dvcb.as<float>();
    da.key_codes = dcodes.as<uint16_t>();
    da.value_bits = dbits.bytes();
    da.keys = ok.as<float>();
    da.values = ov.as<float>();
    KVH_STATUS_REQUIRE(LaunchCommVqDecode(da, nullptr));
    KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
    INFO("decode pass " << pass);
    CHECK(SameFloats(Download<float>(ok, lt * D), wk));
    CHECK(SameFloats(Download<float>(ov, lt * D), wv));
  }
}

TEST_CASE("CommVQ GPU decode, tables and encode equal the CPU bit for bit",
          "[cuda][commvq]") {
  std::mt19937_64 rng(63);
  const CommVqConfig configs[] = {
      Config(2, 2, 8, RopeStyle::kInterleaved, 4, 2, 2, 16, 3),
      Config(1, 1, 64, RopeStyle::kHalfSplit, 256, 32, 1, 256, 2),
      Config(3, 4, 16, RopeStyle::kNone, 16, 1, 4, 7, 5),
      Config(2, 8, 32, RopeStyle::kInterleaved, 64, 8, 2, 1024, 1),
      Config(1, 2, 128, RopeStyle::kHalfSplit, 2, 128, 8, 300, 4),
  };
  const uint64_t tokens[] = {37, 5, 64, 9, 17};
  for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); ++i) {
    RunCommVqCase(configs[i], tokens[i], rng);
  }
  std::printf(
      "commvq gpu: 5 configs: tables, key codes, value bits and "
      "decoded K/V identical to the CPU\n");
}

TEST_CASE("CommVQ launchers refuse bad arguments", "[cuda][commvq]") {
  CommVqConfig c = Config(1, 1, 8, RopeStyle::kNone, 4, 2, 1, 4, 1);
  DeviceBuf buf(4096);
  CommVqDecodeArgs da;
  da.config = c;
  da.tokens = 1;
  da.key_codes = buf.as<uint16_t>();
  da.keys = buf.as<float>();
  absl::Status st = LaunchCommVqDecode(da, nullptr);  // no key codebook
  CHECK(st.message().find("key_codebook") != std::string::npos);
  da.key_codebook = buf.as<float>();
  da.tokens = 0;
  st = LaunchCommVqDecode(da, nullptr);
  CHECK(st.message().find("tokens") != std::string::npos);
  da.tokens = 1;
  da.config.key_levels = 3;
  st = LaunchCommVqDecode(da, nullptr);
  CHECK(st.message().find("key_levels") != std::string::npos);
  CommVqEncodeArgs ea;
  ea.config = c;
  ea.tokens = 4;
  st = LaunchCommVqEncode(ea, buf.bytes(), 8, nullptr);
  CHECK(st.message().find("workspace") != std::string::npos);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
