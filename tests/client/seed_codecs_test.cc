// The int8_c8 and commvq codecs end to end through the SDK against an
// in-process daemon: namespaces created from an msmodelslim export and a
// CommVQ codebook file, GetCalibration, pages moved to the cold tiers and
// fetched COMPRESSED, decoded by the SDK exactly as the daemon decodes them
// and as the core codec reconstructs them.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/base/byte_io.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "core/codec/codec.h"
#include "core/codec/commvq/commvq_codec.h"
#include "core/codec/commvq/commvq_format.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/commvq/commvq_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using client::FetchFormat;
using client::FetchSource;
using client::Tier;
using testing::Connect;
using testing::StartTestDaemon;
using testing::TokenRange;

// fp32, 2 layers, 2 heads, head_dim 8 (testing::SmallCommVqConfig), 4 tokens
// a page: 1 KiB pages.
constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kHeads * kHeadDim * 4;

Geometry Geo() {
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kHeadDim;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  return g;
}

using testing::FloatPages;
using testing::TempDir;

C8Scales Scales(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.01f, 0.03f);
  std::uniform_int_distribution<int> offset(-3, 3);
  C8Scales s;
  s.num_layers = kLayers;
  s.kv_channels = kHeads * kHeadDim;
  const size_t n = size_t{kLayers} * s.kv_channels;
  for (auto* v : {&s.k_scale, &s.v_scale}) {
    for (size_t i = 0; i < n; ++i) v->push_back(scale(rng));
  }
  for (auto* v : {&s.k_offset, &s.v_offset}) {
    for (size_t i = 0; i < n; ++i) v->push_back(offset(rng));
  }
  return s;
}

// The core codec's reconstruction of page `i` of `all` (first position
// i * kPageSize, as inserted from token 0).
std::vector<uint8_t> Reconstruct(const Codec& codec,
                                 const std::vector<uint8_t>& all, size_t i) {
  const PageRef in{all.data() + i * kPageBytes, i * kPageSize};
  CodecWorkspace ws;
  auto buf = codec.EncodeToString(absl::MakeConstSpan(&in, 1), &ws);
  REQUIRE(buf.ok());
  std::vector<uint8_t> out(kPageBytes);
  const MutablePageRef o{out.data(), in.first_position};
  REQUIRE(codec.Decode(AsBytes(*buf), absl::MakeConstSpan(&o, 1), &ws).ok());
  return out;
}

// Creates namespace `ns` with `codec` from `calibration_path`, checks
// GetCalibration, moves 4 pages through host_compressed and disk and checks
// that COMPRESSED fetches decoded by the SDK equal RAW fetches decoded by
// the daemon and the reference codec's reconstruction. Returns the decoded
// pages of the last tier.
std::vector<std::vector<uint8_t>> RoundTrip(Client& c, const std::string& ns,
                                            const std::string& codec,
                                            const std::string& calibration_path,
                                            const std::string& disk_dir,
                                            const Codec& reference,
                                            const std::vector<uint8_t>& data) {
  client::NamespaceSpec spec =
      testing::MakeSpec(ns, kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, 8 * kPageBytes);
  spec.codec = codec;
  spec.calibration_path = calibration_path;
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = disk_dir;
  auto made = c.CreateNamespace(spec);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  CHECK(made->info.spec.codec == codec);
  CHECK(made->info.spec.calibration_fingerprint ==
        reference.calibration_fingerprint());
  auto cal = c.GetCalibration(ns);
  REQUIRE(cal.ok());
  CHECK(cal->codec == codec);
  CHECK(cal->fingerprint == reference.calibration_fingerprint());
  CHECK_FALSE(cal->bytes.empty());

  const auto tokens = TokenRange(4 * kPageSize, 0);
  REQUIRE(c.Insert(ns, tokens, data, kPageBytes).ok());
  std::vector<std::vector<uint8_t>> decoded_last;
  for (Tier tier : {Tier::kRaw, Tier::kHostCompressed, Tier::kDisk}) {
    INFO(ns << " " << client::TierName(tier));
    if (tier != Tier::kRaw) REQUIRE(c.Demote(ns, tier).ok());
    auto lease = c.Match(ns, tokens, /*lock=*/true);
    REQUIRE(lease.ok());
    REQUIRE(lease->pages.size() == 4);
    for (Tier t : lease->page_tiers) CHECK(t == tier);
    const FetchSource src = FetchSource::FromLease(lease->id);
    auto comp = c.FetchCompressed(ns, src);
    REQUIRE(comp.ok());
    auto decoded = c.Fetch(ns, src, FetchFormat::kCompressed);
    INFO(decoded.status().ToString());
    REQUIRE(decoded.ok());
    auto raw = c.Fetch(ns, src, FetchFormat::kRaw);
    REQUIRE(raw.ok());
    for (size_t i = 0; i < 4; ++i) {
      const client::CompressedPage& p = (*comp)[i];
      CHECK(p.codec == codec);
      CHECK(p.calibration_fingerprint == reference.calibration_fingerprint());
      CHECK(p.tier == tier);
      CHECK(p.buffer.size() < kPageBytes);
      const std::vector<uint8_t> want = Reconstruct(reference, data, i);
      CHECK((*decoded)[i] == want);
      CHECK((*raw)[i] ==
            (tier == Tier::kRaw
                 ? std::vector<uint8_t>(data.begin() + i * kPageBytes,
                                        data.begin() + (i + 1) * kPageBytes)
                 : want));
    }
    decoded_last = *std::move(decoded);
    REQUIRE(c.Release(lease->id).ok());
  }
  return decoded_last;
}

