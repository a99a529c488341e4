#include "client/cuda/group_decode.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_format.h"
#include "client/cuda/gpu_decode.h"
#include "client/cuda/transfer_device.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_dest.h"

namespace kvharbor {
namespace client {

uint64_t GroupBytes(const Group& g) {
  uint64_t bytes = 0;
  for (const CompressedPage& p : g.pages) bytes += p.buffer.size();
  return bytes;
}

bool GroupQueue::Push(Group g) {
  const uint64_t b = GroupBytes(g);
  absl::MutexLock l(&mu_);
  // Room: under `depth_` groups, or the bytes still under `bytes_`.
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return q_.size() < depth_ || queued_ + b <= bytes_ || !error_.ok();
  };
  mu_.Await(absl::Condition(&room));
  if (!error_.ok()) return false;
  queued_ += b;
  q_.push_back(std::move(g));
  return true;
}

void GroupQueue::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
}

bool GroupQueue::Pop(Group* g) {
  absl::MutexLock l(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !q_.empty() || closed_ || !error_.ok();
  };
  mu_.Await(absl::Condition(&ready));
  if (q_.empty() || !error_.ok()) return false;
  *g = std::move(q_.front());
  q_.pop_front();
  queued_ -= GroupBytes(*g);
  return true;
}

void GroupQueue::Fail(absl::Status s) {
  absl::MutexLock l(&mu_);
  if (error_.ok()) error_ = std::move(s);
  q_.clear();
  queued_ = 0;
}

absl::Status GroupQueue::error() {
  absl::MutexLock l(&mu_);
  return error_;
}

namespace {

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
// on the GPU and plan.options->decode_into_layout, else into its device slot.
absl::Status EnqueueGroup(TransferPlan& plan, const DecoderLookup& decoders,
                          Enqueued& e) {
  TransferDevice::Slot& slot = plan.where.dev->slot(e.group.index);
  const uint64_t pb = plan.where.page_bytes();
  const std::vector<CompressedPage>& pages = e.group.pages;
  const uint32_t n = static_cast<uint32_t>(pages.size());
  // The scatter that last read this device slot.
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.consumed));
  const auto t0 = std::chrono::steady_clock::now();
  e.into_layout = plan.options->decode_into_layout && AllOnGpu(pages, decoders);
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
          gpu::MakePagedKvDest(plan.where.shape,
                               plan.where.tables.blocks + e.group.first + a,
                               plan.where.tables.k, plan.where.tables.v,
                               plan.where.layout_align));
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
absl::Status FinishGroup(TransferPlan& plan, const Enqueued& e) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status first;
  for (const auto& [dec, ticket] : e.tickets) {
    absl::Status s = dec->FinishToDevice(ticket);
    if (first.ok()) first = std::move(s);
  }
  plan.clock->Add("decode",
                  e.seconds + std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count());
  if (!first.ok() || e.into_layout) return first;
  TransferDevice& d = *plan.where.dev;
  TransferDevice::Slot& slot = d.slot(e.group.index);
  const uint32_t n = static_cast<uint32_t>(e.group.pages.size());
  if (absl::Status s = ScatterPages(plan.where, e.group.first, n, slot.device);
      !s.ok()) {
    return s;
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, d.compute_stream()));
  return absl::OkStatus();
}

// Decodes a group on the CPU into its pinned slot, then H2D and scatter.
absl::Status DecodeGroupOnCpu(TransferPlan& plan, const Group& g) {
  TransferDevice::Slot& slot = plan.where.dev->slot(g.index);
  const uint64_t pb = plan.where.page_bytes();
  const uint32_t n = static_cast<uint32_t>(g.pages.size());
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.consumed));
  const auto t0 = std::chrono::steady_clock::now();
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
  for (uint32_t i = 0; i < n; ++i) {
    absl::StatusOr<std::vector<uint8_t>> raw =
        plan.what.client->DecodePage(plan.what.ns, g.pages[i], plan.what.call);
    if (!raw.ok()) return raw.status();
    if (raw->size() != pb) {
      return absl::InternalError(
          absl::StrFormat("page %u decodes to %u bytes, not %u",
                          g.pages[i].handle, raw->size(), pb));
    }
    CopyPageLayers(plan.where, raw->data(),
                   slot.pinned + i * plan.where.layer_page_bytes());
  }
  plan.clock->Add("decode", std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - t0)
                                .count());
  // The "h2d" stage moves these decoded pages, not the compressed bytes.
  plan.result->h2d_bytes += uint64_t{n} * plan.where.layer_page_bytes();
  return DispatchPinned(plan.where, g.index, g.first, n);
}

