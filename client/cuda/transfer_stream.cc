// The steps LayoutTransfer's paths share (client/cuda/transfer_call.h) and
// its two gRPC stream paths: RAW into a pinned ring, COMPRESSED decoded by a
// worker while the stream goes on.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda/gpu_decode.h"
#include "client/cuda/group_decode.h"
#include "client/cuda/transfer_call.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_dest.h"
#include "cuda/kernels/paged_kv_scatter.h"

namespace kvharbor {
namespace client {

absl::Status UploadTables(TransferCall& tc,
                          absl::Span<const uint64_t> page_ptrs) {
  absl::StatusOr<TransferDevice::Tables> t = tc.dev->UploadTables(
      tc.block_ids, tc.lc->layout.k, tc.lc->layout.v, page_ptrs);
  if (!t.ok()) return t.status();
  tc.tables = *t;
  return absl::OkStatus();
}

namespace {

// Enqueues on the compute stream the scatter `a` (its pages and shape set)
// of call pages [first, first + n) into the layout.
absl::Status LaunchScatter(TransferCall& tc, gpu::PagedKvScatterArgs a,
                           uint32_t first, uint32_t n) {
  a.num_pages = n;
  a.block_ids = tc.tables.blocks + first;
  a.k_bases = tc.tables.k;
  a.v_bases = tc.tables.v;
  a.layout_align = tc.layout_align;
  const cudaStream_t s = tc.dev->compute_stream();
  absl::StatusOr<size_t> begin = tc.dev->Begin(s);
  if (!begin.ok()) return begin.status();
  if (absl::Status st = gpu::LaunchPagedKvScatter(a, s); !st.ok()) return st;
  return tc.dev->End("scatter", *begin, s);
}

}  // namespace

absl::Status ScatterPages(TransferCall& tc, uint32_t first, uint32_t n,
                          const uint8_t* base, uint32_t ptr_align) {
  gpu::PagedKvScatterArgs a;
  a.shape = tc.shape;
  if (base != nullptr) {
    a.page_base = base;
    a.page_pitch = tc.page_bytes();
  } else {
    a.page_ptrs = tc.tables.pages;
    a.page_align = ptr_align;
  }
  return LaunchScatter(tc, a, first, n);
}

absl::Status ScatterLayerPages(TransferCall& tc, uint32_t first, uint32_t n,
                               const uint8_t* base) {
  gpu::PagedKvScatterArgs a;
  a.shape = tc.layer_shape;
  a.page_base = base;
  a.page_pitch = tc.layer_page_bytes();
  return LaunchScatter(tc, a, first, n);
}

void CopyPageLayers(const TransferCall& tc, const uint8_t* page, uint8_t* dst) {
  const PageRuns runs = LayerRuns(tc.lc->geometry, tc.layers);
  for (int k = 0; k < runs.count; ++k) {
    std::memcpy(dst, page + runs.offset[k], runs.bytes[k]);
    dst += runs.bytes[k];
  }
}

void AddPath(TransferCall& tc, const std::string& path) {
  std::string& p = tc.result->path;
  p = p.empty() ? path : absl::StrCat(p, "+", path);
}

void NoteFallback(TransferCall& tc, const std::string& path,
                  const absl::Status& why) {
  tc.result->fallbacks.push_back(absl::StrCat(
      path, ": ", absl::StatusCodeToString(why.code()), ": ", why.message()));
}

absl::Status EnsureStaging(TransferCall& tc, bool pinned) {
  const uint64_t pb = tc.page_bytes();
  const uint32_t pages =
      static_cast<uint32_t>(std::max<uint64_t>(1, tc.slot_bytes / pb));
  return tc.dev->EnsureRing(pb, pages, tc.slots, pinned);
}

absl::Status EnsureLayerStaging(TransferCall& tc, bool pinned) {
  const uint64_t lpb = tc.layer_page_bytes();
  const uint32_t pages =
      static_cast<uint32_t>(std::max<uint64_t>(1, tc.slot_bytes / lpb));
  return tc.dev->EnsureRing(lpb, pages, tc.slots, pinned);
}

absl::Status DispatchPinned(TransferCall& tc, uint64_t chunk, uint32_t first,
                            uint32_t n) {
  TransferDevice& d = *tc.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  const cudaStream_t copy = d.copy_stream();
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.consumed, 0));
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.device, slot.pinned,
                                           uint64_t{n} * tc.layer_page_bytes(),
                                           cudaMemcpyHostToDevice, copy));
  if (absl::Status s = d.End("h2d", *begin, copy); !s.ok()) return s;
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.drained, copy));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, copy));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(d.compute_stream(), slot.copied, 0));
  if (absl::Status s = ScatterLayerPages(tc, first, n, slot.device); !s.ok()) {
    return s;
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, d.compute_stream()));
  return absl::OkStatus();
}

namespace {

absl::Status Protocol(const std::string& what) {
  return absl::InternalError(absl::StrCat("fetch stream: ", what));
}

}  // namespace

