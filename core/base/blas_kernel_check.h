// Which kernels OpenBLAS runs on this CPU, and a warning when they are its
// generic ones on a CPU that has AVX2 or AVX-512.
//
// The OpenBLAS that Debian and Ubuntu ship is built with DYNAMIC_ARCH: it
// picks its kernels from the CPU model when the library loads, and a model
// newer than the library gets the generic "Prescott" (SSE3) kernels. That
// happens with OpenBLAS 0.3.21 (Debian 12) on an Emerald Rapids Xeon (family
// 6, model 207), where the sgemm of the CPU PCA and the CPU KVTC codec then
// runs about 3x slower (docs/kv_quality.md, "CPU calibration at 8B size").
// The library reads OPENBLAS_CORETYPE only while it loads, so a running
// process cannot fix this for itself: it can only say so, and kvharbord,
// kvharbor-calibrate and the CPU benches do.
//
// Stateless and thread-safe; nothing is allocated beyond the returned
// strings.
#ifndef KVHARBOR_CORE_BASE_BLAS_KERNEL_CHECK_H_
#define KVHARBOR_CORE_BASE_BLAS_KERNEL_CHECK_H_

#include <string>

namespace kvharbor {

struct BlasKernelFacts {
  // openblas_get_corename() (e.g. "SkylakeX", "Haswell", "Prescott"); empty
  // when the BLAS linked is not OpenBLAS.
  std::string library_core;
  bool cpu_avx2_fma = false;
  // AVX-512 F, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use.
  bool cpu_avx512 = false;
};

// The facts of this process: the linked BLAS and this CPU.
BlasKernelFacts DetectBlasKernels();

// The OPENBLAS_CORETYPE value that fits `facts`' CPU ("SkylakeX" with
// AVX-512, "Haswell" with AVX2 and FMA) when the library runs kernels
// without AVX2; empty when its kernels already use AVX2 or better, when the
// CPU has neither, or when the BLAS is not OpenBLAS.
std::string SuggestedBlasCoretype(const BlasKernelFacts& facts);

// One line saying what SuggestedBlasCoretype found and how to fix it
// (export OPENBLAS_CORETYPE=<core> before starting the process); empty when
// nothing needs fixing.
std::string BlasKernelWarning(const BlasKernelFacts& facts);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_BLAS_KERNEL_CHECK_H_
