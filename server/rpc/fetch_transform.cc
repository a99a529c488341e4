#include "server/rpc/fetch_transform.h"

#include <xxh3.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/codec/page_elements.h"

namespace kvharbor {

namespace {

// Checks that `tokens` tokens of `shape` fit kMaxTransformFloatBytes as
// float32 (without overflowing on the way).
absl::Status CheckFloatBytes(KvSequenceShape shape, uint64_t tokens,
                             const char* what) {
  shape.num_tokens = 1;
  const uint64_t per_token = shape.Elements() * sizeof(float);
  if (tokens > kMaxTransformFloatBytes / per_token) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "transform: the %s has %u tokens of %u bytes each as float32, over "
        "the limit of %u bytes per transformed fetch (fetch fewer pages with "
        "start_page / page_count)",
        what, tokens, per_token, kMaxTransformFloatBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransformedKv> TransformPages(
    const KvTransform& transform, const Geometry& g,
    absl::Span<const uint8_t* const> pages) {
  if (pages.empty()) {
    return absl::InvalidArgumentError("transform: no pages to transform");
  }
  KvSequenceShape in_shape;
  in_shape.num_layers = g.num_layers;
  in_shape.num_kv_heads = g.num_kv_heads;
  in_shape.head_dim = g.head_dim;
  const uint64_t page_size = g.page_size;
  const uint64_t input_tokens = pages.size() * page_size;
  if (absl::Status s = CheckFloatBytes(in_shape, input_tokens, "input");
      !s.ok()) {
    return s;
  }
  in_shape.num_tokens = input_tokens;
  absl::StatusOr<uint64_t> output_tokens = transform.OutputTokens(input_tokens);
  if (!output_tokens.ok()) {
    return absl::Status(output_tokens.status().code(),
                        absl::StrCat("transform: ", transform.name(), ": ",
                                     output_tokens.status().message()));
  }
  if (absl::Status s = CheckFloatBytes(in_shape, *output_tokens, "output");
      !s.ok()) {
    return s;
  }

  // Page p's (kv, layer) block is tokens [p * page_size, ...) of the
  // sequence's (kv, layer) block: rows of num_kv_heads * head_dim elements
  // in both page layouts.
  const uint64_t block_elements = page_size * in_shape.TokenElements();
  const size_t esize = DTypeSize(g.dtype);
  std::vector<float> in(in_shape.Elements());
  for (size_t p = 0; p < pages.size(); ++p) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
        LoadElements(
            g.dtype, pages[p] + PageBlockElementOffset(g, kv, layer) * esize,
            block_elements,
            in.data() + in_shape.BlockOffset(kv, layer) + p * block_elements);
      }
    }
  }
  KvSequenceShape out_shape = in_shape;
  out_shape.num_tokens = *output_tokens;
  std::vector<float> out(out_shape.Elements());
  absl::Status applied =
      transform.Apply(KvSequenceView{in_shape, in.data()},
                      MutableKvSequenceView{out_shape, out.data()});
  if (!applied.ok()) {
    return absl::Status(
        applied.code(),
        absl::StrCat("transform: ", transform.name(), ": ", applied.message()));
  }
  std::vector<float>().swap(in);

  TransformedKv result;
  result.input_tokens = input_tokens;
  result.output_tokens = *output_tokens;
  result.bytes.resize(out.size() * esize);
  StoreElements(g.dtype, out.data(), out.size(),
                reinterpret_cast<uint8_t*>(result.bytes.data()));
  result.checksum = XXH3_64bits(result.bytes.data(), result.bytes.size());
  return result;
}

}  // namespace kvharbor