absl::Status RawStream(TransferCall& tc, uint32_t first, uint32_t n) {
  if (absl::Status s = EnsureLayerStaging(tc, /*pinned=*/true); !s.ok()) {
    return s;
  }
  if (absl::Status s = UploadTables(tc); !s.ok()) return s;
  const uint64_t pb = tc.layer_page_bytes();
  const uint32_t sp = tc.dev->slot_pages();
  struct Filling {
    int64_t chunk = -1;
    uint32_t done = 0, size = 0;
  };
  std::vector<Filling> filling(tc.slots);
  auto state = [&](uint32_t index) -> Filling& {
    return filling[(index / sp) % filling.size()];
  };
  const PageDestination destination =
      [&](uint32_t index, uint64_t page_bytes) -> absl::StatusOr<uint8_t*> {
    if (page_bytes != pb || index >= n) {
      return Protocol(absl::StrFormat(
          "page %u of %u bytes; the call asked for %u pages of %u bytes", index,
          page_bytes, n, pb));
    }
    const int64_t chunk = index / sp;
    Filling& f = state(index);
    TransferDevice::Slot& slot = tc.dev->slot(chunk);
    if (f.chunk != chunk) {
      if (f.chunk > chunk || (f.chunk >= 0 && f.done != f.size)) {
        return Protocol(absl::StrFormat(
            "page %u arrived while chunk %d was incomplete", index, f.chunk));
      }
      // The H2D of the chunk that used this pinned slot before.
      KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
      f = Filling{
          chunk, 0,
          std::min<uint32_t>(sp, n - static_cast<uint32_t>(chunk) * sp)};
    }
    return slot.pinned + uint64_t{index % sp} * pb;
  };
  const PageDone done = [&](uint32_t index) -> absl::Status {
    Filling& f = state(index);
    if (++f.done < f.size) return absl::OkStatus();
    return DispatchPinned(tc, f.chunk,
                          first + static_cast<uint32_t>(f.chunk) * sp, f.size);
  };
  tc.clock->Lap("prepare");
  FetchSource source =
      FetchSource::FromLease(tc.lease_id, tc.start_page + first, n);
  if (tc.layer_subset()) source = source.Layers(tc.layers.begin, tc.layers.end);
  absl::StatusOr<FetchResult> r =
      tc.client->FetchStreaming(tc.ns, source, destination, done, tc.call);
  if (!r.ok()) return r.status();
  if (r->num_pages != n) {
    return Protocol(absl::StrFormat("%u pages arrived, %u were asked for",
                                    r->num_pages, n));
  }
  tc.clock->Lap("stream");
  AddPath(tc, "raw_remote");
  tc.result->bytes_moved += uint64_t{n} * pb;
  return absl::OkStatus();
}

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
absl::Status StreamRun(TransferCall& tc, uint32_t first, uint32_t begin,
                       uint32_t count, uint32_t group_pages, GroupQueue& queue,
                       std::atomic<uint64_t>& wire) {
  Group current;
  const CompressedPageSink sink = [&](uint32_t index,
                                      CompressedPage page) -> absl::Status {
    // Another run, or the worker, failed.
    if (absl::Status e = queue.error(); !e.ok()) return e;
    if (index >= count) {
      return Protocol(
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
  absl::StatusOr<uint32_t> got = tc.client->FetchCompressedStreaming(
      tc.ns,
      FetchSource::FromLease(tc.lease_id, tc.start_page + first + begin, count),
      sink, tc.call);
  if (!got.ok()) return got.status();
  if (*got != count) {
    return Protocol(
        absl::StrFormat("%u pages arrived, %u were asked for", *got, count));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CompressedStream(TransferCall& tc, uint32_t first, uint32_t n,
                              bool gpu, const DecoderLookup& decoders,
                              const std::string& path) {
  if (absl::Status s = EnsureStaging(tc, /*pinned=*/!gpu); !s.ok()) return s;
  if (absl::Status s = UploadTables(tc); !s.ok()) return s;
  const uint32_t sp = tc.dev->slot_pages();
  tc.clock->Lap("prepare");
  GroupQueue queue(2, tc.h2d_batch_bytes);
  std::thread worker([&] {
    // CUDA's current device is per thread.
    if (cudaError_t e = cudaSetDevice(tc.dev->device()); e != cudaSuccess) {
      queue.Fail(gpu::CudaError(e, "cudaSetDevice", __FILE__, __LINE__));
      return;
    }
    absl::Status s = DecodeQueuedGroups(tc, n, gpu, decoders, queue);
    if (!s.ok()) queue.Fail(std::move(s));
  });
  // One stream per run, the first on this thread. A run that fails fails
  // the queue, which ends the others at their next page.
  const std::vector<std::pair<uint32_t, uint32_t>> runs =
      CompressedStreamRanges(n, sp, tc.compressed_streams);
  std::atomic<uint64_t> wire{0};
  auto run = [&](size_t r) {
    absl::Status s =
        StreamRun(tc, first, runs[r].first, runs[r].second, sp, queue, wire);
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
  tc.clock->Lap("stream");
  AddPath(tc, path);
  tc.result->bytes_moved += wire.load();
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
