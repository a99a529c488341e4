// kvharbor_ipc_peer: the second process of tests/cuda/device_ipc_e2e.cc
// (GPU machine only). A client on the same machine as the daemon: it asks
// for the device handles of a lease, maps the daemon's arena with CUDA IPC
// (client/cuda/device_ipc.h), copies the leased pages device-to-device into its
// own cudaMalloc buffers, brings them to the host and compares them with the
// bytes the test inserted.
//
//   kvharbor_ipc_peer ADDRESS NAMESPACE LEASE_ID EXPECTED_FILE
//
// Exit status 0 when every page is byte-exact (and the arena was mapped
// once for several copies); 1 with a message on stderr otherwise.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cuda/device_ipc.h"
#include "kvharbor/client.h"

namespace kvharbor {
namespace {

absl::Status Cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

#define PEER_RETURN_IF_ERROR(expr)     \
  do {                                 \
    absl::Status peer_s_ = (expr);     \
    if (!peer_s_.ok()) return peer_s_; \
  } while (0)

// Copies the pages with `copy` (which enqueues on `stream` into `dev`),
// brings `dev` back and compares it with `want`.
template <typename Copy>
absl::Status CopyAndCompare(const std::string& want, uint8_t* dev,
                            cudaStream_t stream, const char* what, Copy copy) {
  PEER_RETURN_IF_ERROR(Cuda(cudaMemset(dev, 0, want.size()), "cudaMemset"));
  PEER_RETURN_IF_ERROR(copy());
  PEER_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "sync"));
  std::string got(want.size(), '\0');
  PEER_RETURN_IF_ERROR(Cuda(
      cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost), "D2H"));
  if (got != want) {
    size_t at = 0;
    while (got[at] == want[at]) ++at;
    return absl::DataLossError(
        absl::StrCat(what, ": first differing byte at ", at));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& address, const std::string& ns,
                 uint64_t lease, const std::string& expected_path) {
  std::ifstream in(expected_path, std::ios::binary);
  const std::string want((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  ClientOptions options;
  options.address = address;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
  PEER_RETURN_IF_ERROR(c.status());
  absl::StatusOr<client::DeviceHandles> h = (*c)->GetDeviceHandles(ns, lease);
  PEER_RETURN_IF_ERROR(h.status());
  uint64_t total = 0;
  for (const client::DevicePage& p : h->pages) total += p.bytes;
  if (total != want.size()) {
    return absl::InternalError(absl::StrCat(
        "the lease has ", total, " bytes, the test inserted ", want.size()));
  }
  client::DeviceArenaMapper& mapper = client::DeviceArenaMapper::Process();
  absl::StatusOr<client::DeviceArenaMapper::Mapping> m = mapper.Map(*h);
  PEER_RETURN_IF_ERROR(m.status());
  PEER_RETURN_IF_ERROR(Cuda(cudaSetDevice(m->device), "cudaSetDevice"));
  cudaStream_t stream;
  PEER_RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream), "cudaStreamCreate"));
  void* dev = nullptr;
  PEER_RETURN_IF_ERROR(Cuda(cudaMalloc(&dev, want.size()), "cudaMalloc"));
  uint8_t* d = static_cast<uint8_t*>(dev);
  // Into one buffer, back to back.
  PEER_RETURN_IF_ERROR(CopyAndCompare(want, d, stream, "contiguous", [&] {
    return mapper.CopyPages(*h, d, want.size(), stream);
  }));
  // Page by page into scattered destinations (reverse order in memory),
  // with a second GetDeviceHandles: same handle, so no second open.
  absl::StatusOr<client::DeviceHandles> h2 = (*c)->GetDeviceHandles(ns, lease);
  PEER_RETURN_IF_ERROR(h2.status());
  std::vector<void*> dsts(h2->pages.size());
  uint64_t at = want.size();
  for (size_t i = 0; i < dsts.size(); ++i) {
    at -= h2->pages[i].bytes;
    dsts[i] = d + at;
  }
  std::string reversed;
  at = 0;
  std::vector<std::string> pages;
  for (const client::DevicePage& p : h2->pages) {
    pages.push_back(want.substr(at, p.bytes));
    at += p.bytes;
  }
  for (size_t i = pages.size(); i-- > 0;) reversed += pages[i];
  PEER_RETURN_IF_ERROR(CopyAndCompare(reversed, d, stream, "scattered", [&] {
    return mapper.CopyPages(*h2, dsts, stream);
  }));
  if (mapper.mapped() != 1) {
    return absl::InternalError(
        absl::StrCat("the arena is mapped ", mapper.mapped(), " times"));
  }
  // A destination list that does not fit is refused, not copied.
  absl::Status short_dst = mapper.CopyPages(*h2, d, want.size() - 1, stream);
  if (short_dst.code() != absl::StatusCode::kInvalidArgument) {
    return absl::InternalError("a short dst was not refused: " +
                               short_dst.ToString());
  }
  PEER_RETURN_IF_ERROR(Cuda(cudaFree(dev), "cudaFree"));
  PEER_RETURN_IF_ERROR(Cuda(cudaStreamDestroy(stream), "cudaStreamDestroy"));
  PEER_RETURN_IF_ERROR(mapper.UnmapAll());
  std::printf(
      "ipc peer: %zu pages (%zu bytes) copied device-to-device "
      "byte-exact from GPU %d, arena mapped once\n",
      h->pages.size(), want.size(), m->device);
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  uint64_t lease = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[3], &lease)) {
    std::fprintf(stderr, "usage: %s ADDRESS NAMESPACE LEASE_ID EXPECTED_FILE\n",
                 argv[0]);
    return 2;
  }
  const absl::Status s = kvharbor::Run(argv[1], argv[2], lease, argv[4]);
  if (!s.ok()) {
    std::fprintf(stderr, "ipc peer: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
