// The "compressed_local" / "compressed_remote" fetch path
// (client/cuda/compressed_stream_path.h): the call's streams push groups of
// compressed pages to a GroupQueue that a worker decodes
// (client/cuda/group_decode.h).
#include "client/cuda/compressed_stream_path.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cuda/gpu_decode.h"
#include "client/cuda/group_decode.h"
#include "client/cuda/raw_stream_path.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

std::vector<std::pair<uint32_t, uint32_t>> CompressedStreamRanges(
    uint32_t n, uint32_t group_pages, int streams) {
  const uint64_t gp = std::max<uint32_t>(group_pages, 1);
  const uint64_t groups = (uint64_t{n} + gp - 1) / gp;
  const uint64_t runs =
      std::clamp<uint64_t>(groups / kMinGroupsPerStream, 1,
                           static_cast<uint64_t>(std::max(streams, 1)));
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint64_t begin = 0;
  for (uint64_t r = 0; r < runs; ++r) {
    // Run r takes groups [groups * r / runs, groups * (r + 1) / runs).
    const uint64_t end = std::min<uint64_t>(n, groups * (r + 1) / runs * gp);
    out.emplace_back(static_cast<uint32_t>(begin),
                     static_cast<uint32_t>(end - begin));
    begin = end;
  }
  return out;
}

namespace {

// Streams call pages [first + begin, + count) (one of the call's runs)
// and pushes them to `queue` in groups of `group_pages`; `wire` counts
// their bytes. Runs on its own thread, beside the call's other runs.
absl::Status StreamRun(TransferPlan& plan, uint32_t first, uint32_t begin,
                       uint32_t count, uint32_t group_pages, GroupQueue& queue,
                       std::atomic<uint64_t>& wire) {
  Group current;
  const CompressedPageSink sink = [&](uint32_t index,
                                      CompressedPage page) -> absl::Status {
    // Another run, or the worker, failed.
    if (absl::Status e = queue.error(); !e.ok()) return e;
    if (index >= count) {
      return FetchStreamError(
          absl::StrFormat("page %u of a %u-page fetch", index, count));
    }
    wire.fetch_add(page.buffer.size(), std::memory_order_relaxed);
    if (current.pages.empty()) current.first = first + begin + index;
    current.pages.push_back(std::move(page));
    if (current.pages.size() == group_pages || index + 1 == count) {
      if (!queue.Push(std::move(current))) return queue.error();
      current = Group();
    }
    return absl::OkStatus();
  };
  absl::StatusOr<uint32_t> got = plan.what.client->FetchCompressedStreaming(
      plan.what.ns,
      FetchSource::FromLease(plan.what.lease_id,
                             plan.what.start_page + first + begin, count),
      sink, plan.what.call);
  if (!got.ok()) return got.status();
  if (*got != count) {
    return FetchStreamError(
        absl::StrFormat("%u pages arrived, %u were asked for", *got, count));
  }
  return absl::OkStatus();
}

}  // namespace

CompressedStreamPath::CompressedStreamPath() = default;
CompressedStreamPath::~CompressedStreamPath() = default;

absl::StatusOr<GpuPageDecoder*> CompressedStreamPath::DecoderFor(
    const TransferPlan& plan, uint64_t fingerprint) {
  absl::MutexLock l(&mu_);
  const LeasePages& what = plan.what;
  TransferDevice& dev = *plan.where.dev;
  const auto key = std::make_tuple(what.ns, fingerprint, dev.device());
  auto it = decoders_.find(key);
  if (it != decoders_.end()) return it->second.get();
  absl::StatusOr<Calibration> cal =
      what.client->GetCalibration(what.ns, fingerprint, what.call);
  if (!cal.ok()) return cal.status();
  GpuDecodeOptions o;
  o.device = dev.device();
  o.batch_pages = dev.slot_pages();
  o.gemm = what.client->options().gpu_decode_gemm;
  absl::StatusOr<std::unique_ptr<GpuPageDecoder>> d =
      GpuPageDecoder::Create(*cal, plan.where.lc->geometry, o);
  if (!d.ok()) return d.status();
  GpuPageDecoder* out = d->get();
  decoders_[key] = *std::move(d);
  return out;
}

bool CompressedStreamPath::Accepts(const TransferPlan& plan,
                                   const PageRange& range) {
  return range.cold && plan.what.client->options().gpu_decode;
}

absl::StatusOr<bool> CompressedStreamPath::Fetch(TransferPlan& plan,
                                                 const PageRange& range) {
  absl::Status s = Stream(plan, range.first, range.n, /*gpu=*/true);
  if (!s.ok()) return s;
  return true;
}

absl::Status CompressedStreamPath::Stream(TransferPlan& plan, uint32_t first,
                                          uint32_t n, bool gpu) {
  const Client& client = *plan.what.client;
  const std::string path =
      client.device_ipc_allowed() || client.host_fetch_allowed()
          ? "compressed_local"
          : "compressed_remote";
  const DecoderLookup decoders = [this, &plan](uint64_t fp) {
    return DecoderFor(plan, fp);
  };
  if (absl::Status s =
          EnsureStaging(plan.where, *plan.options, /*pinned=*/!gpu);
      !s.ok())
    return s;
  if (absl::Status s = UploadTables(plan.where); !s.ok()) return s;
  const uint32_t sp = plan.where.dev->slot_pages();
  plan.clock->Lap("prepare");
  GroupQueue queue(2, plan.options->h2d_batch_bytes);
  std::thread worker([&] {
    // CUDA's current device is per thread.
    if (cudaError_t e = cudaSetDevice(plan.where.dev->device());
        e != cudaSuccess) {
      queue.Fail(gpu::CudaError(e, "cudaSetDevice", __FILE__, __LINE__));
      return;
    }
    absl::Status s = DecodeQueuedGroups(plan, n, gpu, decoders, queue);
    if (!s.ok()) queue.Fail(std::move(s));
  });
  // One stream per run, the first on this thread. A run that fails fails
  // the queue, which ends the others at their next page.
  const std::vector<std::pair<uint32_t, uint32_t>> runs =
      CompressedStreamRanges(n, sp, plan.options->compressed_streams);
  std::atomic<uint64_t> wire{0};
  auto run = [&](size_t r) {
    absl::Status s =
        StreamRun(plan, first, runs[r].first, runs[r].second, sp, queue, wire);
    if (!s.ok()) queue.Fail(std::move(s));
  };
  std::vector<std::thread> others;
  for (size_t r = 1; r < runs.size(); ++r) others.emplace_back(run, r);
  run(0);
  for (std::thread& t : others) t.join();
  queue.Close();
  worker.join();
  // The first error, the worker's or a run's: each fails the queue.
  if (absl::Status s = queue.error(); !s.ok()) return s;
  plan.clock->Lap("stream");
  AddPath(*plan.result, path);
  plan.result->bytes_moved += wire.load();
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
