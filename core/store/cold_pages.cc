#include "core/store/cold_pages.h"

#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace_tiers.h"

namespace kvharbor {

ColdPages::ColdPages(DiskTier* disk, PagePool* pool,
                     const NamespaceCalibrations& calibrations)
    : disk_(disk),
      pool_(pool),
      page_bytes_(pool->slot_bytes()),
      calibrations_(calibrations) {}

std::optional<ColdPages::Page> ColdPages::Find(PageHandle h) const {
  absl::MutexLock l(&mu_);
  auto it = cold_.find(h);
  if (it == cold_.end()) return std::nullopt;
  return it->second;
}

bool ColdPages::Contains(PageHandle h) const {
  absl::MutexLock l(&mu_);
  return cold_.contains(h);
}

bool ColdPages::empty() const {
  absl::MutexLock l(&mu_);
  return cold_.empty();
}

void ColdPages::Add(PageHandle h, Page page) {
  absl::MutexLock l(&mu_);
  bytes_[static_cast<int>(page.tier)] += page.stored_bytes;
  const Page& c = cold_[h] = std::move(page);
  CountLocked(c, 1);
}

void ColdPages::Drop(PageHandle h) {
  absl::MutexLock l(&mu_);
  auto it = cold_.find(h);
  if (it == cold_.end()) return;
  bytes_[static_cast<int>(it->second.tier)] -= it->second.stored_bytes;
  CountLocked(it->second, -1);
  if (it->second.tier == Tier::kDisk) disk_->Remove(it->second.file_id);
  cold_.erase(it);
}

void ColdPages::MoveTo(PageHandle h, Tier to, uint64_t file_id) {
  absl::MutexLock l(&mu_);
  Page& c = cold_.at(h);
  bytes_[static_cast<int>(c.tier)] -= c.stored_bytes;
  bytes_[static_cast<int>(to)] += c.stored_bytes;
  c.tier = to;
  c.buffer = nullptr;
  c.file_id = file_id;
}

void ColdPages::CountLocked(const Page& c, int sign) {
  const absl::string_view name =
      c.codec != nullptr ? c.codec->name() : absl::string_view("unknown");
  auto it = codec_cold_.find(name);
  if (it == codec_cold_.end()) {
    it = codec_cold_.emplace(std::string(name), CodecStats{std::string(name)})
             .first;
  }
  if (sign > 0) {
    ++it->second.pages;
    it->second.bytes += c.stored_bytes;
  } else {
    --it->second.pages;
    it->second.bytes -= c.stored_bytes;
  }
  if (it->second.pages == 0) codec_cold_.erase(it);
}

uint64_t ColdPages::bytes(Tier t) const {
  absl::MutexLock l(&mu_);
  return bytes_[static_cast<int>(t)];
}

uint64_t ColdPages::NextFileId() {
  absl::MutexLock l(&mu_);
  return next_file_id_++;
}

void ColdPages::SetNextFileId(uint64_t id) {
  absl::MutexLock l(&mu_);
  next_file_id_ = id;
}

std::vector<CodecStats> ColdPages::ByCodec() const {
  absl::MutexLock l(&mu_);
  std::vector<CodecStats> out;
  for (const auto& [name, s] : codec_cold_) out.push_back(s);
  return out;
}

absl::flat_hash_map<uint64_t, uint64_t> ColdPages::PagesByFingerprint() const {
  absl::flat_hash_map<uint64_t, uint64_t> pages;
  absl::MutexLock l(&mu_);
  for (const auto& [h, c] : cold_) {
    if (c.codec != nullptr) ++pages[c.codec->calibration_fingerprint()];
  }
  return pages;
}

uint64_t ColdPages::memory_bytes() const {
  constexpr uint64_t kEntry = sizeof(std::pair<const PageHandle, Page>) + 1;
  absl::MutexLock l(&mu_);
  return cold_.capacity() * kEntry +
         bytes_[static_cast<int>(Tier::kHostCompressed)];
}

absl::Status ColdPages::Check(
    absl::FunctionRef<absl::StatusOr<Tier>(PageHandle)> tier_of,
    absl::FunctionRef<uint64_t(Tier)> tier_pages) const {
  absl::MutexLock l(&mu_);
  uint64_t count[kNumTiers] = {0, 0, 0}, bytes[kNumTiers] = {0, 0, 0};
  std::map<std::string, CodecStats, std::less<>> by_codec;
  for (const auto& [h, c] : cold_) {
    const std::string name(c.codec != nullptr ? c.codec->name() : "unknown");
    CodecStats& s = by_codec[name];
    s.codec = name;
    ++s.pages;
    s.bytes += c.stored_bytes;
    absl::StatusOr<Tier> t = tier_of(h);
    if (!t.ok() || *t != c.tier || c.tier == Tier::kRaw) {
      return absl::InternalError(absl::StrFormat(
          "cold page %#x: not indexed in tier %s", h, TierName(c.tier)));
    }
    if ((c.tier == Tier::kHostCompressed) != (c.buffer != nullptr) ||
        (c.buffer != nullptr &&
         (c.buffer->size() != c.stored_bytes ||
          XXH3_64bits(c.buffer->data(), c.buffer->size()) != c.checksum))) {
      return absl::InternalError(
          absl::StrFormat("cold page %#x: buffer does not fit its tier", h));
    }
    if (c.tier == Tier::kDisk && disk_ != nullptr &&
        ::access(disk_->PathOf(c.file_id).c_str(), F_OK) != 0) {
      return absl::InternalError(
          absl::StrFormat("disk page %#x: its file is missing", h));
    }
    ++count[static_cast<int>(c.tier)];
    bytes[static_cast<int>(c.tier)] += c.stored_bytes;
  }
  for (int t = 1; t < kNumTiers; ++t) {
    const uint64_t indexed = tier_pages(static_cast<Tier>(t));
    if (count[t] != indexed || bytes[t] != bytes_[t]) {
      return absl::InternalError(absl::StrFormat(
          "tier %s: %u cold pages / %u bytes, index says %u pages, counter "
          "%u bytes",
          TierName(static_cast<Tier>(t)), count[t], bytes[t], indexed,
          bytes_[t]));
    }
  }
  for (const auto& [name, s] : by_codec) {
    auto it = codec_cold_.find(name);
    if (it == codec_cold_.end() || it->second.pages != s.pages ||
        it->second.bytes != s.bytes) {
      return absl::InternalError(absl::StrFormat(
          "codec %s: %u cold pages / %u bytes, counted %u / %u", name, s.pages,
          s.bytes, it == codec_cold_.end() ? 0 : it->second.pages,
          it == codec_cold_.end() ? 0 : it->second.bytes));
    }
  }
  if (by_codec.size() != codec_cold_.size()) {
    return absl::InternalError("a codec is counted without cold pages");
  }
  if (disk_ == nullptr && count[2] > 0) {
    return absl::InternalError("disk pages without a disk tier");
  }
  return absl::OkStatus();
}

absl::Status ColdPages::Materialize(PinnedPages* out,
                                    std::vector<std::pair<size_t, int>> fds,
                                    std::vector<PageHandle>* corrupt) const {
  KVH_RETURN_IF_ERROR(LoadColdBuffers(out, std::move(fds), corrupt));
  if (out->format_ == FetchFormat::kRaw) return MaterializeRaw(out);
  // Raw pages fetched COMPRESSED are encoded with the codec active now.
  const std::shared_ptr<const Codec> encoder = calibrations_.tier_codec();
  CodecWorkspace ws;
  std::string host;
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] == Tier::kRaw) {
      KVH_ASSIGN_OR_RETURN(
          out->owned_[i],
          EncodePoolPage(*pool_, out->slots_[i], out->positions_[i], *encoder,
                         &ws, &host));
      out->codecs_[i] = encoder;
    }
    // A host-compressed buffer's stored checksum was just verified against
    // its bytes (LoadColdBuffers): hashing it again would only repeat that.
    if (out->tiers_[i] == Tier::kHostCompressed) continue;
    const absl::string_view b = out->bytes(i);
    out->checksums_[i] = XXH3_64bits(b.data(), b.size());
  }
  return absl::OkStatus();
}

