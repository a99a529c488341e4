#include "core/base/blas_kernel_check.h"

#include <catch2/catch.hpp>
#include <string>

namespace kvharbor {
namespace {

BlasKernelFacts Facts(std::string core, bool avx2, bool avx512) {
  BlasKernelFacts f;
  f.library_core = std::move(core);
  f.cpu_avx2_fma = avx2;
  f.cpu_avx512 = avx512;
  return f;
}

TEST_CASE("A generic OpenBLAS core on an AVX CPU is named with its fix",
          "[base]") {
  // OpenBLAS 0.3.21 on an Emerald Rapids Xeon: what the H200 host ran.
  const BlasKernelFacts emr = Facts("Prescott", true, true);
  CHECK(SuggestedBlasCoretype(emr) == "SkylakeX");
  const std::string w = BlasKernelWarning(emr);
  CHECK(w.find("'Prescott'") != std::string::npos);
  CHECK(w.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK(SuggestedBlasCoretype(Facts("Core2", true, false)) == "Haswell");
  CHECK(SuggestedBlasCoretype(Facts("Sandybridge", true, false)) == "Haswell");
}

TEST_CASE("Vector OpenBLAS cores, other BLAS and old CPUs get no warning",
          "[base]") {
  for (const char* core :
       {"Haswell", "Zen", "SkylakeX", "COOPERLAKE", "SapphireRapids"}) {
    CHECK(SuggestedBlasCoretype(Facts(core, true, true)).empty());
  }
  CHECK(SuggestedBlasCoretype(Facts("", true, true)).empty());
  CHECK(SuggestedBlasCoretype(Facts("Prescott", false, false)).empty());
  CHECK(BlasKernelWarning(Facts("Prescott", false, false)).empty());
}

TEST_CASE("DetectBlasKernels describes this process", "[base]") {
  const BlasKernelFacts f = DetectBlasKernels();
  // The tests link OpenBLAS (README: the BLAS dependency).
  CHECK(!f.library_core.empty());
  if (f.cpu_avx512) CHECK(f.cpu_avx2_fma);
  // Whatever it says must be consistent with the advice.
  CHECK(BlasKernelWarning(f).empty() == SuggestedBlasCoretype(f).empty());
}

}  // namespace
}  // namespace kvharbor
