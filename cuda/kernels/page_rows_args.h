// PageRowsArgs: what the two kernels between KVTC pages and rows share
// (cuda/kernels/gather_mean_subtract.h: pages -> rows, encode;
// cuda/kernels/mean_add_scatter.h: rows -> pages, decode): which rows of which
// pages, the calibrated mean and RoPE tables, and the vector-path switches.
// Each launcher's Args adds its row buffer.
//
// Row kinds as in core/codec/kvtc/kvtc_calibration.h: per token, row = token
// of `rows`, features [layer][kv_head][head_dim]; per page, row = page *
// num_layers + layer, features [token][kv_head][head_dim]. All pointers are
// device pointers owned by the caller. Plain value; thread-compatible.
#ifndef KVHARBOR_CUDA_KERNELS_PAGE_ROWS_ARGS_H_
#define KVHARBOR_CUDA_KERNELS_PAGE_ROWS_ARGS_H_

#include <cstdint>

#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

struct PageRowsArgs {
  KvtcPageShape shape;
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  int kv = 0;                           // 0 = keys, 1 = values
  RopeStyle rope = RopeStyle::kNone;    // kNone: no rotation
  const KvtcPageInfo* pages = nullptr;  // [num_pages]
  uint32_t num_pages = 0;
  const KvtcTokenRef* rows = nullptr;  // per token: [first_row + num_rows]
  uint64_t first_row = 0;              // rows [first_row, first_row+num_rows)
  uint32_t num_rows = 0;
  const float* mean = nullptr;  // [features]
  // [num_pages * page_size][head_dim / 2], token g = page * page_size + t;
  // needed when rope != kNone (cuda/kernels/rope_table.h).
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  bool native_fp8 = false;  // fp8 pages: hardware conversion
  // Every page pointer is 16-byte aligned: with bf16 / fp16 / fp32 pages and
  // a head_dim that allows it, kernels then use 8 / 16-byte vector accesses.
  bool pages_aligned16 = false;
  bool allow_vector = true;  // tests turn it off to check the scalar path
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGE_ROWS_ARGS_H_
