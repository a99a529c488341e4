// Helpers for the daemon tests: an in-process Daemon on a free loopback port
// with a small test namespace, a raw generated stub (no SDK), page data, an
// Insert/Fetch driver and a snapshot of a namespace's visible state.
#ifndef KVHARBOR_TESTS_SERVER_SERVER_TEST_UTIL_H_
#define KVHARBOR_TESTS_SERVER_SERVER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/failed_write.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace testing {

namespace v1 = ::kvharbor::v1;

inline constexpr char kNs[] = "test";
// 2 layers x 2 kv heads x 64 dims x 4 tokens x 2 (K, V) x 2 bytes.
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint32_t kPageSize = 4;
inline constexpr uint32_t kCapacityPages = 32;

inline Geometry TestGeometry() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.page_size = kPageSize;
  g.dtype = DType::kBF16;
  return g;
}

inline v1::Geometry TestGeometryProto() {
  v1::Geometry g;
  g.set_num_layers(2);
  g.set_num_kv_heads(2);
  g.set_head_dim(64);
  g.set_page_size(kPageSize);
  g.set_dtype(v1::DTYPE_BF16);
  return g;
}

inline DaemonOptions TestOptions() {
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 64 << 20;
  o.store.default_namespace_bytes = 1 << 20;
  o.store.max_tokens_per_request = 1 << 20;
  o.lease_reap_interval = absl::Milliseconds(20);
  o.drain_timeout = absl::Seconds(5);
  NamespaceSpec spec;
  spec.name = kNs;
  spec.geometry = TestGeometry();
  spec.capacity_bytes = kCapacityPages * kPageBytes;
  o.namespaces.push_back(spec);
  return o;
}

// TestOptions plus namespace "big" of 1 MiB pages: a fetch of several
// cannot complete within the HTTP/2 flow-control window, so a client that
// stops reading (or cancels, or runs out of time) stalls it mid-stream.
inline DaemonOptions BigPageOptions() {
  DaemonOptions o = TestOptions();
  NamespaceSpec big;
  big.name = "big";
  big.geometry = TestGeometry();
  big.geometry.num_layers = 8;
  big.geometry.num_kv_heads = 8;
  big.geometry.head_dim = 128;
  big.geometry.page_size = 32;
  big.capacity_bytes = 16 << 20;
  o.namespaces.push_back(big);
  return o;
}

// A started daemon and a stub connected to it.
struct TestServer {
  explicit TestServer(DaemonOptions options = TestOptions()) {
    spdlog::set_level(spdlog::level::warn);
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    daemon = *std::move(d);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    channel = grpc::CreateCustomChannel(
        daemon->address(), grpc::InsecureChannelCredentials(), args);
    stub = v1::KvHarbor::NewStub(channel);
  }
  std::shared_ptr<Namespace> ns(const std::string& name = kNs) {
    absl::StatusOr<std::shared_ptr<Namespace>> n = daemon->store().Get(name);
    REQUIRE(n.ok());
    return *n;
  }

  std::unique_ptr<Daemon> daemon;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvHarbor::Stub> stub;
};

inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// `n` token ids starting at `first` (distinct sequences for distinct firsts).
inline std::vector<int32_t> Tokens(size_t n, int32_t first) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

inline uint64_t PageChecksum(const std::string& bytes, size_t page) {
  return XXH3_64bits(bytes.data() + page * kPageBytes, kPageBytes);
}

inline v1::InsertRequest Header(const std::string& ns,
                                const std::vector<int32_t>& tokens,
                                const std::vector<uint64_t>& checksums = {}) {
  v1::InsertRequest r;
  r.mutable_header()->set_namespace_(ns);
  for (int32_t t : tokens) r.mutable_header()->add_token_ids(t);
  for (uint64_t c : checksums) r.mutable_header()->add_page_checksums(c);
  return r;
}

inline v1::InsertRequest Chunk(uint64_t offset, const std::string& data) {
  v1::InsertRequest r;
  r.mutable_chunk()->set_offset(offset);
  r.mutable_chunk()->set_data(data);
  return r;
}

// The header, then `bytes` in chunks of `chunk` bytes.
inline std::vector<v1::InsertRequest> InsertMessages(
    const std::string& ns, const std::vector<int32_t>& tokens,
    const std::string& bytes, size_t chunk,
    const std::vector<uint64_t>& checksums = {}) {
  std::vector<v1::InsertRequest> msgs{Header(ns, tokens, checksums)};
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    msgs.push_back(Chunk(off, bytes.substr(off, chunk)));
  }
  return msgs;
}

// Sends `msgs`, half-closes and returns the call's status. If gRPC refuses a
// write, it stops there as the SDK does, without a half-close (that would end
// the upload short): the result is the daemon's status, or UNAVAILABLE when
// none came (client/failed_write.h).
inline grpc::Status SendInsert(v1::KvHarbor::Stub* stub,
                               const std::vector<v1::InsertRequest>& msgs,
                               v1::InsertResponse* resp = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::InsertResponse local;
  auto writer = stub->Insert(&ctx, resp ? resp : &local);
  for (const v1::InsertRequest& m : msgs) {
    if (!writer->Write(m)) {
      return client::FinishAfterFailedWrite(
          &ctx, [&] { return writer->Finish(); }, "Insert");
    }
  }
  writer->WritesDone();
  return writer->Finish();
}

