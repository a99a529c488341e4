#include "core/base/blas_kernel_check.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Declared weak, not through cblas.h: the BLAS that CMake found may be
// another one (reference BLAS, FlexiBLAS), and then the symbol is null.
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace kvharbor {
namespace {

// OpenBLAS cores whose kernels use AVX2 or AVX-512 (the names its
// DYNAMIC_ARCH builds report; compared ignoring case).
constexpr absl::string_view kVectorCores[] = {"haswell", "zen", "skylakex",
                                              "cooperlake", "sapphirerapids"};

}  // namespace

BlasKernelFacts DetectBlasKernels() {
  BlasKernelFacts f;
  if (openblas_get_corename != nullptr) {
    const char* name = openblas_get_corename();
    if (name != nullptr) f.library_core = name;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.cpu_avx2_fma =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.cpu_avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

std::string SuggestedBlasCoretype(const BlasKernelFacts& facts) {
  if (facts.library_core.empty()) return "";
  for (absl::string_view v : kVectorCores) {
    if (absl::EqualsIgnoreCase(facts.library_core, v)) return "";
  }
  if (facts.cpu_avx512) return "SkylakeX";
  if (facts.cpu_avx2_fma) return "Haswell";
  return "";
}

std::string BlasKernelWarning(const BlasKernelFacts& facts) {
  const std::string fix = SuggestedBlasCoretype(facts);
  if (fix.empty()) return "";
  return absl::StrCat(
      "OpenBLAS runs its generic '", facts.library_core,
      "' kernels on this CPU, which has ",
      facts.cpu_avx512 ? "AVX-512" : "AVX2",
      " (it picks them for a CPU model it does not know, or when "
      "OPENBLAS_CORETYPE asks for them): the CPU KVTC codec and calibration "
      "run about 3x slower than they can. Start the process with "
      "OPENBLAS_CORETYPE=",
      fix, " in its environment to use its ", fix, " kernels.");
}

}  // namespace kvharbor
