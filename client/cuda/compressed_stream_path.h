// CompressedStreamPath, the "compressed_local" / "compressed_remote" fetch
// path (client/cuda/layout_transfer.h): call pages through the COMPRESSED
// gRPC stream (up to LayoutTransferOptions::compressed_streams streams at
// once, CompressedStreamRanges); a worker decodes each group of pages as it
// is complete, whichever stream it came on (client/cuda/group_decode.h: on
// the GPU with this path's decoders, one per calibration, else on the CPU
// into the pinned ring, then H2D) and scatters it, while the streams go
// on. A compressed page decodes whole (KVTC rows span every layer): a
// layout of some layers gets those layers of the decoded pages. Named
// "compressed_local" when the same-host paths are enabled for the daemon,
// "compressed_remote" otherwise. Serves cold pages with
// ClientOptions::gpu_decode; a forced COMPRESSED format
// (LayoutFetchOptions::format) takes it for every page (Stream).
//
// Memory: owns its GPU decoders, per (namespace, calibration, GPU), kept
// for later calls. Thread-safe (mu_ guards the decoders, which the decoding
// worker and the merger look up).
#ifndef KVHARBOR_CLIENT_CUDA_COMPRESSED_STREAM_PATH_H_
#define KVHARBOR_CLIENT_CUDA_COMPRESSED_STREAM_PATH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cuda/transfer_path.h"

namespace kvharbor {
namespace client {

class GpuPageDecoder;

class CompressedStreamPath final : public TransferPath {
 public:
  CompressedStreamPath();
  ~CompressedStreamPath() override;
  bool Accepts(const TransferPlan& plan, const PageRange& range) override;
  absl::StatusOr<bool> Fetch(TransferPlan& plan,
                             const PageRange& range) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Call pages [first, first + n), decoded on the GPU when `gpu`, else on
  // the CPU.
  absl::Status Stream(TransferPlan& plan, uint32_t first, uint32_t n, bool gpu)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The GPU decoder of calibration `fingerprint` of the call's namespace
  // on the call's GPU (made on first use).
  absl::StatusOr<GpuPageDecoder*> DecoderFor(const TransferPlan& plan,
                                             uint64_t fingerprint)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::map<std::tuple<std::string, uint64_t, int>,
           std::unique_ptr<GpuPageDecoder>>
      decoders_ ABSL_GUARDED_BY(mu_);
};

// The runs (first page, count) of a call's n pages fetched over separate
// streams: at most `streams`, each of whole groups of `group_pages` pages
// (the last run ends at n) and at least kMinGroupsPerStream groups, as even
// as that allows; one run when n is under twice that. On the H200 a
// 4K-token hit (8 groups) loaded 0.9x as fast over 4 streams of 2 groups as
// over one (docs/hit_paths.md): a stream must carry enough to pay for its
// call.
inline constexpr uint32_t kMinGroupsPerStream = 8;
std::vector<std::pair<uint32_t, uint32_t>> CompressedStreamRanges(
    uint32_t n, uint32_t group_pages, int streams);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_COMPRESSED_STREAM_PATH_H_
