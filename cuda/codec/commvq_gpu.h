// Kernel launchers: CommVQ decoding and encoding on the GPU, bit for bit the
// CPU reference of core/codec/commvq/commvq_codebooks.h (same summation order,
// explicit round-to-nearest intrinsics, no fused multiply-add, the same tie
// rules), so GPU and CPU codes and decoded vectors are identical.
//
// Layouts (dimension order; all device memory owned by the caller):
//   key codebook   [layer][stage][pair][level][x, y] float32 (as
//                  CommVqCodebooks::key), value codebook [layer][row][dim]
//                  (CommVqCodebooks::value);
//   key codes      [layer][token][stage][group][a, b] uint16 (key_codes()
//                  per token; only the low log2(key_levels) bits are used);
//   value bits     [layer][token][ValueBytes] bytes, bit n at byte n / 8,
//                  bit n % 8 (ValueBytes = ceil(value_rows() / 8));
//   keys / values  [layer][token][dim] float32, dim = kv_heads * head_dim.
// Keys are position-free (RoPE removed), as the CPU encoder takes them and
// DecodeCommVqKey returns them; (un)rotating by position stays with the
// caller (core/codec/commvq/commvq_codec.h does it on the CPU).
//
// The encoders need precomputed tables (LaunchCommVqTables: Na / M2 for
// keys, row norms for values; computed on the GPU with the CPU's
// arithmetic) and a residual workspace. Encoder inputs must be finite
// (the CPU codec refuses others before encoding). Thread-safe.
#ifndef KVHARBOR_CUDA_CODEC_COMMVQ_GPU_H_
#define KVHARBOR_CUDA_CODEC_COMMVQ_GPU_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/codec/commvq/commvq_codebooks.h"

namespace kvharbor {
namespace gpu {

inline uint64_t CommVqValueBytes(const CommVqConfig& c) {
  return (uint64_t{c.value_rows()} + 7) / 8;
}

struct CommVqDecodeArgs {
  CommVqConfig config;  // must Validate()
  uint64_t tokens = 0;  // per layer
  const float* key_codebook = nullptr;
  const float* value_codebook = nullptr;
  const uint16_t* key_codes = nullptr;  // null: keys not decoded
  const uint8_t* value_bits = nullptr;  // null: values not decoded
  float* keys = nullptr;
  float* values = nullptr;
};

// Score tables of the encoders, [layer][stage][group][level] (Na),
// [layer][stage][group][a][b] (M2) and [layer][row] (value row norms).
struct CommVqTables {
  float* na = nullptr;
  float* m2 = nullptr;
  float* value_norms = nullptr;
};
uint64_t CommVqNaFloats(const CommVqConfig& c);
uint64_t CommVqM2Floats(const CommVqConfig& c);
uint64_t CommVqValueNormFloats(const CommVqConfig& c);

struct CommVqTablesArgs {
  CommVqConfig config;
  const float* key_codebook = nullptr;
  const float* value_codebook = nullptr;
  CommVqTables tables;  // outputs
};

struct CommVqEncodeArgs {
  CommVqConfig config;
  uint64_t tokens = 0;
  const float* key_codebook = nullptr;
  const float* value_codebook = nullptr;
  CommVqTables tables;            // from LaunchCommVqTables (inputs here)
  const float* keys = nullptr;    // null: keys not encoded
  const float* values = nullptr;  // null: values not encoded
  uint16_t* key_codes = nullptr;
  uint8_t* value_bits = nullptr;
};

inline size_t CommVqDecodeWorkspaceBytes(const CommVqDecodeArgs&) { return 0; }
inline size_t CommVqTablesWorkspaceBytes(const CommVqTablesArgs&) { return 0; }
// Residuals: layers * tokens * dim floats for each of K and V.
size_t CommVqEncodeWorkspaceBytes(const CommVqEncodeArgs& args);

// InvalidArgument naming the field for an invalid config, null pointers
// that are needed, tokens == 0 or > 2^31, or a short workspace.
absl::Status LaunchCommVqDecode(const CommVqDecodeArgs& args,
                                cudaStream_t stream);
absl::Status LaunchCommVqTables(const CommVqTablesArgs& args,
                                cudaStream_t stream);
absl::Status LaunchCommVqEncode(const CommVqEncodeArgs& args, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CODEC_COMMVQ_GPU_H_
