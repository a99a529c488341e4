#include "core/codec/kvtc/kvtc_calibration.h"

#include <xxh3.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

// Fortran LAPACK symbol exported by the linked OpenBLAS. The trailing
// lengths are gfortran's hidden CHARACTER-argument lengths.
extern "C" void dsyev_(const char* jobz, const char* uplo, const int* n,
                       double* a, const int* lda, double* w, double* work,
                       const int* lwork, int* info, size_t jobz_len,
                       size_t uplo_len);

namespace kvharbor {

// The file format and fingerprint are defined little-endian; floats and
// integers are copied with memcpy, which is only right on little-endian hosts.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "kvharbor's binary formats assume a little-endian host");

namespace {

constexpr uint32_t kMaxSinkTokens = 1u << 20;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckRanges(absl::string_view prefix,
                         const std::vector<KvtcRange>& ranges,
                         uint64_t components) {
  if (ranges.size() > kMaxCalibrationRanges) {
    return Invalid(absl::StrCat(prefix, ".ranges"),
                   absl::StrCat(ranges.size(), " ranges, over the limit of ",
                                kMaxCalibrationRanges));
  }
  uint64_t prev_end = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const KvtcRange& r = ranges[i];
    const std::string f = absl::StrCat(prefix, ".ranges[", i, "]");
    if (r.quant_type == KvtcQuantType::kFp8) {
      if (r.int_bits != 0) {
        return Invalid(f + ".int_bits",
                       absl::StrCat(r.int_bits, " must be 0 for fp8"));
      }
    } else if (r.quant_type == KvtcQuantType::kIntX) {
      if (r.int_bits != 1 && r.int_bits != 2 && r.int_bits != 4 &&
          r.int_bits != 8) {
        return Invalid(f + ".int_bits",
                       absl::StrCat(r.int_bits, " is not 1, 2, 4 or 8"));
      }
    } else {
      return Invalid(
          f + ".quant_type",
          absl::StrCat("unknown value ", static_cast<int32_t>(r.quant_type)));
    }
    if (r.start_idx >= r.end_idx) {
      return Invalid(f, absl::StrFormat("empty or reversed [%u, %u)",
                                        r.start_idx, r.end_idx));
    }
    if (r.end_idx > components) {
      return Invalid(f + ".end_idx", absl::StrFormat("%u exceeds components %u",
                                                     r.end_idx, components));
    }
    if (r.start_idx < prev_end) {
      return Invalid(f + ".start_idx",
                     absl::StrFormat("%u overlaps the previous range (ends at "
                                     "%u) or is out of order",
                                     r.start_idx, prev_end));
    }
    prev_end = r.end_idx;
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(absl::string_view field, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return Invalid(absl::StrCat(field, "[", i, "]"), "is not finite");
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t KvtcBasis::ProjectionElements() const {
  if (blocks.empty()) return features * components;
  uint64_t n = 0;
  for (const KvtcBlock& b : blocks) n += b.features * b.components;
  return n;
}

namespace {

absl::Status CheckBlocks(absl::string_view prefix, const KvtcBasis& b) {
  if (b.blocks.empty()) {
    if (b.features > kMaxCalibrationMatrixElements / b.components) {
      return Invalid(absl::StrCat(prefix, ".projection"),
                     absl::StrFormat("%u x %u is over the limit of %u elements",
                                     b.features, b.components,
                                     kMaxCalibrationMatrixElements));
    }
    return absl::OkStatus();
  }
  if (b.blocks.size() < 2 || b.blocks.size() > kMaxCalibrationBlocks) {
    return Invalid(absl::StrCat(prefix, ".blocks"),
                   absl::StrFormat("%u blocks; a block-diagonal basis has 2 "
                                   "to %u",
                                   b.blocks.size(), kMaxCalibrationBlocks));
  }
  uint64_t f = 0, c = 0, elements = 0;
  for (size_t i = 0; i < b.blocks.size(); ++i) {
    const KvtcBlock& k = b.blocks[i];
    if (k.features == 0 || k.components == 0 || k.components > k.features ||
        k.features > b.features || k.components > b.components) {
      return Invalid(absl::StrCat(prefix, ".blocks[", i, "]"),
                     absl::StrFormat("%u features x %u components; need 1 <= "
                                     "components <= features",
                                     k.features, k.components));
    }
    f += k.features;
    c += k.components;
    if (k.features > kMaxCalibrationMatrixElements / k.components ||
        (elements += k.features * k.components) >
            kMaxCalibrationMatrixElements) {
      return Invalid(absl::StrCat(prefix, ".projection"),
                     absl::StrFormat("over the limit of %u elements",
                                     kMaxCalibrationMatrixElements));
    }
  }
  if (f != b.features || c != b.components) {
    return Invalid(absl::StrCat(prefix, ".blocks"),
                   absl::StrFormat("blocks sum to %u features x %u "
                                   "components, the basis has %u x %u",
                                   f, c, b.features, b.components));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvtcBasis::Validate(absl::string_view prefix) const {
  if (features == 0) return Invalid(absl::StrCat(prefix, ".features"), "is 0");
  if (components == 0 || components > features) {
    return Invalid(absl::StrCat(prefix, ".components"),
                   absl::StrFormat("%u is out of range [1, features=%u]",
                                   components, features));
  }
  KVH_RETURN_IF_ERROR(CheckBlocks(prefix, *this));
  if (mean.size() != features) {
    return Invalid(absl::StrCat(prefix, ".mean"),
                   absl::StrFormat("has %u values, want features=%u",
                                   mean.size(), features));
  }
  if (projection.size() != ProjectionElements()) {
    return Invalid(absl::StrCat(prefix, ".projection"),
                   absl::StrFormat("has %u values, want %u", projection.size(),
                                   ProjectionElements()));
  }
  KVH_RETURN_IF_ERROR(CheckRanges(prefix, ranges, components));
  KVH_RETURN_IF_ERROR(CheckFinite(absl::StrCat(prefix, ".mean"), mean));
  return CheckFinite(absl::StrCat(prefix, ".projection"), projection);
}

std::vector<float> DenseProjection(const KvtcBasis& b) {
  if (b.blocks.empty()) return b.projection;
  std::vector<float> out(b.features * b.components, 0.0f);
  uint64_t f0 = 0, c0 = 0, at = 0;
  for (const KvtcBlock& k : b.blocks) {
    for (uint64_t i = 0; i < k.features; ++i) {
      for (uint64_t c = 0; c < k.components; ++c) {
        out[(f0 + i) * b.components + c0 + c] = b.projection[at++];
      }
    }
    f0 += k.features;
    c0 += k.components;
  }
  return out;
}

uint64_t KvtcCalibration::ExpectedFeatures() const {
  const uint64_t per_head = uint64_t{num_kv_heads} * head_dim;
  return row_kind == KvtcRowKind::kPerPage ? per_head * page_size
                                           : per_head * num_layers;
}

absl::Status KvtcCalibration::Validate() const {
  if (row_kind != KvtcRowKind::kPerToken && row_kind != KvtcRowKind::kPerPage) {
    return Invalid(
        "calibration.row_kind",
        absl::StrCat("unknown value ", static_cast<uint32_t>(row_kind)));
  }
  Geometry g;
  g.num_layers = num_layers;
  g.num_kv_heads = num_kv_heads;
  g.head_dim = head_dim;
  g.page_size = page_size;
  g.dtype = DType::kFP32;
  KVH_RETURN_IF_ERROR(g.Validate("calibration"));
  if (sink_tokens > kMaxSinkTokens) {
    return Invalid(
        "calibration.sink_tokens",
        absl::StrCat(sink_tokens, " is over the limit of ", kMaxSinkTokens));
  }
  if (rope_style != RopeStyle::kNone && rope_style != RopeStyle::kInterleaved &&
      rope_style != RopeStyle::kHalfSplit) {
    return Invalid(
        "calibration.rope_style",
        absl::StrCat("unknown value ", static_cast<uint32_t>(rope_style)));
  }
  if (!std::isfinite(rope_theta) || rope_theta < 0) {
    return Invalid("calibration.rope_theta",
                   absl::StrCat(rope_theta, " must be finite and >= 0"));
  }
  if (rope_style != RopeStyle::kNone) {
    if (!(rope_theta > 1.0f)) {
      return Invalid(
          "calibration.rope_theta",
          absl::StrCat(rope_theta, " must be > 1 when rope_style is ",
                       RopeStyleName(rope_style)));
    }
    if (head_dim % 2 != 0) {
      return Invalid("calibration.head_dim",
                     absl::StrCat(head_dim, " must be even for RoPE"));
    }
  }
  for (const auto& [field, v] :
       {std::pair<const char*, float>{"target_ratio", estimate.target_ratio},
        {"expected_ratio", estimate.expected_ratio},
        {"keys_rel_error", estimate.keys_rel_error},
        {"values_rel_error", estimate.values_rel_error}}) {
    if (!std::isfinite(v) || v < 0) {
      return Invalid(absl::StrCat("calibration.estimate.", field),
                     absl::StrCat(v, " must be finite and >= 0"));
    }
  }
  const uint64_t want = ExpectedFeatures();
  for (const auto& [name, basis] :
       {std::pair<const char*, const KvtcBasis*>{"calibration.keys", &keys},
        {"calibration.values", &values}}) {
    if (basis->features != want) {
      return Invalid(
          absl::StrCat(name, ".features"),
          absl::StrFormat("%u, but row kind %s with this geometry "
                          "needs %u",
                          basis->features, KvtcRowKindName(row_kind), want));
    }
    KVH_RETURN_IF_ERROR(basis->Validate(name));
  }
  return absl::OkStatus();
}

absl::Status KvtcCalibration::CheckGeometry(const Geometry& geometry) const {
  KVH_RETURN_IF_ERROR(geometry.Validate());
  for (auto [field, mine, theirs] :
       {std::tuple<const char*, uint32_t, uint32_t>{"num_layers", num_layers,
                                                    geometry.num_layers},
        {"num_kv_heads", num_kv_heads, geometry.num_kv_heads},
        {"head_dim", head_dim, geometry.head_dim},
        {"page_size", page_size, geometry.page_size}}) {
    if (mine != theirs) {
      return absl::InvalidArgumentError(
          absl::StrFormat("geometry.%s: %u does not match the calibration's %u",
                          field, theirs, mine));
    }
  }
  if (rope_style != RopeStyle::kNone && geometry.rope_theta != 0.0f &&
      geometry.rope_theta != rope_theta) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "geometry.rope_theta: %g does not match the calibration's %g",
        geometry.rope_theta, rope_theta));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ serialization
namespace {

// Writes the canonical bytes to any sink with Put(const void*, size_t).
template <typename Sink>
void WriteCanonical(const KvtcCalibration& cal, Sink& sink) {
  auto u32 = [&](uint32_t v) { sink.Put(&v, 4); };
  auto u64 = [&](uint64_t v) { sink.Put(&v, 8); };
  const bool v2 = !cal.keys.blocks.empty() || !cal.values.blocks.empty() ||
                  cal.estimate.known();
  sink.Put(kKvtcCalibrationMagic, 8);
  u32(v2 ? 2 : 1);
  u32(static_cast<uint32_t>(cal.row_kind));
  u32(cal.num_layers);
  u32(cal.num_kv_heads);
  u32(cal.head_dim);
  u32(cal.page_size);
  u32(cal.sink_tokens);
  u32(static_cast<uint32_t>(cal.rope_style));
  sink.Put(&cal.rope_theta, 4);
  u32(0);  // reserved
  if (v2) {
    for (float f :
         {cal.estimate.target_ratio, cal.estimate.expected_ratio,
          cal.estimate.keys_rel_error, cal.estimate.values_rel_error}) {
      sink.Put(&f, 4);
    }
  }
  for (const KvtcBasis* b : {&cal.keys, &cal.values}) {
    u64(b->features);
    u64(b->components);
    u32(static_cast<uint32_t>(b->ranges.size()));
    u32(static_cast<uint32_t>(b->blocks.size()));  // version 1: reserved 0
    for (const KvtcRange& r : b->ranges) {
      u32(static_cast<uint32_t>(r.quant_type));
      u32(static_cast<uint32_t>(r.int_bits));
      u64(r.start_idx);
      u64(r.end_idx);
    }
    for (const KvtcBlock& k : b->blocks) {
      u64(k.features);
      u64(k.components);
    }
    sink.Put(b->mean.data(), b->mean.size() * 4);
    sink.Put(b->projection.data(), b->projection.size() * 4);
  }
}

struct StringSink {
  std::string* out;
  void Put(const void* p, size_t n) {
    out->append(static_cast<const char*>(p), n);
  }
};

struct HashSink {
  XXH3_state_t* state;
  void Put(const void* p, size_t n) { XXH3_64bits_update(state, p, n); }
};

struct CountSink {
  uint64_t n = 0;
  void Put(const void*, size_t len) { n += len; }
};

// Bounds-checked little-endian reader over the file bytes.
class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> b) : b_(b) {}
  absl::Status Read(void* dst, uint64_t n, absl::string_view field) {
    if (n > b_.size() - pos_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "calibration file: truncated reading %s (%u bytes at offset %u, "
          "file body is %u bytes)",
          field, n, pos_, b_.size()));
    }
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status ReadFloats(std::vector<float>* v, uint64_t count,
                          absl::string_view field) {
    if (count > (b_.size() - pos_) / 4) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "calibration file: %s needs %u floats but only %u bytes remain",
          field, count, b_.size() - pos_));
    }
    v->resize(count);
    return Read(v->data(), count * 4, field);
  }
  uint64_t remaining() const { return b_.size() - pos_; }

