#include "core/transform/kvcm_format.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/float_formats.h"
#include "core/base/status_macros.h"
#include "types/enum_names.h"

namespace kvharbor {
namespace {

constexpr char kWhat[] = "kvcm file";

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kWhat, ": ", field, ": ", what));
}

absl::Status OutOfRange(absl::string_view field, uint64_t v, uint64_t lo,
                        uint64_t hi) {
  return Bad(field, absl::StrFormat("%u is out of range [%u, %u]", v, lo, hi));
}

std::string BlockName(uint32_t layer, uint32_t block) {
  return absl::StrFormat("layer %u %s[slot %u]", layer,
                         KvcmPrefixName(static_cast<KvcmPrefix>(block / 3)),
                         kKvcmSlots[block % 3]);
}

void ConvertIn(KvcmDType dtype, const uint8_t* src, size_t n, float* dst) {
  switch (dtype) {
    case KvcmDType::kFP32:
      std::memcpy(dst, src, n * 4);
      return;
    case KvcmDType::kFP16:
    case KvcmDType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        dst[i] = dtype == KvcmDType::kFP16 ? Fp16ToFloat(v) : Bf16ToFloat(v);
      }
      return;
  }
}

void ConvertOut(KvcmDType dtype, const std::vector<float>& v, ByteWriter* w) {
  for (float x : v) {
    switch (dtype) {
      case KvcmDType::kFP32:
        w->Put<float>(x);
        break;
      case KvcmDType::kFP16:
        w->Put<uint16_t>(FloatToFp16(x));
        break;
      case KvcmDType::kBF16:
        w->Put<uint16_t>(FloatToBf16(x));
        break;
    }
  }
}

absl::Status CheckHeader(const KvcmHeader& h) {
  if (KvcmDTypeSize(h.dtype) == 0) {
    return Bad("header.dtype_code",
               absl::StrCat(static_cast<uint32_t>(h.dtype),
                            " is not 0 (fp16), 1 (bf16) or 2 (fp32)"));
  }
  if (h.num_layers == 0 || h.num_layers > 1024) {
    return OutOfRange("header.num_layers", h.num_layers, 1, 1024);
  }
  if (h.num_heads > kKvcmMaxHeads) {
    return OutOfRange("header.num_heads", h.num_heads, 0, kKvcmMaxHeads);
  }
  if (h.head_dim > 4096)
    return OutOfRange("header.head_dim", h.head_dim, 0, 4096);
  if (h.hidden_size > kKvcmMaxHiddenSize) {
    return OutOfRange("header.hidden_size", h.hidden_size, 0,
                      kKvcmMaxHiddenSize);
  }
  if (h.compression_factor < 2 || h.compression_factor > kKvcmMaxFactor) {
    return OutOfRange("header.compression_factor", h.compression_factor, 2,
                      kKvcmMaxFactor);
  }
  if (h.weight_count_per_layer != kKvcmTextOnlyBlocks &&
      h.weight_count_per_layer != kKvcmFullBlocks) {
    return Bad("header.weight_count_per_layer",
               absl::StrCat(h.weight_count_per_layer,
                            " is not 6 (text only) or 12 (text and image)"));
  }
  if (h.metadata.size() > kKvcmMaxMetadataBytes) {
    return OutOfRange("header.metadata_size_bytes", h.metadata.size(), 0,
                      kKvcmMaxMetadataBytes);
  }
  return absl::OkStatus();
}

absl::Status CheckLinear(const KvcmLinear& lin, const std::string& name) {
  if (lin.rows == 0 || lin.rows > kKvcmMaxDim) {
    return OutOfRange(name + ".rows", lin.rows, 1, kKvcmMaxDim);
  }
  if (lin.cols == 0 || lin.cols > kKvcmMaxDim) {
    return OutOfRange(name + ".cols", lin.cols, 1, kKvcmMaxDim);
  }
  const uint64_t elements = uint64_t{lin.rows} * lin.cols;
  if (elements > kKvcmMaxMatrixElements) {
    return Bad(name, absl::StrFormat("rows * cols = %u is over the limit %u",
                                     elements, kKvcmMaxMatrixElements));
  }
  if (lin.weight.size() != elements) {
    return Bad(name + ".weight",
               absl::StrFormat("%u values for %u x %u", lin.weight.size(),
                               lin.rows, lin.cols));
  }
  if (!lin.bias.empty() && lin.bias.size() != lin.rows) {
    return Bad(name + ".bias", absl::StrFormat("%u values for %u rows",
                                               lin.bias.size(), lin.rows));
  }
  for (size_t i = 0; i < lin.weight.size(); ++i) {
    if (!std::isfinite(lin.weight[i])) {
      return Bad(absl::StrFormat("%s.weight[%u][%u]", name, i / lin.cols,
                                 i % lin.cols),
                 "is not finite");
    }
  }
  for (size_t i = 0; i < lin.bias.size(); ++i) {
    if (!std::isfinite(lin.bias[i])) {
      return Bad(absl::StrFormat("%s.bias[%u]", name, i), "is not finite");
    }
  }
  return absl::OkStatus();
}