// The decoder of a group whose pages can all go in a gathered copy (one
// calibration, each decoded on the GPU straight into the layout), or null.
GpuPageDecoder* GatheringDecoder(const DecoderLookup& decoders,
                                 const Group& g) {
  if (g.pages.empty()) return nullptr;
  const uint64_t fp = g.pages[0].calibration_fingerprint;
  absl::StatusOr<GpuPageDecoder*> dec = decoders(fp);
  if (!dec.ok()) return nullptr;
  for (const CompressedPage& p : g.pages) {
    if (p.calibration_fingerprint != fp || !(*dec)->DecodesOnGpu(p)) {
      return nullptr;
    }
  }
  return *dec;
}

// How many bytes the next gathered copy waits for (LayoutTransferOptions::
// h2d_batch_bytes): the limit, but the call's first copies one group, then
// two, four, ... (`copies` made so far; `group_bytes` the first group's),
// and at most half of what is left of the call (`left`).
uint64_t CopyTarget(uint64_t limit, uint64_t group_bytes, int copies,
                    uint64_t left) {
  const uint64_t ramp = group_bytes << std::min(copies, 20);
  return std::max<uint64_t>(1, std::min({limit, ramp, left / 2}));
}

// Groups gathered for one H2D copy, all of one decoder: their KVTC batches
// merged side by side into copy region `region`, `bytes` of it.
struct GatheredCopy {
  int region = -1;
  uint64_t bytes = 0;
  GpuPageDecoder* decoder = nullptr;
  std::vector<Group> groups;
  std::vector<std::vector<GpuPageDecoder::MergedBatch>> batches;  // per group
};

// What the merger hands the worker: a group decoded on its own (another
// codec, a bad page), or a gathered copy.
using Work = std::variant<Group, GatheredCopy>;

// Between the merger and the worker: the work, in order (at most two
// waiting), and the free copy regions. Fail wakes both sides.
class CopyHandoff {
 public:
  explicit CopyHandoff(int regions) {
    absl::MutexLock l(&mu_);
    for (int i = 0; i < regions; ++i) free_.push_back(i);
  }
  // False once failed.
  bool Push(Work w) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return q_.size() < 2 || failed_;
    };
    mu_.Await(absl::Condition(&room));
    if (failed_) return false;
    q_.push_back(std::move(w));
    return true;
  }
  // The next work; false when closed and empty, or failed.
  bool Pop(Work* w) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !q_.empty() || closed_ || failed_;
    };
    mu_.Await(absl::Condition(&ready));
    if (failed_ || q_.empty()) return false;
    *w = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  void Fail() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    failed_ = true;
  }
  // A free region (waiting for one), or -1 once failed.
  int TakeRegion() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto has_region = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !free_.empty() || failed_;
    };
    mu_.Await(absl::Condition(&has_region));
    if (failed_) return -1;
    const int r = free_.front();
    free_.pop_front();
    return r;
  }
  // Once nothing reads region `r` any more.
  void GiveRegion(int r) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    free_.push_back(r);
  }

 private:
  // absl::Mutex re-evaluates the Await conditions whenever it is released,
  // so no notification is needed.
  absl::Mutex mu_;
  std::deque<Work> q_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// Regions of gathered copies: one decoding, one being enqueued, one being