 private:
  absl::Span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

absl::Status ReadBasis(Reader& r, uint32_t version, absl::string_view name,
                       KvtcBasis* b) {
  const std::string p = absl::StrCat("calibration.", name);
  uint32_t num_ranges = 0, num_blocks = 0;
  KVH_RETURN_IF_ERROR(r.Read(&b->features, 8, p + ".features"));
  KVH_RETURN_IF_ERROR(r.Read(&b->components, 8, p + ".components"));
  KVH_RETURN_IF_ERROR(r.Read(&num_ranges, 4, p + ".num_ranges"));
  KVH_RETURN_IF_ERROR(r.Read(&num_blocks, 4, p + ".num_blocks"));
  if (version == 1 && num_blocks != 0) {
    return Invalid(p + ".reserved", "must be 0");
  }
  if (num_ranges > kMaxCalibrationRanges) {
    return Invalid(p + ".num_ranges",
                   absl::StrCat(num_ranges, " is over the limit of ",
                                kMaxCalibrationRanges));
  }
  if (num_blocks == 1 || num_blocks > kMaxCalibrationBlocks) {
    return Invalid(p + ".num_blocks",
                   absl::StrFormat("%u; a block-diagonal basis has 2 to %u "
                                   "blocks (0: dense)",
                                   num_blocks, kMaxCalibrationBlocks));
  }
  if (b->features == 0 || b->components == 0 || b->components > b->features ||
      (num_blocks == 0 &&
       b->features > kMaxCalibrationMatrixElements / b->components)) {
    return Invalid(p, absl::StrFormat("features %u x components %u is not a "
                                      "valid projection shape",
                                      b->features, b->components));
  }
  b->ranges.resize(num_ranges);
  for (uint32_t i = 0; i < num_ranges; ++i) {
    KvtcRange& range = b->ranges[i];
    const std::string f = absl::StrCat(p, ".ranges[", i, "]");
    KVH_RETURN_IF_ERROR(r.Read(&range.quant_type, 4, f));
    KVH_RETURN_IF_ERROR(r.Read(&range.int_bits, 4, f));
    KVH_RETURN_IF_ERROR(r.Read(&range.start_idx, 8, f));
    KVH_RETURN_IF_ERROR(r.Read(&range.end_idx, 8, f));
  }
  b->blocks.resize(num_blocks);
  for (uint32_t i = 0; i < num_blocks; ++i) {
    const std::string f = absl::StrCat(p, ".blocks[", i, "]");
    KVH_RETURN_IF_ERROR(r.Read(&b->blocks[i].features, 8, f));
    KVH_RETURN_IF_ERROR(r.Read(&b->blocks[i].components, 8, f));
  }
  // Bounds every size before the projection is allocated.
  KVH_RETURN_IF_ERROR(CheckBlocks(p, *b));
  KVH_RETURN_IF_ERROR(r.ReadFloats(&b->mean, b->features, p + ".mean"));
  return r.ReadFloats(&b->projection, b->ProjectionElements(),
                      p + ".projection");
}

}  // namespace

uint64_t KvtcCalibration::Fingerprint() const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  HashSink sink{state};
  WriteCanonical(*this, sink);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

absl::StatusOr<std::string> SerializeKvtcCalibration(
    const KvtcCalibration& cal) {
  KVH_RETURN_IF_ERROR(cal.Validate());
  CountSink counter;
  WriteCanonical(cal, counter);
  std::string out;
  out.reserve(counter.n + 8);
  StringSink sink{&out};
  WriteCanonical(cal, sink);
  const uint64_t checksum = XXH3_64bits(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&checksum), 8);
  return out;
}