// The MLP of one prefix: (f * head_dim) -> h1 -> h2 -> head_dim.
absl::Status CheckChain(const KvcmWeights& w, uint32_t layer, uint32_t prefix,
                        uint32_t head_dim) {
  const auto& blocks = w.layers[layer];
  const KvcmLinear* lin[3];
  for (uint32_t i = 0; i < 3; ++i) lin[i] = &blocks[prefix * 3 + i];
  const uint64_t in = uint64_t{w.header.compression_factor} * head_dim;
  if (lin[0]->cols != in) {
    return Bad(BlockName(layer, prefix * 3) + ".cols",
               absl::StrFormat("%u, but compression_factor %u * head_dim %u "
                               "= %u",
                               lin[0]->cols, w.header.compression_factor,
                               head_dim, in));
  }
  for (uint32_t i = 1; i < 3; ++i) {
    if (lin[i]->cols != lin[i - 1]->rows) {
      return Bad(BlockName(layer, prefix * 3 + i) + ".cols",
                 absl::StrFormat("%u, but the previous layer has %u rows",
                                 lin[i]->cols, lin[i - 1]->rows));
    }
  }
  if (lin[2]->rows != head_dim) {
    return Bad(
        BlockName(layer, prefix * 3 + 2) + ".rows",
        absl::StrFormat("%u, but head_dim is %u", lin[2]->rows, head_dim));
  }
  return absl::OkStatus();
}

// One WeightMeta and its data.
absl::Status ReadBlock(ByteReader* r, KvcmDType dtype, const std::string& name,
                       KvcmLinear* lin) {
  uint32_t has_bias = 0;
  KVH_RETURN_IF_ERROR(r->Read(&lin->rows, name + ".rows"));
  KVH_RETURN_IF_ERROR(r->Read(&lin->cols, name + ".cols"));
  KVH_RETURN_IF_ERROR(r->Read(&has_bias, name + ".has_bias"));
  if (has_bias > 1) {
    return Bad(name + ".has_bias", absl::StrCat(has_bias, " is not 0 or 1"));
  }
  if (lin->rows == 0 || lin->rows > kKvcmMaxDim) {
    return OutOfRange(name + ".rows", lin->rows, 1, kKvcmMaxDim);
  }
  if (lin->cols == 0 || lin->cols > kKvcmMaxDim) {
    return OutOfRange(name + ".cols", lin->cols, 1, kKvcmMaxDim);
  }
  const uint64_t n = uint64_t{lin->rows} * lin->cols;  // < 2^40
  if (n > kKvcmMaxMatrixElements) {
    return Bad(name, absl::StrFormat("rows * cols = %u is over the limit %u", n,
                                     kKvcmMaxMatrixElements));
  }
  const size_t es = KvcmDTypeSize(dtype);
  KVH_RETURN_IF_ERROR(r->Need(n * es, name + ".weight_data"));
  lin->weight.resize(n);
  ConvertIn(dtype, r->cursor(), n, lin->weight.data());
  KVH_RETURN_IF_ERROR(r->Skip(n * es, name + ".weight_data"));
  if (has_bias == 1) {
    const uint64_t bias_bytes = uint64_t{lin->rows} * es;
    KVH_RETURN_IF_ERROR(r->Need(bias_bytes, name + ".bias_data"));
    lin->bias.resize(lin->rows);
    ConvertIn(dtype, r->cursor(), lin->rows, lin->bias.data());
    KVH_RETURN_IF_ERROR(r->Skip(bias_bytes, name + ".bias_data"));
  }
  return absl::OkStatus();
}

}  // namespace

size_t KvcmDTypeSize(KvcmDType dtype) {
  switch (dtype) {
    case KvcmDType::kFP16:
    case KvcmDType::kBF16:
      return 2;
    case KvcmDType::kFP32:
      return 4;
  }
  return 0;
}

absl::string_view KvcmPrefixName(KvcmPrefix prefix) {
  return EnumName(prefix,
                  {"compress_tk", "compress_tv", "compress_ik", "compress_iv"});
}

uint32_t KvcmWeights::EffectiveHeadDim() const {
  if (header.head_dim != 0) return header.head_dim;
  if (layers.empty() || layers[0].size() < 3) return 0;
  return layers[0][2].rows;
}