// merged (with two the merge of the next copy waited for the decode of the
// one before to finish, and the GPU idled while it ran).
constexpr int kCopyRegions = 3;

// The merger: pops the call's groups (`n` pages in all) and merges each
// that can be gathered into the current copy region, handing the region to
// the worker once it holds its target; other groups go to the worker as
// they are. Run returns when the queue is closed and empty (the handoff is
// then closed), or something failed (the handoff is then failed too).
class Merger {
 public:
  Merger(TransferPlan& plan, uint32_t n, const DecoderLookup& decoders,
         GroupQueue& queue, CopyHandoff& handoff)
      : plan_(plan),
        n_(n),
        decoders_(decoders),
        queue_(queue),
        handoff_(handoff) {}

  void Run() {
    // CUDA's current device is per thread (the regions are made here).
    if (cudaError_t e = cudaSetDevice(plan_.where.dev->device());
        e != cudaSuccess) {
      queue_.Fail(gpu::CudaError(e, "cudaSetDevice", __FILE__, __LINE__));
    }
    Group g;
    // Pop returns false once the queue failed (here too, above).
    while (queue_.Pop(&g) && Add(std::move(g))) {
    }
    if (!queue_.error().ok() || !Push()) {
      handoff_.Fail();
      return;
    }
    handoff_.Close();
  }

 private:
  // Merges `g` into the current copy (or hands it on); false: stop.
  bool Add(Group g) {
    const uint64_t bytes = GroupBytes(g);
    popped_pages_ += static_cast<uint32_t>(g.pages.size());
    popped_bytes_ += bytes;
    GpuPageDecoder* dec = GatheringDecoder(decoders_, g);
    if (dec != nullptr && !SizeRegions(*dec)) return false;
    TransferDevice& d = *plan_.where.dev;
    const uint64_t cap = d.copy_region_bytes();
    const uint64_t need =
        dec == nullptr ? 0 : dec->MaxMergedBytes(g.pages.size());
    if (cur_.region >= 0 && (dec != cur_.decoder || cur_.bytes + need > cap) &&
        !Push()) {
      return false;
    }
    if (dec == nullptr || need > cap) return handoff_.Push(Work(std::move(g)));
    if (cur_.region < 0) {
      cur_.region = handoff_.TakeRegion();
      if (cur_.region < 0) return false;
      cur_.decoder = dec;
    }
    std::vector<GpuPageDecoder::MergedBatch> batches;
    absl::StatusOr<uint64_t> used = dec->MergeForLayout(
        g.pages,
        gpu::MakePagedKvDest(plan_.where.shape,
                             plan_.where.tables.blocks + g.first,
                             plan_.where.tables.k, plan_.where.tables.v,
                             plan_.where.layout_align),
        absl::MakeSpan(d.copy_region(cur_.region).pinned + cur_.bytes,
                       cap - cur_.bytes),
        &batches);
    // A bad page: its group goes on its own, and the worker's decode of it
    // names the page.
    if (!used.ok()) return handoff_.Push(Work(std::move(g)));
    if (first_group_bytes_ == 0) first_group_bytes_ = bytes;
    cur_.bytes += *used;
    cur_.groups.push_back(std::move(g));
    cur_.batches.push_back(std::move(batches));
    // What is left: the gathered bytes and the pages still to come, at the
    // mean page size so far.
    const uint64_t to_come =
        popped_pages_ >= n_
            ? 0
            : (n_ - popped_pages_) * popped_bytes_ / popped_pages_;
    const bool full = cur_.bytes >= CopyTarget(plan_.options->h2d_batch_bytes,
                                               first_group_bytes_, copies_,
                                               cur_.bytes + to_come);
    return !(full || to_come == 0) || Push();
  }