namespace {

// Threads that hash one fetch's host-compressed buffers, and the bytes
// below which one thread does it (a thread costs more than it saves).
constexpr unsigned kMaxVerifyThreads = 8;
constexpr uint64_t kParallelVerifyBytes = uint64_t{8} << 20;

}  // namespace

std::vector<bool> ColdPages::VerifyHostBuffers(const PinnedPages& pages) {
  // Every fetch of a cold page checks its buffer (memory can rot); a large
  // fetch hashes on several threads, so that the check does not cost a
  // remote client more than the wire.
  std::vector<char> ok(pages.size(), 1);
  uint64_t bytes = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages.tiers_[i] == Tier::kHostCompressed) {
      bytes += pages.buffers_[i]->size();
    }
  }
  auto verify = [&](size_t first, size_t step) {
    for (size_t i = first; i < pages.size(); i += step) {
      if (pages.tiers_[i] != Tier::kHostCompressed) continue;
      const std::string& buf = *pages.buffers_[i];
      ok[i] = XXH3_64bits(buf.data(), buf.size()) == pages.checksums_[i];
    }
  };
  const size_t threads =
      bytes < kParallelVerifyBytes
          ? 1
          : std::min<size_t>(pages.size(),
                             std::clamp(std::thread::hardware_concurrency(), 1u,
                                        kMaxVerifyThreads));
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) workers.emplace_back(verify, t, threads);
  verify(0, threads);
  for (std::thread& w : workers) w.join();
  return std::vector<bool>(ok.begin(), ok.end());
}

