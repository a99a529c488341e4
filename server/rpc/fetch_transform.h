// Fetch transforms: what Fetch sends instead of the pages when a client asks
// for FetchRequest.transform. So far there is one, KVCM
// (core/transform/kvcm_compressor.h), which is LOSSY and LENGTH-CHANGING: the
// result is a new, shorter KV sequence, not the pages, and it reports its own
// token count.
//
// TransformPages decodes a namespace's raw pages (page i holding tokens
// [i * page_size, (i + 1) * page_size) of one sequence) to float32 with
// core/codec/page_elements.h, runs the transform on them as ONE sequence, and
// encodes the result back to the namespace's dtype (round to nearest even,
// fp8 saturating) in the layout [2 (K then V)][layer][token][kv_head]
// [head_dim], whatever the page layout. It runs on the calling thread (the
// Fetch handler, as page decoding does).
//
// Memory: the caller owns the pages (they must stay valid for the call); the
// result owns its bytes; float32 copies of the input and output are
// allocated per call, at most kMaxTransformFloatBytes each. Pure function of
// its arguments; thread-safe (KvTransform is const and thread-safe).
#ifndef KVHARBOR_SERVER_RPC_FETCH_TRANSFORM_H_
#define KVHARBOR_SERVER_RPC_FETCH_TRANSFORM_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/transform/kv_transform.h"
#include "types/geometry.h"

namespace kvharbor {

// Mirrors kvharbor.v1.FetchTransform.
enum class FetchTransform { kNone, kKvcm };

// Bound on the float32 copy of one transformed fetch's input (and output):
// larger requests are RESOURCE_EXHAUSTED naming "transform" (fetch fewer
// pages with start_page / page_count).
inline constexpr uint64_t kMaxTransformFloatBytes = uint64_t{1} << 30;

struct TransformedKv {
  // output_tokens tokens in the namespace's dtype,
  // [2][layer][token][kv_head][head_dim].
  std::string bytes;
  uint64_t checksum = 0;  // XXH3-64 of bytes
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
};

// `pages`: raw pages of `geometry` (PageBytes() each), at least one.
// Errors name "transform".
absl::StatusOr<TransformedKv> TransformPages(
    const KvTransform& transform, const Geometry& geometry,
    absl::Span<const uint8_t* const> pages);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_FETCH_TRANSFORM_H_
