# kvharbor_cuda_host_check: the host C++ of cuda/, client/cuda/ and capi/
# (every .cc; capi/ as its CUDA build, KVHARBOR_CAPI_CUDA=1) compiled, not
# linked, by the C++ compiler against CUDA's headers alone
# (KVHARBOR_CUDA_INCLUDE_DIR), so that a build without nvcc checks them.
# scripts/test.sh's thread-safety stage builds it with clang++-14
# -Wthread-safety -Werror (KVHARBOR_THREAD_SAFETY) with CUDA off: a CUDA
# build compiles these files with GCC, which ignores ABSL_GUARDED_BY, and
# the .cu kernels (nvcc's) hold no locks.
set(KVHARBOR_CUDA_INCLUDE_DIR /usr/local/cuda/include CACHE PATH
    "CUDA headers for kvharbor_cuda_host_check (KVHARBOR_CUDA_HOST_CHECK)")
if(NOT EXISTS ${KVHARBOR_CUDA_INCLUDE_DIR}/cuda_runtime_api.h)
  message(FATAL_ERROR "KVHARBOR_CUDA_HOST_CHECK: no cuda_runtime_api.h in "
                      "${KVHARBOR_CUDA_INCLUDE_DIR} (KVHARBOR_CUDA_INCLUDE_DIR)")
endif()
file(GLOB KVHARBOR_CUDA_HOST_SRCS CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/cuda/*/*.cc
  ${PROJECT_SOURCE_DIR}/client/cuda/*.cc
  ${PROJECT_SOURCE_DIR}/capi/*.cc)
add_library(kvharbor_cuda_host_check OBJECT ${KVHARBOR_CUDA_HOST_SRCS})
target_include_directories(kvharbor_cuda_host_check PRIVATE
  ${PROJECT_SOURCE_DIR} ${KVHARBOR_CUDA_INCLUDE_DIR})
# Usage requirements only (an object library links nothing).
target_link_libraries(kvharbor_cuda_host_check PRIVATE kvharbor_client
  kvharbor::core absl::status absl::statusor absl::strings absl::str_format
  absl::span absl::synchronization absl::time)
target_compile_definitions(kvharbor_cuda_host_check PRIVATE
  KVHARBOR_CAPI_CUDA=1 KVHARBOR_C_VERSION="${PROJECT_VERSION}")
kvharbor_warnings(kvharbor_cuda_host_check)