inline grpc::Status InsertPages(v1::KvHarbor::Stub* stub,
                                const std::vector<int32_t>& tokens,
                                const std::string& bytes, size_t chunk,
                                v1::InsertResponse* resp = nullptr,
                                const std::string& ns = kNs) {
  return SendInsert(stub, InsertMessages(ns, tokens, bytes, chunk), resp);
}

// Creates the test namespace through the API (for a daemon started without
// it, such as a kvharbord process).
inline void CreateTestNamespace(v1::KvHarbor::Stub* stub) {
  grpc::ClientContext ctx;
  v1::CreateNamespaceRequest req;
  req.mutable_spec()->set_name(kNs);
  *req.mutable_spec()->mutable_geometry() = TestGeometryProto();
  req.mutable_spec()->set_capacity_bytes(kCapacityPages * kPageBytes);
  v1::CreateNamespaceResponse resp;
  grpc::Status s = stub->CreateNamespace(&ctx, req, &resp);
  INFO(s.error_message());
  REQUIRE(s.ok());
}

struct FetchResult {
  grpc::Status status;
  std::vector<v1::FetchResponse> chunks;
};

inline FetchResult FetchAll(v1::KvHarbor::Stub* stub,
                            const v1::FetchRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  FetchResult out;
  auto reader = stub->Fetch(&ctx, req);
  v1::FetchResponse r;
  while (reader->Read(&r)) out.chunks.push_back(r);
  out.status = reader->Finish();
  return out;
}

// Reassembles the streamed pages, checking the per-chunk framing: chunks of
// each page in order, contiguous, at most `max_chunk` bytes, and the first
// chunk of each page carrying its handle, size and checksum.
inline std::string Reassemble(const FetchResult& f, size_t max_chunk,
                              std::vector<uint64_t>* handles = nullptr) {
  std::string out;
  uint32_t page = 0;
  uint64_t offset = 0;
  for (const v1::FetchResponse& c : f.chunks) {
    REQUIRE(c.page_index() == page);
    REQUIRE(c.offset() == offset);
    REQUIRE(c.data().size() <= max_chunk);
    REQUIRE(!c.data().empty());
    if (offset == 0) {
      REQUIRE(c.page_bytes() == kPageBytes);
      REQUIRE(c.page_handle() != 0);
      if (handles != nullptr) handles->push_back(c.page_handle());
    } else {
      REQUIRE(c.page_handle() == 0);
    }
    out += c.data();
    offset += c.data().size();
    if (offset == kPageBytes) {
      // The checksum on the page's first chunk covers the whole page.
      const size_t first = out.size() - kPageBytes;
      const v1::FetchResponse* head = nullptr;
      for (const v1::FetchResponse& h : f.chunks) {
        if (h.page_index() == page && h.offset() == 0) head = &h;
      }
      REQUIRE(head != nullptr);
      CHECK(head->page_checksum() ==
            XXH3_64bits(out.data() + first, kPageBytes));
      ++page;
      offset = 0;
    }
  }
  REQUIRE(offset == 0);
  return out;
}

inline v1::MatchResponse MatchOk(v1::KvHarbor::Stub* stub,
                                 const std::vector<int32_t>& tokens,
                                 bool lock = false, uint32_t ttl_ms = 0,
                                 const std::string& ns = kNs) {
  grpc::ClientContext ctx;
  v1::MatchRequest req;
  req.set_namespace_(ns);
  for (int32_t t : tokens) req.add_token_ids(t);
  req.set_lock(lock);
  req.set_lease_ttl_ms(ttl_ms);
  v1::MatchResponse resp;
  grpc::Status s = stub->Match(&ctx, req, &resp);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return resp;
}

// The code, and a message that starts with the field it names.
inline void CheckError(const grpc::Status& s, grpc::StatusCode code,
                       const std::string& field) {
  INFO("status " << s.error_code() << ": " << s.error_message());
  CHECK(s.error_code() == code);
  CHECK_THAT(s.error_message(), Catch::Matchers::StartsWith(field + ":") ||
                                    Catch::Matchers::StartsWith(field + "[") ||
                                    Catch::Matchers::StartsWith(field + " "));
}

// What a client can observe of a namespace: counters and tree.
struct Snapshot {
  NamespaceStats c;
  std::string tree;
  auto Key() const {
    return std::make_tuple(
        c.capacity_pages, c.free_pages, c.cached_pages, c.evictable_pages,
        c.protected_pages, c.hit_tokens, c.miss_tokens, c.inserted_pages,
        c.dedup_pages, c.evicted_pages, c.bytes_in, c.bytes_out,
        c.active_leases, c.index_nodes, c.uploads_in_flight, tree);
  }
  bool operator==(const Snapshot& o) const { return Key() == o.Key(); }
};

inline Snapshot Snap(const Namespace& ns) {
  return Snapshot{ns.Counters(), ns.DumpTree(1000)};
}

// Polls `cond` for up to `timeout` (server-side cleanup such as an aborted
// upload or released pins runs after the client sees the status).
inline bool Eventually(const std::function<bool()>& cond,
                       absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// Waits until in-flight server work settled, then checks the slot table.
inline void CheckSettled(Namespace& ns) {
  CHECK(Eventually([&] {
    const NamespaceStats c = ns.Counters();
    return c.uploads_in_flight == 0;
  }));
  const absl::Status inv = ns.CheckInvariants();
  INFO(inv.ToString());
  CHECK(inv.ok());
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_SERVER_TEST_UTIL_H_