  // The regions, on the call's first gathered group (no copy of this call
  // reads them yet): each holds the target and one more group. A later
  // group that does not fit (a namespace of larger pages through the same
  // transfer) goes on its own. False (the queue failed) when they cannot
  // be made.
  bool SizeRegions(const GpuPageDecoder& dec) {
    if (sized_) return true;
    sized_ = true;
    const absl::Status s = plan_.where.dev->EnsureCopyRegions(
        kCopyRegions, plan_.options->h2d_batch_bytes +
                          dec.MaxMergedBytes(plan_.where.dev->slot_pages()));
    if (!s.ok()) queue_.Fail(s);
    return s.ok();
  }

  // Hands the current copy (if any) to the worker; false once failed.
  bool Push() {
    if (cur_.region < 0) return true;
    bool ok = true;
    if (cur_.groups.empty()) {
      handoff_.GiveRegion(cur_.region);
    } else {
      ++copies_;
      ok = handoff_.Push(Work(std::move(cur_)));
    }
    cur_ = GatheredCopy();
    return ok;
  }

  TransferPlan& plan_;
  const uint32_t n_;
  const DecoderLookup& decoders_;
  GroupQueue& queue_;
  CopyHandoff& handoff_;
  GatheredCopy cur_;
  bool sized_ = false;  // the regions made for this call's groups
  int copies_ = 0;
  uint64_t first_group_bytes_ = 0, popped_bytes_ = 0;
  uint32_t popped_pages_ = 0;
};

// Moves a gathered copy's region to the GPU in one timed copy (the "h2d"
// stage) and enqueues each group's decode from there; one Enqueued per
// group. On failure every batch enqueued is finished (the region is free).
absl::StatusOr<std::vector<Enqueued>> EnqueueCopy(TransferDevice& d,
                                                  TransferResult& result,
                                                  GatheredCopy& c) {
  TransferDevice::CopyRegion& r = d.copy_region(c.region);
  const cudaStream_t copy = d.copy_stream();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.device, r.pinned, c.bytes,
                                           cudaMemcpyHostToDevice, copy));
  if (absl::Status s = d.End("h2d", *begin, copy); !s.ok()) return s;
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.copied, copy));
  result.h2d_bytes += c.bytes;
  std::vector<Enqueued> fresh(c.groups.size());
  for (size_t k = 0; k < fresh.size(); ++k) {
    absl::StatusOr<std::vector<uint64_t>> t = c.decoder->EnqueueMergedToLayout(
        c.batches[k], r.pinned, r.device, r.copied);
    if (!t.ok()) {
      c.decoder->FinishToDevice(GpuPageDecoder::kAllTickets).IgnoreError();
      return t.status();
    }
    fresh[k].group = std::move(c.groups[k]);
    fresh[k].into_layout = true;
    if (!t->empty()) fresh[k].tickets.emplace_back(c.decoder, t->back());
  }
  if (!fresh.empty()) {
    fresh[0].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  return fresh;
}

// The worker's steps on the GPU: each step's decodes are enqueued, then the
// step before is finished (and scattered), so that two steps are in flight
// (with a ring of at least two slots: a group must not decode into the slot
// the group before is scattered from). A step is one group, or the groups
// of one gathered copy, whose region goes back to the merger once the step
// is finished.
class Steps {
 public:
  Steps(TransferPlan& plan, CopyHandoff* handoff)
      : plan_(plan),
        handoff_(handoff),
        overlap_(plan.options->staging_slots >= 2) {}
  // `fresh` was enqueued (from copy region `region`, or -1).
  absl::Status Advance(std::vector<Enqueued> fresh, int region) {
    if (absl::Status f = Finish(); !f.ok()) {
      // The decoders must not keep batches pending for the next call.
      for (const Enqueued& e : fresh) {
        for (const auto& [dec, ticket] : e.tickets) {
          dec->FinishToDevice(ticket).IgnoreError();
        }
      }
      Give(region);
      return f;
    }
    in_flight_ = std::move(fresh);
    region_ = region;
    return overlap_ ? absl::OkStatus() : Finish();
  }
  // Finishes the step in flight.
  absl::Status Finish() {
    absl::Status first;
    for (const Enqueued& e : in_flight_) {
      absl::Status s = FinishGroup(plan_, e);
      if (first.ok()) first = std::move(s);
    }
    in_flight_.clear();
    Give(region_);
    region_ = -1;
    return first;
  }
  // Copy region `region` (or none: -1) goes back to the merger.
  void Give(int region) {
    if (region >= 0 && handoff_ != nullptr) handoff_->GiveRegion(region);
  }

