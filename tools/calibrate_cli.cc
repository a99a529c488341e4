#include "tools/calibrate_cli.h"

#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/blas_kernel_check.h"
#include "core/base/status_macros.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/commvq/commvq_format.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#ifdef KVHARBOR_CALIBRATE_GPU
#include "cuda/calibration/calibration_pca_gpu.h"
#endif

namespace kvharbor {

const char kCalibrateUsage[] =
    "usage: kvharbor-calibrate --samples FILE --out PREFIX [options]\n"
    "  --codec NAME         kvtc (default): writes PREFIX.<ratio>x.kvtc for\n"
    "                       each ratio; commvq: writes PREFIX.commvq\n"
    "  --quiet              no progress lines\n"
    "kvtc options:\n"
    "  --ratios LIST        target ratios vs raw-dtype rows (default 8,16,32)\n"
    "  --raw-dtype NAME     bf16|fp16|fp32 the ratio refers to (default bf16)\n"
    "  --row-kind KIND      per_token (default) | per_page\n"
    "  --page-size N        the namespace's page size (default 16)\n"
    "  --sink-tokens N      attention-sink tokens kept in FP8 (default 4)\n"
    "  --no-undo-rope       keep RoPE on keys (default: undo it when the\n"
    "                       samples hold roped keys)\n"
    "  --group-sizes LIST   components per DP group; the best size per\n"
    "                       ratio is kept (default 4,8,16,32,64,128)\n"
    "  --error-model M      measured (default) | model\n"
    "  --merge-intx         merge adjacent IntX groups of equal width\n"
    "  --max-rows N         subsample rows beyond N (default 262144)\n"
    "  --layer-groups N     block-diagonal bases: per_token rows in N groups\n"
    "                       of consecutive layers, one PCA each (default 1;\n"
    "                       N divides the layers; 1/N of the codec's\n"
    "                       projection arithmetic)\n"
    "  --pages-per-buffer N pages per stored buffer the ratio counts every\n"
    "                       byte over (default 1: the store's eviction)\n"
    "  --components N       components each PCA computes (default: as many\n"
    "                       as the ratios can give bits to; the CPU subspace\n"
    "                       solver at most 1024)\n"
    "  --device D           auto (default: the GPU when built with CUDA and\n"
    "                       one is present) | cpu | gpu\n"
    "  --cpu-solver S       auto (default: exact up to 2048 features, or up\n"
    "                       to 8192 when a quarter of them are wanted) |\n"
    "                       exact (<= 8192 features) | subspace (randomized\n"
    "                       top-k, <= 65536 features)\n"
    "  --cpu-iterations N   subspace power passes (default 2)\n"
    "  --gpu-solver S       auto (default) | syevd (all components) |\n"
    "                       subspace (randomized top-k)\n"
    "  --gpu-tf32           TF32 tensor cores for the GPU covariance\n"
    "  --chunk-rows N       rows per GPU covariance GEMM (default 4096)\n"
    "commvq options (docs/commvq_format.md, \"Training\"):\n"
    "  --bits N             bits per element, keys and values (default 2)\n"
    "  --key-levels N       key levels Nc' per code, power of two (default "
    "16)\n"
    "  --group-pairs N      key pairs per code g (default head_dim / 2)\n"
    "  --key-stages N       key residual stages R (default bits*g/log2 Nc')\n"
    "  --value-stage-rows N value rows per k-means stage (default 8)\n"
    "  --value-stages N     value stages (default bits*D/value-stage-rows)\n"
    "  --key-iterations N   EM iterations per key stage (default 20)\n"
    "  --value-iterations N Lloyd iterations per value stage (default 10)\n"
    "  --seed N             training seed (default 1)\n"
    "  --max-samples N      subsample tokens beyond N (default 65536)\n";

namespace {

absl::Status Fail(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
}

absl::StatusOr<uint64_t> ParseU64(absl::string_view flag, absl::string_view v) {
  uint64_t n = 0;
  if (!absl::SimpleAtoi(v, &n)) {
    return Fail(flag, absl::StrCat("'", v, "' is not an unsigned integer"));
  }
  return n;
}

absl::StatusOr<uint32_t> ParseU32(absl::string_view flag, absl::string_view v) {
  KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, v));
  if (n > std::numeric_limits<uint32_t>::max()) return Fail(flag, "too large");
  return static_cast<uint32_t>(n);
}

using ValueFn = std::function<absl::StatusOr<std::string>()>;

