// OnlineCalibrationOptions: how a kvtc namespace calibrates itself from the
// pages inserted into it (docs/calibration.md), one type for the daemon's
// core (core/calibration/online_calibration.h runs it), the SDK
// (client::OnlineCalibration is this type) and the wire message
// kvharbor.v1.OnlineCalibration; and the two enums it names, KvtcRowKind and
// RopeStyle, which KVTC calibrations (core/codec/kvtc/kvtc_calibration.h)
// store too.
//
// The member initializers are the daemon's defaults. On the wire 0 (and an
// unset sink_tokens) asks for the default, so an SDK caller that leaves a
// number at 0 gets the same value as one that leaves it alone; the daemon
// returns the values it resolved.
//
// Header only; plain values (copyable, thread-compatible).
#ifndef KVHARBOR_TYPES_ONLINE_CALIBRATION_H_
#define KVHARBOR_TYPES_ONLINE_CALIBRATION_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "types/enum_names.h"

namespace kvharbor {

// The rows a KVTC calibration projects (docs/kvtc_format.md). The numbers
// are those of the calibration file; kvharbor.v1.KvtcRowKind and the C ABI
// number them from 0 (server/rpc/convert.cc, capi/ convert).
enum class KvtcRowKind : uint32_t {
  kPerToken = 1,
  kPerPage = 2,
};
inline absl::string_view KvtcRowKindName(KvtcRowKind kind) {
  return EnumName(kind, {"per_token", "per_page"}, /*first=*/1);
}

// How keys are rotated by RoPE, so that a calibration can undo it. Values
// match kvharbor.v1.RopeStyle and the calibration file; never renumber.
enum class RopeStyle : uint32_t {
  kNone = 0,
  // Pairs (2i, 2i+1): llama2.c / GPT-J / Meta's original Llama.
  kInterleaved = 1,
  // Pairs (i, i + head_dim/2): Hugging Face Llama / GPT-NeoX rotate_half.
  kHalfSplit = 2,
};
inline absl::string_view RopeStyleName(RopeStyle style) {
  return EnumName(style, {"none", "interleaved", "half_split"});
}

struct OnlineCalibrationOptions {
  bool enabled = false;
  // Tokens inserted (counted over every stored page) before calibrating.
  uint64_t min_tokens = 65536;
  // Reservoir size in tokens (a whole number of pages is kept): bounds the
  // sample memory to max_sample_tokens * 2 * layers * heads * head_dim
  // floats and the PCA's cost. 0: DefaultOnlineSampleTokens(geometry)
  // (core/calibration/online_calibration.h), which the daemon returns.
  uint64_t max_sample_tokens = 0;
  // Raw bits per row / coded bits per row the bit allocation aims at.
  double target_ratio = 16.0;
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  // Tokens at positions below are kept in FP8, not calibrated.
  uint32_t sink_tokens = 4;
  // How the keys in inserted pages are rotated (geometry.rope_theta gives
  // the base); kNone when they are not, or when RoPE is to stay in.
  RopeStyle rope_style = RopeStyle::kNone;
};

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_ONLINE_CALIBRATION_H_