absl::Status ColdPages::LoadColdBuffers(
    PinnedPages* out, std::vector<std::pair<size_t, int>> fds,
    std::vector<PageHandle>* corrupt) const {
  // Every page is checked (not just up to the first bad one) so all corrupt
  // pages of the request are found and dropped at once.
  std::string first_error;
  const auto bad = [&](size_t i, const std::string& why) {
    corrupt->push_back(out->handles_[i]);
    if (first_error.empty()) {
      first_error =
          absl::StrFormat("page %#x: %s, not served", out->handles_[i], why);
    }
  };
  for (const auto& [i, fd] : fds) {
    if (fd < 0) {
      bad(i, "its disk file cannot be opened");
      continue;
    }
    absl::StatusOr<DiskPage> page = DiskTier::ReadOpened(fd);
    if (!page.ok()) {
      bad(i, absl::StrCat("disk file unreadable: ", page.status().message()));
      continue;
    }
    out->buffers_[i] =
        std::make_shared<const std::string>(std::move(page->buffer));
  }
  const std::vector<bool> ok = VerifyHostBuffers(*out);
  for (size_t i = 0; i < out->size(); ++i) {
    if (!ok[i]) bad(i, "host-compressed buffer fails its checksum");
  }
  if (!first_error.empty()) return absl::DataLossError(first_error);
  return absl::OkStatus();
}

absl::Status ColdPages::MaterializeRaw(PinnedPages* out) const {
  const bool device = pool_->kind() == MemoryKind::kDevice;
  std::vector<uint32_t> read_slots;
  std::vector<uint8_t*> read_dst;
  std::vector<size_t> cold;
  const auto dst = [&](size_t i) {
    return out->raw_->data() + i * page_bytes_;
  };
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] != Tier::kRaw) {
      cold.push_back(i);
    } else if (device) {
      read_slots.push_back(out->slots_[i]);
    }
  }
  if (read_slots.empty() && cold.empty()) return absl::OkStatus();
  // One allocation for the read (core/memory/host_block.h: huge pages,
  // populated by the kernel); host-pool raw pages are read in place and leave
  // their part unused.
  KVH_ASSIGN_OR_RETURN(out->raw_, HostBlock::Create(out->size() * page_bytes_));
  for (size_t i = 0; i < out->size(); ++i) {
    if (device && out->tiers_[i] == Tier::kRaw) read_dst.push_back(dst(i));
  }
  // Device bytes go to the client through host memory; the slots' checksums
  // (of the uploaded bytes) still describe them.
  if (!read_slots.empty()) {
    KVH_RETURN_IF_ERROR(pool_->ReadMany(read_slots, read_dst));
  }
  return DecodeCold(out, cold);
}

absl::Span<const uint8_t> ColdPages::ColdBuffer(const PinnedPages& pages,
                                                size_t i) {
  const std::string& b = *pages.buffers_[i];
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()),
                             b.size());
}

absl::Status ColdPages::DecodeOnCpu(const PinnedPages& pages, size_t i,
                                    const Codec& codec, MutablePageRef dst,
                                    CodecWorkspace* ws,
                                    absl::string_view not_done) const {
  absl::Status s =
      codec.Decode(ColdBuffer(pages, i), absl::MakeConstSpan(&dst, 1), ws);
  if (!s.ok()) {
    return absl::DataLossError(
        absl::StrFormat("page %#x: stored buffer does not decode, not %s: %s",
                        pages.handles_[i], not_done, s.message()));
  }
  return absl::OkStatus();
}