// Handles the KVTC flags; false when `flag` is not one.
absl::StatusOr<bool> ParseKvtcFlag(const std::string& flag,
                                   const ValueFn& value, CalibrateOptions* o) {
  if (flag == "--ratios") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    o->ratios.clear();
    for (absl::string_view r : absl::StrSplit(v, ',')) {
      double d = 0;
      if (!absl::SimpleAtod(r, &d)) {
        return Fail(flag, absl::StrCat("'", r, "' is not a number"));
      }
      o->ratios.push_back(d);
    }
  } else if (flag == "--raw-dtype") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    auto d = ParseDType(v);
    if (!d.ok()) return Fail(flag, d.status().message());
    o->raw_dtype = *d;
  } else if (flag == "--row-kind") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    if (v == "per_token") {
      o->row_kind = KvtcRowKind::kPerToken;
    } else if (v == "per_page") {
      o->row_kind = KvtcRowKind::kPerPage;
    } else {
      return Fail(flag, absl::StrCat("'", v, "' is not per_token or per_page"));
    }
  } else if (flag == "--page-size" || flag == "--sink-tokens") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, v));
    if (n > (uint64_t{1} << 20)) return Fail(flag, "too large");
    (flag == "--page-size" ? o->page_size : o->sink_tokens) =
        static_cast<uint32_t>(n);
  } else if (flag == "--group-sizes") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    o->group_sizes.clear();
    for (absl::string_view g : absl::StrSplit(v, ',')) {
      KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, g));
      o->group_sizes.push_back(n);
    }
  } else if (flag == "--max-rows" || flag == "--components") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN((flag == "--max-rows" ? o->max_rows : o->components),
                         ParseU64(flag, v));
  } else if (flag == "--layer-groups" || flag == "--pages-per-buffer" ||
             flag == "--cpu-iterations") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN(const uint32_t n, ParseU32(flag, v));
    if (n == 0 && flag != "--cpu-iterations") {
      return Fail(flag, "must be at least 1");
    }
    (flag == "--layer-groups"       ? o->layer_groups
     : flag == "--pages-per-buffer" ? o->pages_per_buffer
                                    : o->cpu.iterations) = n;
  } else if (flag == "--cpu-solver") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    if (v == "auto") {
      o->cpu.solver = CpuPcaSolver::kAuto;
    } else if (v == "exact") {
      o->cpu.solver = CpuPcaSolver::kExact;
    } else if (v == "subspace") {
      o->cpu.solver = CpuPcaSolver::kSubspace;
    } else {
      return Fail(flag,
                  absl::StrCat("'", v, "' is not auto, exact or subspace"));
    }
  } else if (flag == "--error-model") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    if (v != "measured" && v != "model") {
      return Fail(flag, absl::StrCat("'", v, "' is not measured or model"));
    }
    o->measured_errors = v == "measured";
  } else if (flag == "--no-undo-rope") {
    o->undo_rope = false;
  } else if (flag == "--merge-intx") {
    o->merge_intx = true;
  } else {
    return false;
  }
  return true;
}

// Handles the CommVQ flags; false when `flag` is not one. Zero is refused
// here for the knobs where it would mean nothing; 0 = "derive" is not
// offered on the command line (leave the flag out instead).
absl::StatusOr<bool> ParseCommVqFlag(const std::string& flag,
                                     const ValueFn& value,
                                     CommVqCalibrateOptions* o) {
  CommVqShape& s = o->shape;
  uint32_t* u32 = flag == "--bits"               ? &s.bits
                  : flag == "--key-levels"       ? &s.key_levels
                  : flag == "--group-pairs"      ? &s.key_group_pairs
                  : flag == "--key-stages"       ? &s.key_stages
                  : flag == "--value-stage-rows" ? &s.value_stage_rows
                  : flag == "--value-stages"     ? &s.value_stages
                  : flag == "--key-iterations"   ? &o->train.key_iterations
                  : flag == "--value-iterations" ? &o->train.value_iterations
                                                 : nullptr;
  if (u32 != nullptr) {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN(*u32, ParseU32(flag, v));
    if (*u32 == 0 && flag != "--value-iterations") {
      return Fail(flag, "must be at least 1");
    }
  } else if (flag == "--seed" || flag == "--max-samples") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN((flag == "--seed" ? o->train.seed : o->max_samples),
                         ParseU64(flag, v));
  } else {
    return false;
  }
  return true;
}

