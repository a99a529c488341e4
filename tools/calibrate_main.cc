// kvharbor-calibrate: offline KVTC calibration from a KV sample file
// (docs/kv_samples.md) to one calibration file per target ratio
// (docs/kvtc_format.md). Run with --help for the options.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/kvtc_calibration.h"
#include "core/status_macros.h"
#include "tools/kv_samples.h"
#include "tools/kvtc_calibrate.h"

namespace kvharbor {
namespace {

constexpr char kUsage[] =
    "usage: kvharbor-calibrate --samples FILE --out PREFIX [options]\n"
    "Writes PREFIX.<ratio>x.kvtc for each ratio.\n"
    "  --ratios LIST        target ratios vs raw-dtype rows (default 8,16,32)\n"
    "  --raw-dtype NAME     bf16|fp16|fp32 the ratio refers to (default bf16)\n"
    "  --row-kind KIND      per_token (default) | per_page\n"
    "  --page-size N        the namespace's page size (default 16)\n"
    "  --sink-tokens N      attention-sink tokens kept in FP8 (default 4)\n"
    "  --no-undo-rope       keep RoPE on keys (default: undo it when the\n"
    "                       samples hold roped keys)\n"
    "  --group-sizes LIST   components per DP group; the best size per\n"
    "                       ratio and basis is kept (default 4,8,16,32)\n"
    "  --error-model M      measured (default) | model\n"
    "  --merge-intx         merge adjacent IntX groups of equal width\n"
    "  --max-rows N         subsample rows beyond N (default 262144)\n"
    "  --quiet              no progress lines\n";

absl::Status Fail(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
}

struct Args {
  std::string samples;
  std::string out;
  bool quiet = false;
  CalibrateOptions options;
};

absl::StatusOr<uint64_t> ParseU64(absl::string_view flag, absl::string_view v) {
  uint64_t n = 0;
  if (!absl::SimpleAtoi(v, &n)) {
    return Fail(flag, absl::StrCat("'", v, "' is not an unsigned integer"));
  }
  return n;
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return Fail(flag, "needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (flag == "--samples") {
      KVH_ASSIGN_OR_RETURN(a.samples, value());
    } else if (flag == "--out") {
      KVH_ASSIGN_OR_RETURN(a.out, value());
    } else if (flag == "--ratios") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      a.options.ratios.clear();
      for (absl::string_view r : absl::StrSplit(v, ',')) {
        double d = 0;
        if (!absl::SimpleAtod(r, &d)) {
          return Fail(flag, absl::StrCat("'", r, "' is not a number"));
        }
        a.options.ratios.push_back(d);
      }
    } else if (flag == "--raw-dtype") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      auto d = ParseDType(v);
      if (!d.ok()) return Fail(flag, d.status().message());
      a.options.raw_dtype = *d;
    } else if (flag == "--row-kind") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      if (v == "per_token") {
        a.options.row_kind = KvtcRowKind::kPerToken;
      } else if (v == "per_page") {
        a.options.row_kind = KvtcRowKind::kPerPage;
      } else {
        return Fail(flag,
                    absl::StrCat("'", v, "' is not per_token or per_page"));
      }
    } else if (flag == "--page-size" || flag == "--sink-tokens") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, v));
      if (n > (uint64_t{1} << 20)) return Fail(flag, "too large");
      (flag == "--page-size" ? a.options.page_size : a.options.sink_tokens) =
          static_cast<uint32_t>(n);
    } else if (flag == "--group-sizes") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      a.options.group_sizes.clear();
      for (absl::string_view g : absl::StrSplit(v, ',')) {
        KVH_ASSIGN_OR_RETURN(const uint64_t n, ParseU64(flag, g));
        a.options.group_sizes.push_back(n);
      }
    } else if (flag == "--max-rows") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      KVH_ASSIGN_OR_RETURN(a.options.max_rows, ParseU64(flag, v));
    } else if (flag == "--error-model") {
      KVH_ASSIGN_OR_RETURN(const std::string v, value());
      if (v != "measured" && v != "model") {
        return Fail(flag, absl::StrCat("'", v, "' is not measured or model"));
      }
      a.options.measured_errors = v == "measured";
    } else if (flag == "--no-undo-rope") {
      a.options.undo_rope = false;
    } else if (flag == "--merge-intx") {
      a.options.merge_intx = true;
    } else if (flag == "--quiet") {
      a.quiet = true;
    } else {
      return Fail(flag, "unknown option (see --help)");
    }
  }
  if (a.samples.empty()) return Fail("--samples", "is required");
  if (a.out.empty()) return Fail("--out", "is required");
  return a;
}

int Main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "kvharbor-calibrate: %s\n%s",
                 std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  if (!args->quiet) {
    args->options.progress = [](absl::string_view line) {
      std::fprintf(stderr, "%s\n", std::string(line).c_str());
    };
  }
  auto samples = ReadKvSamples(args->samples);
  if (!samples.ok()) {
    std::fprintf(stderr, "kvharbor-calibrate: %s\n",
                 std::string(samples.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr,
               "samples: %u tokens, %u layers x %u kv heads x %u dims, "
               "rope %s\n",
               static_cast<unsigned>(samples->tokens), samples->num_layers,
               samples->num_kv_heads, samples->head_dim,
               std::string(RopeStyleName(samples->rope_style)).c_str());
  auto outcomes = CalibrateKvtc(*samples, args->options);
  if (!outcomes.ok()) {
    std::fprintf(stderr, "kvharbor-calibrate: %s\n",
                 std::string(outcomes.status().message()).c_str());
    return 1;
  }
  for (const CalibrationOutcome& o : *outcomes) {
    const std::string path = absl::StrFormat("%s.%gx.kvtc", args->out, o.ratio);
    const absl::Status st = WriteKvtcCalibrationFile(o.calibration, path);
    if (!st.ok()) {
      std::fprintf(stderr, "kvharbor-calibrate: %s\n",
                   std::string(st.message()).c_str());
      return 1;
    }
    std::printf("%s  -> %s (fingerprint %016llx)\n", DescribeOutcome(o).c_str(),
                path.c_str(),
                static_cast<unsigned long long>(o.calibration.Fingerprint()));
  }
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) { return kvharbor::Main(argc, argv); }
