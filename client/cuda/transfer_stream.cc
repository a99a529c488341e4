// The steps LayoutTransfer's paths share (client/cuda/transfer_call.h) and
// its two gRPC stream paths: RAW into a pinned ring, COMPRESSED decoded by a
// worker while the stream goes on.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda/gpu_decode.h"
#include "client/cuda/transfer_call.h"
#include "cuda/cuda_check.h"
#include "cuda/paged_kv_dest.h"
#include "cuda/paged_kv_scatter.h"

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

namespace {

// Enqueues the H2D of the pinned slot of `chunk` (`n` layer pages) into its
// device slot and the scatter of it as call pages [first, first + n).
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

namespace {

// A group of compressed pages and where they go.
struct Group {
  uint64_t index = 0;  // slot of the staging ring (the worker's count)
  uint32_t first = 0;  // call page of pages[0]
  std::vector<CompressedPage> pages;
};

// A group whose GPU decode is enqueued: the decoders' tickets to finish
// before its slot is scattered.
struct Enqueued {
  Group group;
  std::vector<std::pair<GpuPageDecoder*, uint64_t>> tickets;
  double seconds = 0;        // host time spent enqueueing (the "decode" stage)
  bool into_layout = false;  // decoded into the layout: nothing to scatter
};

// Whether every page of `pages` decodes on the GPU of its calibration's
// decoder, so the group can be decoded straight into the layout.
bool AllOnGpu(const std::vector<CompressedPage>& pages,
              const DecoderLookup& decoders) {
  for (const CompressedPage& p : pages) {
    absl::StatusOr<GpuPageDecoder*> dec = decoders(p.calibration_fingerprint);
    if (!dec.ok() || !(*dec)->DecodesOnGpu(p)) return false;
  }
  return true;
}

// Enqueues the GPU decode of a group (runs of one calibration to that
// calibration's decoder): straight into the layout when every page decodes
// on the GPU and tc.decode_into_layout, else into its device slot.
absl::Status EnqueueGroup(TransferCall& tc, const DecoderLookup& decoders,
                          Enqueued& e) {
  TransferDevice::Slot& slot = tc.dev->slot(e.group.index);
  const uint64_t pb = tc.page_bytes();
  const std::vector<CompressedPage>& pages = e.group.pages;
  const uint32_t n = static_cast<uint32_t>(pages.size());
  // The scatter that last read this device slot.
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.consumed));
  const auto t0 = std::chrono::steady_clock::now();
  e.into_layout = tc.decode_into_layout && AllOnGpu(pages, decoders);
  for (uint32_t a = 0; a < n;) {
    uint32_t b = a + 1;
    const uint64_t fp = pages[a].calibration_fingerprint;
    while (b < n && pages[b].calibration_fingerprint == fp) ++b;
    absl::StatusOr<GpuPageDecoder*> dec = decoders(fp);
    if (!dec.ok()) return dec.status();
    const auto run = absl::MakeConstSpan(pages).subspan(a, b - a);
    absl::StatusOr<uint64_t> t;
    if (e.into_layout) {
      t = (*dec)->EnqueueToLayout(
          run,
          gpu::MakePagedKvDest(tc.shape, tc.tables.blocks + e.group.first + a,
                               tc.tables.k, tc.tables.v, tc.layout_align));
    } else {
      std::vector<uint8_t*> dst(b - a);
      for (uint32_t i = a; i < b; ++i) dst[i - a] = slot.device + i * pb;
      t = (*dec)->EnqueueToDevice(run, dst);
    }
    if (!t.ok()) {
      (*dec)->FinishToDevice(GpuPageDecoder::kAllTickets).IgnoreError();
      return t.status();
    }
    e.tickets.emplace_back(*dec, *t);
    a = b;
  }
  e.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return absl::OkStatus();
}

// Waits for an enqueued group's decode and scatters it (unless it was
// decoded into the layout).
absl::Status FinishGroup(TransferCall& tc, const Enqueued& e) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status first;
  for (const auto& [dec, ticket] : e.tickets) {
    absl::Status s = dec->FinishToDevice(ticket);
    if (first.ok()) first = std::move(s);
  }
  tc.clock->Add("decode", e.seconds + std::chrono::duration<double>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count());
  if (!first.ok() || e.into_layout) return first;
  TransferDevice& d = *tc.dev;
  TransferDevice::Slot& slot = d.slot(e.group.index);
  const uint32_t n = static_cast<uint32_t>(e.group.pages.size());
  if (absl::Status s = ScatterPages(tc, e.group.first, n, slot.device);
      !s.ok()) {
    return s;
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, d.compute_stream()));
  return absl::OkStatus();
}

