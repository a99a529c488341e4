// Splitting one KVTC batch buffer into one buffer per page.
//
// KVTC quantizes row by row (FP8 per value, IntX with per-row min/max) and
// orders every section's rows page by page (core/codec/kvtc/kvtc_codec.cc), so
// the buffer of a batch holds each page's rows as contiguous slices of every
// range. The host-compressed tier stores one buffer per page, while the GPU
// encoder is fast only on large batches (one projection GEMM for many pages):
// the GPU tier encodes a batch, then SplitKvtcBatch cuts it into the buffers a
// one-page Encode of each page would make (same layout, headers and
// envelope; the quantized bytes are the batch's). MergeKvtcPages is the
// inverse, for the GPU decoder (also fast only on large batches): it joins
// one-page buffers back into one batch buffer.
//
// Pure functions; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_SPLIT_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_SPLIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "types/geometry.h"

namespace kvharbor {

// `buffer`: a complete KVTC buffer of `cal` and `geometry` (its body
// checksum is not verified: the caller made it). Returns one complete
// buffer per page, in order, each with the zstd stage when `zstd` and
// smaller. Errors: a buffer of another codec, or headers that do not match
// the layout of its pages.
absl::StatusOr<std::vector<std::string>> SplitKvtcBatch(
    const KvtcCalibration& cal, const Geometry& geometry,
    absl::Span<const uint8_t> buffer, bool zstd = false, int zstd_level = 1);

// The inverse of SplitKvtcBatch: `pages` (one-page KVTC buffers of `cal`,
// whose fingerprint is `fingerprint`, and `geometry`, each with or without
// the zstd stage) joined, in order, into one batch buffer without the zstd
// stage, written to `out`; returns its size. MergeKvtcPages(Split(b)) is b
// byte for byte when b has no zstd stage. Every page is checked in full
// (envelope and body checksum, one page, codec, geometry, calibration,
// payload headers); errors name "pages[i]". InvalidArgument when `out` is
// too small (MaxEncodedSize of the codec for pages.size() pages suffices).
absl::StatusOr<size_t> MergeKvtcPages(
    const KvtcCalibration& cal, uint64_t fingerprint, const Geometry& geometry,
    absl::Span<const absl::Span<const uint8_t>> pages, absl::Span<uint8_t> out);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_SPLIT_H_
