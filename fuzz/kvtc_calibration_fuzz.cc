// libFuzzer target: the KVTC calibration file loader (what
// tools/kvharbor_calibrate writes and `codec: kvtc` namespaces read) on
// arbitrary bytes, in memory (ParseKvtcCalibration) and through a file
// (ReadKvtcCalibrationFile, on a memfd so no disk is touched).
//
// Each input runs as it is and again with its trailing XXH3-64 recomputed,
// so that mutations also reach the checks behind the checksum. Whatever
// loads must keep the format's promises (trapped otherwise): both loaders
// agree, the calibration validates and fits its own geometry, the file is
// canonical (re-serializing gives the same bytes) and its checksum is the
// fingerprint, and (when small) a KVTC codec built from it encodes a page
// and decodes the result.
//
// KVTC_CALIBRATION_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (small
// calibration files of both row kinds, with and without RoPE, several range
// layouts) into DIR and exits; the seeds are checked in under
// fuzz/corpus/kvtc_calibration/.
#include <sys/mman.h>
#include <unistd.h>
#include <xxh3.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "fuzz/fuzz_util.h"

namespace kvharbor {
namespace {

// Features up to which a codec is built and run (keeps inputs fast).
constexpr uint64_t kMaxCodecFeatures = 512;

KvtcCalibration SeedCalibration(KvtcRowKind kind, uint32_t layers,
                                uint32_t heads, uint32_t head_dim,
                                uint32_t page_size, RopeStyle rope,
                                uint64_t seed) {
  KvtcCalibration cal;
  cal.row_kind = kind;
  cal.num_layers = layers;
  cal.num_kv_heads = heads;
  cal.head_dim = head_dim;
  cal.page_size = page_size;
  cal.sink_tokens = seed % 3;
  cal.rope_style = rope;
  cal.rope_theta = rope == RopeStyle::kNone ? 0.0f : 10000.0f;
  const uint64_t f = cal.ExpectedFeatures();
  const uint64_t c = f > 4 ? f - 2 : f;
  std::vector<KvtcRange> key_ranges = {{KvtcQuantType::kFp8, 0, 0, 1},
                                       {KvtcQuantType::kIntX, 4, 1, c}};
  if (seed % 2 == 1 && c > 3) {
    key_ranges = {{KvtcQuantType::kIntX, 8, 0, 1},
                  {KvtcQuantType::kIntX, 2, 1, 2},
                  {KvtcQuantType::kIntX, 1, 3, c}};  // component 2 dropped
  }
  cal.keys = RandomOrthonormalBasis(f, c, seed, key_ranges);
  cal.values = seed % 2 == 0
                   ? IdentityBasis(f, c, {{KvtcQuantType::kFp8, 0, 0, c}})
                   : RandomOrthonormalBasis(f, c, seed + 7,
                                            {{KvtcQuantType::kIntX, 4, 0, c}});
  for (size_t i = 0; i < cal.keys.mean.size(); ++i) {
    cal.keys.mean[i] = 0.01f * float(i % 5);
  }
  return cal;
}

void WriteCorpus(const std::string& dir) {
  const KvtcCalibration seeds[] = {
      SeedCalibration(KvtcRowKind::kPerToken, 1, 1, 4, 2, RopeStyle::kNone, 0),
      SeedCalibration(KvtcRowKind::kPerToken, 2, 1, 4, 2, RopeStyle::kHalfSplit,
                      1),
      SeedCalibration(KvtcRowKind::kPerToken, 1, 2, 2, 1,
                      RopeStyle::kInterleaved, 2),
      SeedCalibration(KvtcRowKind::kPerPage, 1, 1, 4, 2, RopeStyle::kNone, 3),
      SeedCalibration(KvtcRowKind::kPerPage, 2, 1, 2, 4, RopeStyle::kHalfSplit,
                      4),
  };
  int n = 0;
  for (const KvtcCalibration& cal : seeds) {
    auto bytes = SerializeKvtcCalibration(cal);
    if (!bytes.ok() || !ParseKvtcCalibration(
                            absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(bytes->data()),
                                bytes->size()))
                            .ok()) {
      std::fprintf(stderr, "seed %d is not valid: %s\n", n,
                   bytes.status().ToString().c_str());
      std::exit(1);
    }
    const std::string path = dir + "/calibration_" + std::to_string(n++);
    WriteSeedOrDie(path, bytes->data(), bytes->size());
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

// The input as a file: a memfd, read back through /proc/self/fd.
absl::StatusOr<KvtcCalibration> ReadThroughFile(const uint8_t* data,
                                                size_t size) {
  const int fd = memfd_create("kvtc_calibration_fuzz", 0);
  FUZZ_CHECK(fd >= 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t w = write(fd, data + done, size - done);
    FUZZ_CHECK(w > 0);
    done += static_cast<size_t>(w);
  }
  auto cal = ReadKvtcCalibrationFile("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  return cal;
}

void RunCodec(const KvtcCalibration& cal) {
  if (cal.keys.features > kMaxCodecFeatures ||
      cal.keys.components > kMaxCodecFeatures ||
      cal.values.components > kMaxCodecFeatures) {
    return;
  }
  CodecParams p;
  p.geometry.num_layers = cal.num_layers;
  p.geometry.num_kv_heads = cal.num_kv_heads;
  p.geometry.head_dim = cal.head_dim;
  p.geometry.page_size = cal.page_size;
  p.geometry.dtype = DType::kBF16;
  p.calibration = std::make_shared<KvtcCalibration>(cal);
  auto codec = CodecRegistry::Default().Create("kvtc", p);
  if (!codec.ok()) return;
  std::vector<uint8_t> page(p.geometry.PageBytes());
  for (size_t e = 0; e < page.size() / 2; ++e) {
    const uint16_t b = FloatToBf16(0.01f * float((e * 7) % 97) - 0.4f);
    page[2 * e] = static_cast<uint8_t>(b);
    page[2 * e + 1] = static_cast<uint8_t>(b >> 8);
  }
  const PageRef ref{page.data(), 0};
  auto buf = (*codec)->EncodeToString({ref}, nullptr);
  if (!buf.ok()) return;
  std::vector<uint8_t> out(page.size());
  const MutablePageRef out_ref{out.data(), 0};
  FUZZ_CHECK((*codec)
                 ->Decode(absl::MakeConstSpan(
                              reinterpret_cast<const uint8_t*>(buf->data()),
                              buf->size()),
                          {out_ref}, nullptr)
                 .ok());
}

void CheckOne(const uint8_t* data, size_t size) {
  auto cal = ParseKvtcCalibration(absl::MakeConstSpan(data, size));
  auto from_file = ReadThroughFile(data, size);
  FUZZ_CHECK(cal.ok() == from_file.ok());
  if (!cal.ok()) return;
  FUZZ_CHECK(from_file->Fingerprint() == cal->Fingerprint());
  FUZZ_CHECK(cal->Validate().ok());
  Geometry g;
  g.num_layers = cal->num_layers;
  g.num_kv_heads = cal->num_kv_heads;
  g.head_dim = cal->head_dim;
  g.page_size = cal->page_size;
  g.dtype = DType::kBF16;
  FUZZ_CHECK(cal->CheckGeometry(g).ok());
  auto again = SerializeKvtcCalibration(*cal);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->size() == size &&
             std::memcmp(again->data(), data, size) == 0);
  uint64_t stored;
  std::memcpy(&stored, data + size - 8, 8);
  FUZZ_CHECK(stored == cal->Fingerprint());
  RunCodec(*cal);
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("KVTC_CALIBRATION_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvharbor::CheckOne(data, size);
  if (size < 8) return 0;
  std::vector<uint8_t> resealed(data, data + size);
  const uint64_t h = XXH3_64bits(resealed.data(), size - 8);
  std::memcpy(resealed.data() + size - 8, &h, 8);
  kvharbor::CheckOne(resealed.data(), size);
  return 0;
}
