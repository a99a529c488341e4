#include "core/codec/commvq/commvq_format.h"

#include <xxh3.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace {

constexpr char kWhat[] = "commvq codebook file";

// Header field offsets (docs/commvq_format.md).
enum Off : size_t {
  kOffMagic = 0,
  kOffVersion = 8,
  kOffHeaderBytes = 12,
  kOffLayers = 16,
  kOffKvHeads = 20,
  kOffHeadDim = 24,
  kOffRopeStyle = 28,
  kOffRopeTheta = 32,
  kOffKeyLevels = 36,
  kOffKeyGroupPairs = 40,
  kOffKeyStages = 44,
  kOffValueStageRows = 48,
  kOffValueStages = 52,
  kOffReserved = 56,  // 8 zero bytes
};

template <typename T>
T Get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kWhat, ": ", field, ": ", what));
}

// Size of the file for a valid config: header + floats + checksum.
uint64_t FileBytes(const CommVqConfig& c) {
  return kCommVqFileHeaderBytes + 4 * (c.key_floats() + c.value_floats()) +
         kCommVqFileChecksumBytes;
}

absl::Status CheckFinite(const std::vector<float>& v, const char* name) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return Bad(absl::StrCat(name, "[", i, "]"), "is not finite");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CommVqFileHeader(const CommVqConfig& c) {
  ByteWriter w;
  w.PutBytes(kCommVqFileMagic, 8);
  w.Put<uint32_t>(kCommVqFileVersion);
  w.Put<uint32_t>(kCommVqFileHeaderBytes);
  w.Put<uint32_t>(c.num_layers);
  w.Put<uint32_t>(c.num_kv_heads);
  w.Put<uint32_t>(c.head_dim);
  w.Put<uint32_t>(static_cast<uint32_t>(c.rope_style));
  w.Put<float>(c.rope_theta);
  w.Put<uint32_t>(c.key_levels);
  w.Put<uint32_t>(c.key_group_pairs);
  w.Put<uint32_t>(c.key_stages);
  w.Put<uint32_t>(c.value_stage_rows);
  w.Put<uint32_t>(c.value_stages);
  w.Put<uint64_t>(0);
  return w.Release();
}

uint64_t CommVqCodebooks::Fingerprint() const {
  const std::string header = CommVqFileHeader(config);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header.data(), header.size());
  XXH3_64bits_update(st, key.data(), key.size() * sizeof(float));
  XXH3_64bits_update(st, value.data(), value.size() * sizeof(float));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

absl::StatusOr<std::string> SerializeCommVqCodebooks(
    const CommVqCodebooks& cb) {
  KVH_RETURN_IF_ERROR(cb.Validate());
  ByteWriter w;
  w.bytes().reserve(FileBytes(cb.config));
  const std::string header = CommVqFileHeader(cb.config);
  w.PutBytes(header.data(), header.size());
  w.PutFloats(cb.key);
  w.PutFloats(cb.value);
  w.Put<uint64_t>(XXH3_64bits(w.bytes().data(), w.size()));
  return w.Release();
}

absl::StatusOr<CommVqCodebooks> ParseCommVqCodebooks(
    absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kCommVqFileHeaderBytes + kCommVqFileChecksumBytes) {
    return Bad(
        "length",
        absl::StrFormat("%u bytes is shorter than the %u-byte header "
                        "and checksum",
                        bytes.size(),
                        kCommVqFileHeaderBytes + kCommVqFileChecksumBytes));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p + kOffMagic, kCommVqFileMagic, 8) != 0) {
    return Bad("header.magic", "not a CommVQ codebook file (want KVHCMVQ1)");
  }
  KVH_RETURN_IF_ERROR(CheckFormatVersion(kWhat, "header.format_version",
                                         Get<uint32_t>(p, kOffVersion),
                                         kCommVqFileVersion));
  KVH_RETURN_IF_ERROR(CheckFixedField(kWhat, "header.header_bytes",
                                      Get<uint32_t>(p, kOffHeaderBytes),
                                      kCommVqFileHeaderBytes));
  CommVqCodebooks cb;
  CommVqConfig& c = cb.config;
  c.num_layers = Get<uint32_t>(p, kOffLayers);
  c.num_kv_heads = Get<uint32_t>(p, kOffKvHeads);
  c.head_dim = Get<uint32_t>(p, kOffHeadDim);
  c.rope_style = static_cast<RopeStyle>(Get<uint32_t>(p, kOffRopeStyle));
  c.rope_theta = Get<float>(p, kOffRopeTheta);
  c.key_levels = Get<uint32_t>(p, kOffKeyLevels);
  c.key_group_pairs = Get<uint32_t>(p, kOffKeyGroupPairs);
  c.key_stages = Get<uint32_t>(p, kOffKeyStages);
  c.value_stage_rows = Get<uint32_t>(p, kOffValueStageRows);
  c.value_stages = Get<uint32_t>(p, kOffValueStages);
  if (Get<uint64_t>(p, kOffReserved) != 0) {
    return Bad("header.reserved", "must be 0");
  }
  const absl::Status config_ok = c.Validate();
  if (!config_ok.ok()) {
    // "commvq.<field>: ..." -> "commvq codebook file: header.<field>: ..."
    absl::string_view m = config_ok.message();
    m.remove_prefix(std::min<size_t>(m.size(), 7));
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": header.", m));
  }
  // Validate() bounds both float counts by 2^31, so this cannot overflow.
  const uint64_t want = FileBytes(c);
  if (bytes.size() != want) {
    return Bad(
        "length",
        absl::StrFormat("%u bytes, but the header describes %u (%u key "
                        "and %u value floats)",
                        bytes.size(), want, c.key_floats(), c.value_floats()));
  }
  const uint64_t body = want - kCommVqFileChecksumBytes;
  const uint64_t stored = Get<uint64_t>(p, body);
  const uint64_t computed = XXH3_64bits(p, body);
  if (stored != computed) {
    return absl::DataLossError(
        absl::StrFormat("%s: checksum mismatch (stored %016x, computed %016x)",
                        kWhat, stored, computed));
  }
  ByteReader r(bytes.subspan(kCommVqFileHeaderBytes), kWhat);
  KVH_RETURN_IF_ERROR(r.ReadFloats(c.key_floats(), &cb.key, "key_codebooks"));
  KVH_RETURN_IF_ERROR(
      r.ReadFloats(c.value_floats(), &cb.value, "value_codebooks"));
  KVH_RETURN_IF_ERROR(CheckFinite(cb.key, "key_codebooks"));
  KVH_RETURN_IF_ERROR(CheckFinite(cb.value, "value_codebooks"));
  return cb;
}

absl::Status WriteCommVqCodebooksFile(const CommVqCodebooks& cb,
                                      const std::string& path) {
  return WriteSerialized(path, SerializeCommVqCodebooks(cb));
}

absl::StatusOr<CommVqCodebooks> ReadCommVqCodebooksFile(
    const std::string& path) {
  constexpr uint64_t kMaxFileBytes = 2 * 4 * kCommVqMaxArrayElements +
                                     kCommVqFileHeaderBytes +
                                     kCommVqFileChecksumBytes;
  return ParseWholeFile(path, kMaxFileBytes, ParseCommVqCodebooks);
}

}  // namespace kvharbor
