// Offline training of CommVQ codebooks (core/codec/commvq/commvq_codebooks.h)
// from calibration keys and values; the library side of `kvharbor calibrate`
// for CommVQ.
//
// Keys: the EM algorithm of the paper's Algorithm 1 with the stabilizers of
// appendix A.2, per layer, per residual stage, per group of g pairs:
//   E-step (soft): W[n][(a, b)] = softmax over all Nc'^2 centres of
//     -|x_n - c_ab|^2 / T_t, for the group's residual x_n (2g floats);
//   M-step (closed form): the codebook phi (x_l, y_l of every level, for
//     each pair j of the group) minimizes sum_n sum_ab W |x_n - c_ab|^2,
//     whose normal equations A phi_j = rhs_j share A (2Nc' x 2Nc', built
//     from the summed weights) across the group's pairs; solved in double
//     by Cholesky with a small ridge towards the previous phi (levels no
//     sample chooses would make A singular);
//   temperature annealing: T_t decays exponentially from
//     key_temperature_start * E to key_temperature_end * E over the
//     iterations, E = the group's mean squared residual norm;
//   then a hard assignment with the encoder's own scoring fixes the codes
//   and the next stage trains on the residual (R stages).
// Values: NOT the paper's learned encoder. Residual k-means with a fixed
// zero centroid: stage m clusters the residual into value_stage_rows
// centroids (k-means++ seeding, Lloyd iterations), where a sample may also
// stay with the zero centroid (no bit set), exactly the choice the encoder
// makes; the codes are then subtracted and the next stage starts.
//
// Keys must be position-free (RoPE removed; RemoveRope below). Training is
// deterministic for a given seed. Costs O(samples * iterations * R * groups
// * Nc'^2) for keys: meant for offline calibration. Thread-compatible.
#ifndef KVHARBOR_CORE_CALIBRATION_COMMVQ_TRAIN_H_
#define KVHARBOR_CORE_CALIBRATION_COMMVQ_TRAIN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/commvq/commvq_codebooks.h"

namespace kvharbor {

struct CommVqTrainOptions {
  uint32_t key_iterations = 20;
  float key_temperature_start = 1.0f;
  float key_temperature_end = 1e-3f;
  // Ridge weight, relative to the mean diagonal of A.
  double key_ridge = 1e-6;
  uint32_t value_iterations = 10;
  uint64_t seed = 1;
};

// Mean squared error per element, for watching training converge.
struct CommVqTrainReport {
  // [layer][stage]: after the stage's codes are subtracted.
  std::vector<std::vector<double>> key_stage_mse;
  // [layer][stage][iteration]: hard-assignment error of the stage with the
  // codebook as it was at the start of each EM iteration, and once more
  // after the last (key_iterations + 1 values).
  std::vector<std::vector<std::vector<double>>> key_em_mse;
  std::vector<std::vector<double>> value_stage_mse;
  // [layer][stage][iteration]: the same for k-means.
  std::vector<std::vector<std::vector<double>>> value_kmeans_mse;
  // [layer]: mean squared element (the error of decoding zeros).
  std::vector<double> key_energy;
  std::vector<double> value_energy;
};

// `keys` and `values`: [layer][sample][dim] floats, `samples` per layer,
// keys position-free. `report` may be null.
absl::StatusOr<CommVqCodebooks> TrainCommVqCodebooks(
    const CommVqConfig& config, absl::Span<const float> keys,
    absl::Span<const float> values, uint64_t samples,
    const CommVqTrainOptions& options, CommVqTrainReport* report);

// Undoes RoPE on `n` key vectors ([n][dim]) at the given positions, with
// the config's rope_style and rope_theta (no-op without RoPE).
void RemoveRope(const CommVqConfig& config, float* keys,
                const uint64_t* positions, uint64_t n);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_COMMVQ_TRAIN_H_