absl::StatusOr<KvtcCalibration> ParseKvtcCalibration(
    absl::Span<const uint8_t> bytes) {
  if (bytes.size() < 8 + 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "calibration file: %u bytes is too short", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kKvtcCalibrationMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        "calibration file: bad magic (not a KVTC calibration file)");
  }
  const absl::Span<const uint8_t> body = bytes.subspan(0, bytes.size() - 8);
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body.size(), 8);
  Reader r(body.subspan(8));
  KvtcCalibration cal;
  uint32_t version = 0, row_kind = 0, rope_style = 0, reserved = 0;
  KVH_RETURN_IF_ERROR(r.Read(&version, 4, "version"));
  if (version != 1 && version != 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration file: version %u is not supported (this "
                        "build reads versions 1 to %u)",
                        version, kKvtcCalibrationVersion));
  }
  const uint64_t computed = XXH3_64bits(body.data(), body.size());
  if (computed != stored) {
    return absl::DataLossError(absl::StrFormat(
        "calibration file: checksum mismatch (stored %016x, computed %016x)",
        stored, computed));
  }
  KVH_RETURN_IF_ERROR(r.Read(&row_kind, 4, "row_kind"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.num_layers, 4, "num_layers"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.num_kv_heads, 4, "num_kv_heads"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.head_dim, 4, "head_dim"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.page_size, 4, "page_size"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.sink_tokens, 4, "sink_tokens"));
  KVH_RETURN_IF_ERROR(r.Read(&rope_style, 4, "rope_style"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.rope_theta, 4, "rope_theta"));
  KVH_RETURN_IF_ERROR(r.Read(&reserved, 4, "reserved"));
  if (reserved != 0) return Invalid("calibration.reserved", "must be 0");
  cal.row_kind = static_cast<KvtcRowKind>(row_kind);
  cal.rope_style = static_cast<RopeStyle>(rope_style);
  if (version == 2) {
    KvtcCalibrationEstimate& e = cal.estimate;
    for (float* f : {&e.target_ratio, &e.expected_ratio, &e.keys_rel_error,
                     &e.values_rel_error}) {
      KVH_RETURN_IF_ERROR(r.Read(f, 4, "estimate"));
    }
  }
  KVH_RETURN_IF_ERROR(ReadBasis(r, version, "keys", &cal.keys));
  KVH_RETURN_IF_ERROR(ReadBasis(r, version, "values", &cal.values));
  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "calibration file: %u unexpected bytes after the values basis",
        r.remaining()));
  }
  KVH_RETURN_IF_ERROR(cal.Validate());
  return cal;
}

