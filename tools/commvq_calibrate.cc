#include "tools/commvq_calibrate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace {

absl::Status Fail(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
}

bool IsPowerOfTwo(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

uint32_t Log2(uint32_t n) {
  uint32_t b = 0;
  while ((uint32_t{1} << b) < n) ++b;
  return b;
}

// Sets key_stages from the shape (derived from bits when 0).
absl::Status SetKeyShape(const CommVqShape& shape, CommVqConfig* cfg) {
  if (!IsPowerOfTwo(shape.key_levels) || shape.key_levels < 2 ||
      shape.key_levels > kCommVqMaxKeyLevels) {
    return Fail("--key-levels", absl::StrCat(shape.key_levels,
                                             " is not a power of two in "
                                             "[2, 256]"));
  }
  cfg->key_levels = shape.key_levels;
  cfg->key_group_pairs =
      shape.key_group_pairs != 0 ? shape.key_group_pairs : cfg->head_dim / 2;
  if (cfg->pairs() % cfg->key_group_pairs != 0) {
    return Fail("--group-pairs",
                absl::StrCat(cfg->key_group_pairs, " does not divide the ",
                             cfg->pairs(), " key pairs per token"));
  }
  cfg->key_stages = shape.key_stages;
  if (cfg->key_stages == 0) {
    const uint64_t bits = uint64_t{shape.bits} * cfg->key_group_pairs;
    const uint32_t per_code = Log2(shape.key_levels);
    if (bits % per_code != 0) {
      return Fail("--bits",
                  absl::StrFormat("%u bits * %u pairs per group is not a "
                                  "multiple of log2(key levels) = %u; set "
                                  "--key-stages",
                                  shape.bits, cfg->key_group_pairs, per_code));
    }
    cfg->key_stages = static_cast<uint32_t>(
        std::min<uint64_t>(bits / per_code, uint64_t{1} << 31));
  }
  if (cfg->key_stages > kCommVqMaxKeyStages) {
    return Fail(shape.key_stages != 0 ? "--key-stages" : "--bits",
                absl::StrCat(cfg->key_stages, " key stages, at most ",
                             kCommVqMaxKeyStages));
  }
  return absl::OkStatus();
}

absl::Status SetValueShape(const CommVqShape& shape, CommVqConfig* cfg) {
  if (shape.value_stage_rows == 0 ||
      shape.value_stage_rows > kCommVqMaxValueStageRows) {
    return Fail("--value-stage-rows",
                absl::StrCat(shape.value_stage_rows, " is not in [1, ",
                             kCommVqMaxValueStageRows, "]"));
  }
  cfg->value_stage_rows = shape.value_stage_rows;
  uint64_t stages = shape.value_stages;
  if (stages == 0) {
    const uint64_t rows = uint64_t{shape.bits} * cfg->dim();
    if (rows % shape.value_stage_rows != 0) {
      return Fail("--bits",
                  absl::StrFormat("%u bits * %u dims = %u value rows is not a "
                                  "multiple of --value-stage-rows %u; set "
                                  "--value-stages",
                                  shape.bits, cfg->dim(), rows,
                                  shape.value_stage_rows));
    }
    stages = rows / shape.value_stage_rows;
  }
  if (stages * shape.value_stage_rows > kCommVqMaxValueRows) {
    return Fail(shape.value_stages != 0 ? "--value-stages" : "--bits",
                absl::StrCat(stages * shape.value_stage_rows,
                             " value rows, at most ", kCommVqMaxValueRows));
  }
  cfg->value_stages = static_cast<uint32_t>(stages);
  return absl::OkStatus();
}

// Relative error after up to 8 evenly spaced stages, e.g. "s1 0.81 s4 0.52".
std::string StageTrail(const std::vector<double>& mse, double energy) {
  std::string out;
  const size_t n = mse.size(), shown = std::min<size_t>(n, 8);
  for (size_t i = 0; i < shown; ++i) {
    const size_t s = shown == 1 ? n - 1 : i * (n - 1) / (shown - 1);
    absl::StrAppendFormat(&out, " s%u %.3f", static_cast<unsigned>(s + 1),
                          energy > 0 ? std::sqrt(mse[s] / energy) : 0.0);
  }
  return out;
}

void AppendLayer(CommVqTrainReport&& one, CommVqTrainReport* all) {
  auto move_into = [](auto& from, auto& to) {
    for (auto& x : from) to.push_back(std::move(x));
  };
  move_into(one.key_stage_mse, all->key_stage_mse);
  move_into(one.key_em_mse, all->key_em_mse);
  move_into(one.value_stage_mse, all->value_stage_mse);
  move_into(one.value_kmeans_mse, all->value_kmeans_mse);
  move_into(one.key_energy, all->key_energy);
  move_into(one.value_energy, all->value_energy);
}

// Tokens kept: all, or max_samples evenly spaced ones.
std::vector<uint64_t> ChooseTokens(uint64_t tokens, uint64_t max_samples) {
  const uint64_t n = std::min(tokens, max_samples);
  std::vector<uint64_t> idx(n);
  for (uint64_t i = 0; i < n; ++i) {
    idx[i] = static_cast<uint64_t>(static_cast<double>(i) * tokens / n);
  }
  return idx;
}

// Trains layer by layer (the trainer's seed advanced per layer) so that
// progress can be reported; the layers are independent in the trainer.
absl::StatusOr<CommVqCalibration> TrainByLayer(
    const CommVqConfig& config, const std::vector<float>& keys,
    const std::vector<float>& values, uint64_t samples,
    const CommVqCalibrateOptions& options) {
  CommVqCalibration out;
  out.codebooks.config = config;
  out.samples = samples;
  CommVqConfig one = config;
  one.num_layers = 1;
  const uint64_t per_layer = samples * config.dim();
  for (uint32_t l = 0; l < config.num_layers; ++l) {
    if (options.progress) {
      options.progress(absl::StrFormat("layer %u/%u: training on %u samples",
                                       l + 1, config.num_layers, samples));
    }
    CommVqTrainOptions train = options.train;
    train.seed = options.train.seed + l;
    CommVqTrainReport rep;
    KVH_ASSIGN_OR_RETURN(
        CommVqCodebooks cb,
        TrainCommVqCodebooks(
            one, absl::MakeConstSpan(keys.data() + l * per_layer, per_layer),
            absl::MakeConstSpan(values.data() + l * per_layer, per_layer),
            samples, train, &rep));
    if (options.progress) {
      options.progress(
          absl::StrCat("  keys rel err by stage:",
                       StageTrail(rep.key_stage_mse[0], rep.key_energy[0])));
      options.progress(absl::StrCat(
          "  values rel err by stage:",
          StageTrail(rep.value_stage_mse[0], rep.value_energy[0])));
    }
    out.codebooks.key.insert(out.codebooks.key.end(), cb.key.begin(),
                             cb.key.end());
    out.codebooks.value.insert(out.codebooks.value.end(), cb.value.begin(),
                               cb.value.end());
    AppendLayer(std::move(rep), &out.report);
  }
  KVH_RETURN_IF_ERROR(out.codebooks.Validate());
  return out;
}

}  // namespace