// Handles --device and the GPU PCA flags; false when `flag` is not one.
absl::StatusOr<bool> ParseDeviceFlag(const std::string& flag,
                                     const ValueFn& value, CalibrateArgs* a) {
  if (flag == "--gpu-tf32") {
    a->gpu.tf32 = true;
    return true;
  }
  if (flag != "--device" && flag != "--gpu-solver" && flag != "--chunk-rows") {
    return false;
  }
  KVH_ASSIGN_OR_RETURN(const std::string v, value());
  if (flag == "--device") {
    if (v == "auto") {
      a->device = CalibrateDevice::kAuto;
    } else if (v == "cpu") {
      a->device = CalibrateDevice::kCpu;
    } else if (v == "gpu") {
      a->device = CalibrateDevice::kGpu;
    } else {
      return Fail(flag, absl::StrCat("'", v, "' is not auto, cpu or gpu"));
    }
  } else if (flag == "--gpu-solver") {
    if (v != "auto" && v != "syevd" && v != "subspace") {
      return Fail(flag,
                  absl::StrCat("'", v, "' is not auto, syevd or subspace"));
    }
    a->gpu.solver = v;
  } else {
    KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, v));
    if (n == 0 || n > 65536) return Fail(flag, "must be 1..65536");
    a->gpu.chunk_rows = n;
  }
  return true;
}

absl::StatusOr<CalibrateCodec> ParseCodec(const std::string& v) {
  if (v == "kvtc") return CalibrateCodec::kKvtc;
  if (v == "commvq") return CalibrateCodec::kCommVq;
  return Fail("--codec", absl::StrCat("'", v, "' is not kvtc or commvq"));
}

// Parses one flag at args[*i] (advancing *i past its value); records in
// *only the codec the flag belongs to, if any.
absl::Status ParseOne(const std::vector<std::string>& args, size_t* i,
                      CalibrateArgs* a, int* only) {
  std::string flag = args[*i];
  std::optional<std::string> inline_value;
  const size_t eq = flag.find('=');
  if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
    inline_value = flag.substr(eq + 1);
    flag.resize(eq);
  }
  const ValueFn value = [&]() -> absl::StatusOr<std::string> {
    if (inline_value) return *inline_value;
    if (*i + 1 >= args.size()) return Fail(flag, "needs a value");
    return args[++*i];
  };
  *only = -1;
  // Switches take no value, whichever group handles them.
  for (const char* sw : {"--help", "-h", "--quiet", "--gpu-tf32",
                         "--no-undo-rope", "--merge-intx"}) {
    if (inline_value && flag == sw) return Fail(flag, "takes no value");
  }
  if (flag == "--help" || flag == "-h") {
    a->help = true;
  } else if (flag == "--codec") {
    KVH_ASSIGN_OR_RETURN(const std::string v, value());
    KVH_ASSIGN_OR_RETURN(a->codec, ParseCodec(v));
  } else if (flag == "--samples") {
    KVH_ASSIGN_OR_RETURN(a->samples, value());
  } else if (flag == "--out") {
    KVH_ASSIGN_OR_RETURN(a->out, value());
  } else if (flag == "--quiet") {
    a->quiet = true;
  } else {
    KVH_ASSIGN_OR_RETURN(const bool kvtc, ParseKvtcFlag(flag, value, &a->kvtc));
    KVH_ASSIGN_OR_RETURN(const bool device, ParseDeviceFlag(flag, value, a));
    if (kvtc || device) {
      *only = static_cast<int>(CalibrateCodec::kKvtc);
      return absl::OkStatus();
    }
    KVH_ASSIGN_OR_RETURN(const bool cvq,
                         ParseCommVqFlag(flag, value, &a->commvq));
    if (!cvq) return Fail(flag, "unknown option (see --help)");
    *only = static_cast<int>(CalibrateCodec::kCommVq);
  }
  return absl::OkStatus();
}

void Progress(absl::string_view line) {
  std::fprintf(stderr, "%s\n", std::string(line).c_str());
}