// Decodes a group on the CPU into its pinned slot, then H2D and scatter.
absl::Status DecodeGroupOnCpu(TransferCall& tc, const Group& g) {
  TransferDevice::Slot& slot = tc.dev->slot(g.index);
  const uint64_t pb = tc.page_bytes();
  const uint32_t n = static_cast<uint32_t>(g.pages.size());
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.consumed));
  const auto t0 = std::chrono::steady_clock::now();
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
  for (uint32_t i = 0; i < n; ++i) {
    absl::StatusOr<std::vector<uint8_t>> raw =
        tc.client->DecodePage(tc.ns, g.pages[i], tc.call);
    if (!raw.ok()) return raw.status();
    if (raw->size() != pb) {
      return absl::InternalError(
          absl::StrFormat("page %u decodes to %u bytes, not %u",
                          g.pages[i].handle, raw->size(), pb));
    }
    CopyPageLayers(tc, raw->data(), slot.pinned + i * tc.layer_page_bytes());
  }
  tc.clock->Add("decode", std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
  return DispatchPinned(tc, g.index, g.first, n);
}

// The worker's loop over the groups: on the GPU, group k+1's decode is
// enqueued before group k is finished and scattered, so that two batches
// are in flight (with a ring of at least two slots: group k's slot must
// not be group k+1's).
template <typename PopFn>
absl::Status DecodeGroups(TransferCall& tc, bool gpu,
                          const DecoderLookup& decoders, PopFn&& pop) {
  Group g;
  // Groups come in whatever order the call's streams deliver them:
  // consecutive groups take consecutive slots of the ring, so the two in
  // flight never share one.
  uint64_t next_slot = 0;
  if (!gpu) {
    while (pop(&g)) {
      g.index = next_slot++;
      if (absl::Status s = DecodeGroupOnCpu(tc, g); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (tc.decode_into_layout) {
    // A decode into the layout runs on its decoder's streams, not on the
    // compute stream: what the compute stream was given first (the tables'
    // upload, the wait for the caller's stream) must be done before.
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(tc.dev->compute_stream()));
  }
  const bool overlap = tc.slots >= 2;
  std::optional<Enqueued> prev;
  auto finish_prev = [&]() -> absl::Status {
    if (!prev.has_value()) return absl::OkStatus();
    absl::Status s = FinishGroup(tc, *prev);
    prev.reset();
    return s;
  };
  while (pop(&g)) {
    Enqueued e;
    e.group = std::move(g);
    e.group.index = next_slot++;
    absl::Status s = EnqueueGroup(tc, decoders, e);
    if (!s.ok()) {
      finish_prev().IgnoreError();
      return s;
    }
    if (absl::Status f = finish_prev(); !f.ok()) {
      // The decoders must not keep batches pending for the next call.
      for (const auto& [dec, ticket] : e.tickets) {
        dec->FinishToDevice(ticket).IgnoreError();
      }
      return f;
    }
    prev = std::move(e);
    if (!overlap) {
      if (absl::Status f = finish_prev(); !f.ok()) return f;
    }
  }
  return finish_prev();
}

// Hands groups from the stream's thread to the decoding worker; at most
// `depth` wait, so memory stays bounded when decoding is the slower side.
class GroupQueue {
 public:
  explicit GroupQueue(size_t depth) : depth_(depth) {}
  // False once the worker failed (its error ends the stream).
  bool Push(Group g) {
    std::unique_lock<std::mutex> l(mu_);
    room_.wait(l, [&] { return q_.size() < depth_ || !error_.ok(); });
    if (!error_.ok()) return false;
    q_.push_back(std::move(g));
    ready_.notify_one();
    return true;
  }
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    ready_.notify_one();
  }
  // The next group, or false when closed and empty.
  bool Pop(Group* g) {
    std::unique_lock<std::mutex> l(mu_);
    ready_.wait(l, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return false;
    *g = std::move(q_.front());
    q_.pop_front();
    room_.notify_one();
    return true;
  }
  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (error_.ok()) error_ = std::move(s);
    q_.clear();
    room_.notify_all();
  }
  absl::Status error() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

 private:
  const size_t depth_;
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::deque<Group> q_;
  bool closed_ = false;
  absl::Status error_;
};

}  // namespace

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
  GroupQueue queue(2);
  std::thread worker([&] {
    // CUDA's current device is per thread.
    if (cudaError_t e = cudaSetDevice(tc.dev->device()); e != cudaSuccess) {
      queue.Fail(gpu::CudaError(e, "cudaSetDevice", __FILE__, __LINE__));
      return;
    }
    absl::Status s =
        DecodeGroups(tc, gpu, decoders, [&](Group* g) { return queue.Pop(g); });
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