absl::Status ColdPages::DecodeByCodec(
    const PinnedPages& pages, absl::Span<const size_t> idx, bool to_device,
    absl::FunctionRef<MutablePageRef(size_t)> gpu_dst,
    absl::FunctionRef<absl::Status(size_t, const Codec&, bool)> finish) const {
  // Pages of one fetch may hold buffers of several calibrations.
  absl::flat_hash_map<const Codec*, std::vector<size_t>> groups;
  for (size_t i : idx) groups[pages.codecs_[i].get()].push_back(i);
  for (const auto& [codec, group] : groups) {
    std::vector<absl::Status> gpu_status(group.size(),
                                         absl::UnavailableError("no GPU"));
    if (const std::shared_ptr<PageBatchDecoder> gpu =
            calibrations_.GpuDecoderOf(codec)) {
      std::vector<absl::Span<const uint8_t>> bufs;
      std::vector<MutablePageRef> refs;
      for (size_t i : group) {
        bufs.push_back(ColdBuffer(pages, i));
        refs.push_back(gpu_dst(i));
      }
      gpu_status = to_device ? gpu->DecodeEachToDevice(bufs, refs)
                             : gpu->DecodeEach(bufs, refs);
      KVH_CHECK(gpu_status.size() == group.size(),
                "GPU decoder returned %u results for %u pages",
                gpu_status.size(), group.size());
    }
    for (size_t k = 0; k < group.size(); ++k) {
      KVH_RETURN_IF_ERROR(finish(group[k], *codec, gpu_status[k].ok()));
    }
  }
  return absl::OkStatus();
}

absl::Status ColdPages::DecodeCold(PinnedPages* out,
                                   absl::Span<const size_t> idx) const {
  const auto ref = [&](size_t i) {
    return MutablePageRef{out->raw_->data() + i * page_bytes_,
                          out->positions_[i]};
  };
  CodecWorkspace ws;
  return DecodeByCodec(
      *out, idx, /*to_device=*/false, ref,
      [&](size_t i, const Codec& codec, bool gpu_ok) -> absl::Status {
        // A page the GPU refused is decoded again on the CPU: a corrupt
        // buffer fails there too, a GPU fault does not cost the page.
        if (!gpu_ok) {
          KVH_RETURN_IF_ERROR(
              DecodeOnCpu(*out, i, codec, ref(i), &ws, "served"));
        }
        out->checksums_[i] = XXH3_64bits(ref(i).data, page_bytes_);
        return absl::OkStatus();
      });
}

absl::Status ColdPages::DecodeIntoSlots(
    const PinnedPages& cold, absl::Span<const uint32_t> slots,
    const SlotTable& table, std::vector<uint64_t>* checksums) const {
  checksums->assign(slots.size(), 0);
  std::vector<size_t> all(cold.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  std::vector<size_t> on_gpu;
  CodecWorkspace ws;
  std::string host(page_bytes_, '\0');
  KVH_RETURN_IF_ERROR(DecodeByCodec(
      cold, all, /*to_device=*/true,
      [&](size_t k) {
        return MutablePageRef{pool_->Data(slots[k]), cold.positions_[k]};
      },
      [&](size_t k, const Codec& codec, bool gpu_ok) -> absl::Status {
        if (gpu_ok) {
          on_gpu.push_back(k);
          return absl::OkStatus();
        }
        // No GPU decoder for this codec, or a page the GPU refused: decoded
        // on the CPU (a corrupt buffer fails there too) and copied in.
        const MutablePageRef r{reinterpret_cast<uint8_t*>(host.data()),
                               cold.positions_[k]};
        KVH_RETURN_IF_ERROR(DecodeOnCpu(cold, k, codec, r, &ws, "staged"));
        (*checksums)[k] = XXH3_64bits(host.data(), host.size());
        return pool_->Write(slots[k], 0, r.data, page_bytes_);
      }));
  // Pages decoded on the GPU are hashed there too.
  std::vector<uint32_t> gpu_slots;
  for (size_t k : on_gpu) gpu_slots.push_back(slots[k]);
  KVH_ASSIGN_OR_RETURN(const std::vector<uint64_t> sums,
                       table.Checksum(gpu_slots));
  for (size_t j = 0; j < on_gpu.size(); ++j) (*checksums)[on_gpu[j]] = sums[j];
  return absl::OkStatus();
}

}  // namespace kvharbor