absl::Status WriteKvtcCalibrationFile(const KvtcCalibration& cal,
                                      const std::string& path) {
  return WriteSerialized(path, SerializeKvtcCalibration(cal));
}

absl::StatusOr<KvtcCalibration> ReadKvtcCalibrationFile(
    const std::string& path) {
  // No size limit of its own: Parse checks every count against the bytes.
  return ParseWholeFile(path, std::numeric_limits<uint64_t>::max(),
                        ParseKvtcCalibration);
}

// ------------------------------------------------------------------ builders
KvtcBasis IdentityBasis(uint64_t features, uint64_t components,
                        std::vector<KvtcRange> ranges) {
  KvtcBasis b;
  b.features = features;
  b.components = components;
  b.mean.assign(features, 0.0f);
  b.projection.assign(features * components, 0.0f);
  for (uint64_t i = 0; i < std::min(features, components); ++i) {
    b.projection[i * components + i] = 1.0f;
  }
  b.ranges = std::move(ranges);
  return b;
}

namespace {

uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Gaussian(uint64_t& s) {
  const double u1 =
      (static_cast<double>(SplitMix64(s) >> 11) + 0.5) / 9007199254740992.0;
  const double u2 =
      static_cast<double>(SplitMix64(s) >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

KvtcBasis RandomOrthonormalBasis(uint64_t features, uint64_t components,
                                 uint64_t seed, std::vector<KvtcRange> ranges) {
  std::vector<std::vector<double>> cols(components,
                                        std::vector<double>(features));
  uint64_t s = seed;
  for (uint64_t c = 0; c < components; ++c) {
    std::vector<double>& v = cols[c];
    for (double& x : v) x = Gaussian(s);
    // Modified Gram-Schmidt, twice, for orthogonality to double precision.
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t p = 0; p < c; ++p) {
        double dot = 0;
        for (uint64_t i = 0; i < features; ++i) dot += v[i] * cols[p][i];
        for (uint64_t i = 0; i < features; ++i) v[i] -= dot * cols[p][i];
      }
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    norm = std::sqrt(norm);
    for (double& x : v) x /= norm;
  }
  KvtcBasis b;
  b.features = features;
  b.components = components;
  b.mean.assign(features, 0.0f);
  b.projection.resize(features * components);
  for (uint64_t i = 0; i < features; ++i) {
    for (uint64_t c = 0; c < components; ++c) {
      b.projection[i * components + c] = static_cast<float>(cols[c][i]);
    }
  }
  b.ranges = std::move(ranges);
  return b;
}

absl::StatusOr<KvtcBasis> PcaBasis(absl::Span<const float> samples,
                                   uint64_t rows, uint64_t features,
                                   uint64_t components,
                                   std::vector<KvtcRange> ranges) {
  if (rows < 2 || features == 0 || features > 8192 || components == 0 ||
      components > features || samples.size() != rows * features) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PcaBasis: need rows >= 2, 1 <= components <= features <= 8192 and "
        "rows * features samples (rows=%u features=%u components=%u "
        "samples=%u)",
        rows, features, components, samples.size()));
  }
  std::vector<double> mean(features, 0.0);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t f = 0; f < features; ++f)
      mean[f] += samples[r * features + f];
  }
  for (double& m : mean) m /= static_cast<double>(rows);
  std::vector<double> cov(features * features, 0.0);
  std::vector<double> centered(features);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t f = 0; f < features; ++f) {
      centered[f] = samples[r * features + f] - mean[f];
    }
    for (uint64_t i = 0; i < features; ++i) {
      const double ci = centered[i];
      double* row = &cov[i * features];
      for (uint64_t j = i; j < features; ++j) row[j] += ci * centered[j];
    }
  }
  // Row-major upper triangle == column-major lower triangle.
  const int n = static_cast<int>(features);
  std::vector<double> w(features);
  int lwork = -1, info = 0;
  double work_size = 0;
  dsyev_("V", "L", &n, cov.data(), &n, w.data(), &work_size, &lwork, &info, 1,
         1);
  lwork = std::max(1, static_cast<int>(work_size));
  std::vector<double> work(lwork);
  dsyev_("V", "L", &n, cov.data(), &n, w.data(), work.data(), &lwork, &info, 1,
         1);
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("PcaBasis: dsyev failed, info=", info));
  }
  KvtcBasis b;
  b.features = features;
  b.components = components;
  b.mean.resize(features);
  for (uint64_t f = 0; f < features; ++f)
    b.mean[f] = static_cast<float>(mean[f]);
  b.projection.resize(features * components);
  for (uint64_t c = 0; c < components; ++c) {
    // Eigenvalues ascend: component c is eigenvector n-1-c (column-major).
    const double* v = &cov[(features - 1 - c) * features];
    // Fix the sign so the result does not depend on LAPACK internals.
    uint64_t arg = 0;
    for (uint64_t i = 1; i < features; ++i) {
      if (std::fabs(v[i]) > std::fabs(v[arg])) arg = i;
    }
    const double sign = v[arg] < 0 ? -1.0 : 1.0;
    for (uint64_t i = 0; i < features; ++i) {
      b.projection[i * components + c] = static_cast<float>(sign * v[i]);
    }
  }
  b.ranges = std::move(ranges);
  return b;
}

}  // namespace kvharbor