 private:
  TransferPlan& plan_;
  CopyHandoff* const handoff_;
  const bool overlap_;
  std::vector<Enqueued> in_flight_;
  int region_ = -1;
};

// The worker's loop over the work `pop` gives, on the GPU.
template <typename PopFn>
absl::Status DecodeOnGpu(TransferPlan& plan, const DecoderLookup& decoders,
                         PopFn&& pop, CopyHandoff* handoff) {
  if (plan.options->decode_into_layout) {
    // A decode into the layout runs on its decoder's streams, not on the
    // compute stream: what the compute stream was given first (the tables'
    // upload, the wait for the caller's stream) must be done before.
    KVH_CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(plan.where.dev->compute_stream()));
  }
  Steps steps(plan, handoff);
  // Groups come in whatever order the call's streams deliver them:
  // consecutive groups take consecutive slots of the ring, so the two in
  // flight never share one.
  uint64_t next_slot = 0;
  Work w;
  while (pop(&w)) {
    if (GatheredCopy* c = std::get_if<GatheredCopy>(&w)) {
      absl::StatusOr<std::vector<Enqueued>> fresh =
          EnqueueCopy(*plan.where.dev, *plan.result, *c);
      if (!fresh.ok()) {
        steps.Give(c->region);
        steps.Finish().IgnoreError();
        return fresh.status();
      }
      const int region = c->region;
      if (absl::Status s = steps.Advance(*std::move(fresh), region); !s.ok()) {
        return s;
      }
      continue;
    }
    std::vector<Enqueued> fresh(1);
    fresh[0].group = std::move(std::get<Group>(w));
    fresh[0].group.index = next_slot++;
    if (absl::Status s = EnqueueGroup(plan, decoders, fresh[0]); !s.ok()) {
      steps.Finish().IgnoreError();
      return s;
    }
    if (absl::Status s = steps.Advance(std::move(fresh), -1); !s.ok()) {
      return s;
    }
  }
  return steps.Finish();
}

}  // namespace

absl::Status DecodeQueuedGroups(TransferPlan& plan, uint32_t n, bool gpu,
                                const DecoderLookup& decoders,
                                GroupQueue& queue) {
  if (!gpu) {
    Group g;
    uint64_t next_slot = 0;
    while (queue.Pop(&g)) {
      g.index = next_slot++;
      if (absl::Status s = DecodeGroupOnCpu(plan, g); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (plan.options->h2d_batch_bytes == 0 || !plan.options->decode_into_layout) {
    return DecodeOnGpu(
        plan, decoders,
        [&](Work* w) {
          Group g;
          if (!queue.Pop(&g)) return false;
          *w = std::move(g);
          return true;
        },
        nullptr);
  }
  // The merger and the worker both look decoders up (the lookup makes one
  // on first use): one at a time.
  absl::Mutex lookup_mu;
  const DecoderLookup lookup =
      [&](uint64_t fp) -> absl::StatusOr<GpuPageDecoder*> {
    absl::MutexLock l(&lookup_mu);
    return decoders(fp);
  };
  CopyHandoff handoff(kCopyRegions);
  Merger m(plan, n, lookup, queue, handoff);
  std::thread merger([&] { m.Run(); });
  absl::Status s = DecodeOnGpu(
      plan, lookup, [&](Work* w) { return handoff.Pop(w); }, &handoff);
  if (!s.ok()) {
    // The merger may wait on either side.
    queue.Fail(s);
    handoff.Fail();
  }
  merger.join();
  return s;
}

}  // namespace client
}  // namespace kvharbor