TEST_CASE("SDK seed codecs: int8_c8 pages decode client-side within scale/2",
          "[client][tiers]") {
  TempDir dir;
  const C8Scales scales = Scales(11);
  auto files =
      BuildMsModelSlimC8Files(scales, C8NameStyle::kSeparateKv, StDType::kF32);
  REQUIRE(files.ok());
  const std::string export_dir = dir.path + "/export";
  REQUIRE(std::system(("mkdir -p '" + export_dir + "'").c_str()) == 0);
  REQUIRE(WriteMsModelSlimC8Files(export_dir, *files).ok());
  CodecParams params;
  params.geometry = Geo();
  auto reference =
      Int8C8Codec::Create(params, std::make_shared<const C8Scales>(scales));
  REQUIRE(reference.ok());

  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  const auto data = FloatPages(4, kPageBytes, 5);
  // One calibration load for the namespace, however many fetches.
  const auto decoded = RoundTrip(*c, "c8", "int8_c8", export_dir,
                                 dir.path + "/disk", **reference, data);
  CHECK(c->calibrations_loaded() == 1);
  const uint32_t channels = scales.kv_channels;
  for (size_t i = 0; i < 4; ++i) {
    for (size_t k = 0; k < kPageBytes / 4; ++k) {
      // [kv][layer][token][head][dim]
      const uint32_t ch = k % channels;
      const uint32_t layer = (k / (channels * kPageSize)) % kLayers;
      const int kv = static_cast<int>(k / (channels * kPageSize * kLayers));
      float x, y;
      std::memcpy(&x, &data[i * kPageBytes + k * 4], 4);
      std::memcpy(&y, &decoded[i][k * 4], 4);
      REQUIRE(std::fabs(x - y) <= scales.scale(kv, layer)[ch] * 0.5001f);
    }
  }

  // A wrong export is INVALID_ARGUMENT naming the field.
  client::NamespaceSpec bad =
      testing::MakeSpec("bad", kLayers, kHeads, kHeadDim * 2, kPageSize,
                        client::DType::kFP32, 8 * kPageBytes);
  bad.codec = "int8_c8";
  bad.calibration_path = export_dir;
  auto refused = c->CreateNamespace(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("spec.calibration_path") !=
        absl::string_view::npos);
}

TEST_CASE("SDK seed codecs: commvq pages decode client-side as the codec does",
          "[client][tiers]") {
  TempDir dir;
  const CommVqCodebooks cb =
      testing::RandomCodebooks(testing::SmallCommVqConfig(), 12, 0.3f);
  const std::string path = dir.path + "/codebooks.bin";
  REQUIRE(WriteCommVqCodebooksFile(cb, path).ok());
  CodecParams params;
  params.geometry = Geo();
  auto reference =
      CommVqCodec::Create(params, std::make_shared<const CommVqCodebooks>(cb));
  REQUIRE(reference.ok());

  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  const auto data = FloatPages(4, kPageBytes, 6);
  RoundTrip(*c, "vq", "commvq", path, dir.path + "/disk", **reference, data);
  CHECK(c->calibrations_loaded() == 1);

  // The calibration the daemon serves creates an equal namespace inline.
  auto cal = c->GetCalibration("vq");
  REQUIRE(cal.ok());
  auto file = ReadWholeFile(path, 1 << 20);
  REQUIRE(file.ok());
  CHECK(cal->bytes == *file);
  client::NamespaceSpec copy =
      testing::MakeSpec("vq2", kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, 8 * kPageBytes);
  copy.codec = "commvq";
  copy.calibration = cal->bytes;
  auto made = c->CreateNamespace(copy);
  REQUIRE(made.ok());
  CHECK(made->info.spec.calibration_fingerprint == cb.Fingerprint());

  // A damaged codebook file is INVALID_ARGUMENT naming the field.
  std::string damaged = *file;
  damaged[70] ^= 4;
  REQUIRE(WriteWholeFile(dir.path + "/damaged.bin", damaged).ok());
  client::NamespaceSpec bad = copy;
  bad.name = "bad";
  bad.calibration.clear();
  bad.calibration_path = dir.path + "/damaged.bin";
  auto refused = c->CreateNamespace(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("spec.calibration_path") !=
        absl::string_view::npos);
}

}  // namespace
}  // namespace kvharbor