absl::StatusOr<CommVqConfig> CommVqConfigFor(const KvSamples& samples,
                                             const CommVqShape& shape) {
  if (shape.bits == 0) return Fail("--bits", "must be at least 1");
  CommVqConfig cfg;
  cfg.num_layers = samples.num_layers;
  cfg.num_kv_heads = samples.num_kv_heads;
  cfg.head_dim = samples.head_dim;
  cfg.rope_style = samples.rope_style;
  cfg.rope_theta =
      samples.rope_style == RopeStyle::kNone ? 0.0f : samples.rope_theta;
  KVH_RETURN_IF_ERROR(SetKeyShape(shape, &cfg));
  KVH_RETURN_IF_ERROR(SetValueShape(shape, &cfg));
  KVH_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

void CommVqTrainingRows(const CommVqConfig& config, absl::Span<const float> k,
                        absl::Span<const float> v,
                        absl::Span<const uint64_t> positions, bool keys_roped,
                        std::vector<float>* keys, std::vector<float>* values) {
  const uint32_t L = config.num_layers, D = config.dim();
  const uint64_t n = positions.size();
  keys->assign(uint64_t{L} * n * D, 0.0f);
  values->assign(keys->size(), 0.0f);
  for (uint64_t t = 0; t < n; ++t) {
    for (uint32_t l = 0; l < L; ++l) {
      const uint64_t src = (t * L + l) * D, dst = (uint64_t{l} * n + t) * D;
      std::copy_n(k.data() + src, D, keys->data() + dst);
      std::copy_n(v.data() + src, D, values->data() + dst);
    }
  }
  if (!keys_roped) return;
  for (uint32_t l = 0; l < L; ++l) {
    RemoveRope(config, keys->data() + uint64_t{l} * n * D, positions.data(), n);
  }
}

absl::StatusOr<CommVqCalibration> CalibrateCommVq(
    const KvSamples& samples, const CommVqCalibrateOptions& options) {
  if (options.max_samples == 0) {
    return Fail("--max-samples", "must be at least 1");
  }
  if (options.train.key_iterations == 0) {
    return Fail("--key-iterations", "must be at least 1");
  }
  KVH_RETURN_IF_ERROR(samples.Validate());
  KVH_ASSIGN_OR_RETURN(const CommVqConfig config,
                       CommVqConfigFor(samples, options.shape));
  const uint64_t F = samples.FeaturesPerToken();
  const std::vector<uint64_t> chosen =
      ChooseTokens(samples.tokens, options.max_samples);
  std::vector<float> k(chosen.size() * F), v(k.size());
  std::vector<uint64_t> positions(chosen.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    std::copy_n(samples.k.data() + chosen[i] * F, F, k.data() + i * F);
    std::copy_n(samples.v.data() + chosen[i] * F, F, v.data() + i * F);
    positions[i] = static_cast<uint64_t>(samples.positions[chosen[i]]);
  }
  std::vector<float> keys, values;
  CommVqTrainingRows(
      config, k, v, positions,
      samples.keys_roped && config.rope_style != RopeStyle::kNone, &keys,
      &values);
  return TrainByLayer(config, keys, values, chosen.size(), options);
}

std::string DescribeCommVq(const CommVqCalibration& c) {
  const CommVqConfig& g = c.codebooks.config;
  const CommVqTrainReport& r = c.report;
  double kmse = 0, ke = 0, vmse = 0, ve = 0;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    kmse += r.key_stage_mse[l].back() / g.num_layers;
    ke += r.key_energy[l] / g.num_layers;
    vmse += r.value_stage_mse[l].back() / g.num_layers;
    ve += r.value_energy[l] / g.num_layers;
  }
  const double kbits = double(g.key_bits_per_token()) / g.dim();
  const double vbits = double(g.value_bits_per_token()) / g.dim();
  return absl::StrFormat(
      "commvq: %u layers x %u kv heads x %u dims, %u samples\n"
      "keys:   Nc'=%u g=%u R=%u -> %.4g bits/value, training MSE %.4g "
      "(mean square %.4g), relative error %.4f\n"
      "values: %u stages x %u rows -> %.4g bits/value, training MSE %.4g "
      "(mean square %.4g), relative error %.4f",
      g.num_layers, g.num_kv_heads, g.head_dim, c.samples, g.key_levels,
      g.key_group_pairs, g.key_stages, kbits, kmse, ke,
      ke > 0 ? std::sqrt(kmse / ke) : 0.0, g.value_stages, g.value_stage_rows,
      vbits, vmse, ve, ve > 0 ? std::sqrt(vmse / ve) : 0.0);
}

}  // namespace kvharbor