absl::Status RunKvtc(const CalibrateArgs& args, const KvSamples& samples) {
  CalibrateOptions options = args.kvtc;
  if (!args.quiet) options.progress = Progress;
  KVH_ASSIGN_OR_RETURN(options.pca, MakeCalibrationPca(args));
  if (const std::string w = BlasKernelWarning(DetectBlasKernels());
      !w.empty()) {
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  std::fprintf(stderr, "pca: %s\n",
               options.pca != nullptr
                   ? options.pca->name().c_str()
                   : CpuCalibrationPca(options.cpu).name().c_str());
  KVH_ASSIGN_OR_RETURN(const std::vector<CalibrationOutcome> outcomes,
                       CalibrateKvtc(samples, options));
  for (const CalibrationOutcome& o : outcomes) {
    const std::string path = absl::StrFormat("%s.%gx.kvtc", args.out, o.ratio);
    KVH_RETURN_IF_ERROR(WriteKvtcCalibrationFile(o.calibration, path));
    std::printf("%s  -> %s (fingerprint %016llx)\n", DescribeOutcome(o).c_str(),
                path.c_str(),
                static_cast<unsigned long long>(o.calibration.Fingerprint()));
  }
  return absl::OkStatus();
}

absl::Status RunCommVq(const CalibrateArgs& args, const KvSamples& samples) {
  CommVqCalibrateOptions options = args.commvq;
  if (!args.quiet) options.progress = Progress;
  KVH_ASSIGN_OR_RETURN(const CommVqCalibration c,
                       CalibrateCommVq(samples, options));
  const std::string path = CommVqOutputPath(args.out);
  KVH_RETURN_IF_ERROR(WriteCommVqCodebooksFile(c.codebooks, path));
  std::printf("%s\n  -> %s (fingerprint %016llx)\n", DescribeCommVq(c).c_str(),
              path.c_str(),
              static_cast<unsigned long long>(c.codebooks.Fingerprint()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CalibrateArgs> ParseCalibrateArgs(
    const std::vector<std::string>& args) {
  CalibrateArgs a;
  std::vector<std::pair<std::string, int>> specific;
  for (size_t i = 0; i < args.size(); ++i) {
    int only = -1;
    const std::string flag = args[i];
    KVH_RETURN_IF_ERROR(ParseOne(args, &i, &a, &only));
    if (only >= 0) specific.emplace_back(flag, only);
  }
  if (a.help) return a;
  for (const auto& [flag, codec] : specific) {
    if (codec != static_cast<int>(a.codec)) {
      return Fail(flag.substr(0, flag.find('=')),
                  absl::StrCat("only applies to --codec=",
                               codec == 0 ? "kvtc" : "commvq"));
    }
  }
  if (a.samples.empty()) return Fail("--samples", "is required");
  if (a.out.empty()) return Fail("--out", "is required");
  return a;
}

bool CalibrateGpuBuilt() {
#ifdef KVHARBOR_CALIBRATE_GPU
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::shared_ptr<const CalibrationPca>> MakeCalibrationPca(
    const CalibrateArgs& args) {
  if (args.device == CalibrateDevice::kCpu) return nullptr;
#ifdef KVHARBOR_CALIBRATE_GPU
  if (gpu::CudaDeviceCount() == 0) {
    if (args.device == CalibrateDevice::kAuto) return nullptr;
    return absl::FailedPreconditionError(
        "--device: gpu asked for, but no CUDA device is present");
  }
  gpu::GpuCalibrationPcaOptions o;
  o.solver = args.gpu.solver == "syevd"      ? gpu::CalibrationSolver::kSyevd
             : args.gpu.solver == "subspace" ? gpu::CalibrationSolver::kSubspace
                                             : gpu::CalibrationSolver::kAuto;
  o.precision =
      args.gpu.tf32 ? gpu::PcaPrecision::kTf32 : gpu::PcaPrecision::kFp32;
  o.chunk_rows = args.gpu.chunk_rows;
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuCalibrationPca> pca,
                       gpu::GpuCalibrationPca::Create(o));
  return std::shared_ptr<const CalibrationPca>(std::move(pca));
#else
  if (args.device == CalibrateDevice::kAuto) return nullptr;
  return absl::FailedPreconditionError(
      "--device: gpu asked for, but this kvharbor-calibrate was built "
      "without CUDA (-DKVHARBOR_CUDA=ON builds the GPU path)");
#endif
}

std::string CommVqOutputPath(const std::string& prefix) {
  return prefix + ".commvq";
}

absl::Status RunCalibrate(const CalibrateArgs& args) {
  KVH_ASSIGN_OR_RETURN(const KvSamples samples, ReadKvSamples(args.samples));
  std::fprintf(stderr,
               "samples: %u tokens, %u layers x %u kv heads x %u dims, "
               "rope %s\n",
               static_cast<unsigned>(samples.tokens), samples.num_layers,
               samples.num_kv_heads, samples.head_dim,
               std::string(RopeStyleName(samples.rope_style)).c_str());
  return args.codec == CalibrateCodec::kKvtc ? RunKvtc(args, samples)
                                             : RunCommVq(args, samples);
}

}  // namespace kvharbor