absl::Status KvcmWeights::Validate() const {
  KVH_RETURN_IF_ERROR(CheckHeader(header));
  if (layers.size() != header.num_layers) {
    return Bad("layers", absl::StrFormat("%u layers, but header.num_layers is "
                                         "%u",
                                         layers.size(), header.num_layers));
  }
  for (uint32_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != header.weight_count_per_layer) {
      return Bad(
          absl::StrCat("layer ", l),
          absl::StrFormat("%u blocks, but weight_count_per_layer is %u",
                          layers[l].size(), header.weight_count_per_layer));
    }
    for (uint32_t b = 0; b < layers[l].size(); ++b) {
      KVH_RETURN_IF_ERROR(CheckLinear(layers[l][b], BlockName(l, b)));
    }
  }
  const uint32_t head_dim = EffectiveHeadDim();
  if (head_dim == 0 || head_dim > 4096) {
    return OutOfRange("head_dim (from compress_tk's last layer)", head_dim, 1,
                      4096);
  }
  for (uint32_t l = 0; l < layers.size(); ++l) {
    for (uint32_t p = 0; p < header.weight_count_per_layer / 3; ++p) {
      KVH_RETURN_IF_ERROR(CheckChain(*this, l, p, head_dim));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KvcmWeights> ParseKvcmWeights(absl::Span<const uint8_t> bytes) {
  ByteReader r(bytes, kWhat);
  KVH_RETURN_IF_ERROR(r.Need(kKvcmHeaderBytes, "header"));
  uint32_t magic = 0, version = 0, metadata_bytes = 0;
  uint16_t dtype = 0, reserved = 0;
  KvcmWeights w;
  KvcmHeader& h = w.header;
  KVH_RETURN_IF_ERROR(r.Read(&magic, "header.magic"));
  if (magic != kKvcmMagic) {
    return Bad("header.magic",
               absl::StrFormat("0x%08x is not 0x%08x", magic, kKvcmMagic));
  }
  KVH_RETURN_IF_ERROR(r.Read(&version, "header.version"));
  KVH_RETURN_IF_ERROR(
      CheckFormatVersion(kWhat, "header.version", version, kKvcmVersion));
  KVH_RETURN_IF_ERROR(r.Read(&dtype, "header.dtype_code"));
  KVH_RETURN_IF_ERROR(r.Read(&reserved, "header.reserved"));
  if (reserved != 0) return Bad("header.reserved", "must be 0");
  h.dtype = static_cast<KvcmDType>(dtype);
  for (uint32_t* f : {&h.num_layers, &h.num_heads, &h.head_dim, &h.hidden_size,
                      &h.compression_factor, &h.min_seq_len,
                      &h.weight_count_per_layer, &metadata_bytes}) {
    KVH_RETURN_IF_ERROR(r.Read(f, "header"));
  }
  if (metadata_bytes > kKvcmMaxMetadataBytes) {
    return OutOfRange("header.metadata_size_bytes", metadata_bytes, 0,
                      kKvcmMaxMetadataBytes);
  }
  KVH_RETURN_IF_ERROR(CheckHeader(h));
  KVH_RETURN_IF_ERROR(r.Need(metadata_bytes, "metadata"));
  h.metadata.assign(reinterpret_cast<const char*>(r.cursor()), metadata_bytes);
  KVH_RETURN_IF_ERROR(r.Skip(metadata_bytes, "metadata"));
  w.layers.resize(h.num_layers);
  for (uint32_t l = 0; l < h.num_layers; ++l) {
    w.layers[l].resize(h.weight_count_per_layer);
    for (uint32_t b = 0; b < h.weight_count_per_layer; ++b) {
      KVH_RETURN_IF_ERROR(
          ReadBlock(&r, h.dtype, BlockName(l, b), &w.layers[l][b]));
    }
  }
  if (r.remaining() != 0) {
    return Bad("length", absl::StrFormat("%u trailing bytes after the last "
                                         "weight block",
                                         r.remaining()));
  }
  KVH_RETURN_IF_ERROR(w.Validate());
  return w;
}

absl::StatusOr<std::string> SerializeKvcmWeights(const KvcmWeights& w) {
  KVH_RETURN_IF_ERROR(w.Validate());
  const KvcmHeader& h = w.header;
  ByteWriter out;
  out.Put<uint32_t>(kKvcmMagic);
  out.Put<uint32_t>(kKvcmVersion);
  out.Put<uint16_t>(static_cast<uint16_t>(h.dtype));
  out.Put<uint16_t>(0);
  for (uint32_t v :
       {h.num_layers, h.num_heads, h.head_dim, h.hidden_size,
        h.compression_factor, h.min_seq_len, h.weight_count_per_layer,
        static_cast<uint32_t>(h.metadata.size())}) {
    out.Put<uint32_t>(v);
  }
  out.PutBytes(h.metadata.data(), h.metadata.size());
  for (const auto& layer : w.layers) {
    for (const KvcmLinear& lin : layer) {
      out.Put<uint32_t>(lin.rows);
      out.Put<uint32_t>(lin.cols);
      out.Put<uint32_t>(lin.bias.empty() ? 0 : 1);
      ConvertOut(h.dtype, lin.weight, &out);
      ConvertOut(h.dtype, lin.bias, &out);
    }
  }
  return out.Release();
}

absl::StatusOr<KvcmWeights> ReadKvcmWeightsFile(const std::string& path) {
  // The largest file the limits allow is far beyond this; real compressor
  // files are megabytes.
  constexpr uint64_t kMaxFileBytes = uint64_t{16} << 30;
  return ParseWholeFile(path, kMaxFileBytes, ParseKvcmWeights);
}

absl::Status WriteKvcmWeightsFile(const KvcmWeights& weights,
                                  const std::string& path) {
  return WriteSerialized(path, SerializeKvcmWeights(weights));
}

}  // namespace kvharbor
