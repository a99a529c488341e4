// Offline CommVQ codebook training from KV samples
// (core/calibration/kv_samples.h): the CommVQ side of `kvharbor-calibrate
// --codec=commvq`. Chooses a CommVqConfig for the samples' geometry from a few
// knobs, arranges the samples as the trainer wants them ([layer][sample][dim],
// keys with RoPE removed) and runs core/calibration/commvq_train.h one layer at
// a time so that long runs can report progress per layer and stage. The result
// is written with core/codec/commvq/commvq_format.h and loads as a "commvq"
// namespace's calibration_path.
//
// Memory: everything is owned by the returned values; the samples are copied
// once into the trainer's layout (up to max_samples tokens).
// Thread-compatible; no state.
#ifndef KVHARBOR_TOOLS_COMMVQ_CALIBRATE_H_
#define KVHARBOR_TOOLS_COMMVQ_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/calibration/commvq_train.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/commvq/commvq_codebooks.h"

namespace kvharbor {

// The shape of the codebooks. Zero fields are derived: key_group_pairs =
// head_dim / 2 (one code pair per head and stage, the paper's choice),
// key_stages = bits * g / log2(key_levels), value_stages = bits * D /
// value_stage_rows. `bits` is the bits per element of keys and of values.
struct CommVqShape {
  uint32_t bits = 2;
  uint32_t key_levels = 16;
  uint32_t key_group_pairs = 0;
  uint32_t key_stages = 0;
  uint32_t value_stage_rows = 8;
  uint32_t value_stages = 0;
};

struct CommVqCalibrateOptions {
  CommVqShape shape;
  CommVqTrainOptions train;  // the trainer's knobs and defaults
  // Tokens beyond this are subsampled evenly (training cost is linear in
  // them).
  uint64_t max_samples = 65536;
  // Called with one line per layer and stage; may be empty.
  std::function<void(absl::string_view)> progress;
};

struct CommVqCalibration {
  CommVqCodebooks codebooks;
  CommVqTrainReport report;  // merged over layers
  uint64_t samples = 0;      // tokens trained on
};

// The config for samples of this geometry and RoPE (messages name the flag
// of kvharbor-calibrate that sets the offending field, e.g. "--bits").
absl::StatusOr<CommVqConfig> CommVqConfigFor(const KvSamples& samples,
                                             const CommVqShape& shape);

// Rows in the trainer's layout from tokens in the samples' layout
// ([token][layer][dim]): `keys` and `values` become [layer][token][dim] and
// keys get RoPE removed at `positions` when `keys_roped`.
void CommVqTrainingRows(const CommVqConfig& config, absl::Span<const float> k,
                        absl::Span<const float> v,
                        absl::Span<const uint64_t> positions, bool keys_roped,
                        std::vector<float>* keys, std::vector<float>* values);

// Validates options and samples, then trains.
absl::StatusOr<CommVqCalibration> CalibrateCommVq(
    const KvSamples& samples, const CommVqCalibrateOptions& options);

// Summary lines: geometry, bits per element, training MSE and relative error
// (RMS error over RMS element) for keys and values.
std::string DescribeCommVq(const CommVqCalibration& c);

}  // namespace kvharbor

#endif  // KVHARBOR_TOOLS_COMMVQ_CALIBRATE_H_
