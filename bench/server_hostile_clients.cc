// Hostile-client bench (issue 18): tenant B's Match latency while tenant A
// abuses a kvharbord subprocess, each abuse side by side with B's latency
// on the same daemon idle, in one run. The abuses are the ones found by
// trying the daemon as a hostile client:
//
//   1. --streams Fetch streams (default 1,030, over --stream_channels
//      connections) with A's READ-ONLY token, never read;
//   2. one Insert header declaring --header_tokens tokens (default 262,144)
//      and then no data, into a namespace full of A's cached pages;
//   3. --big_matches clients (default 8) each looping a Match of a
//      --match_tokens-token chain of 1-token pages (default 262,144 pages:
//      quadratic in pages before the RadixIndex's O(1) page lookup).
//
// Target (docs/reliability.md): B's Match p99 < 10 ms and no
// RESOURCE_EXHAUSTED for B during every abuse. B runs on its own connection
// and namespace, sequential Matches (one page, a hit) with a 1 s deadline
// for --b_seconds per phase. The config only uses keys every kvharbord
// version has, so --kvharbord may name an older binary (the before column).
//
//   kvharbor_bench_server_hostile_clients [--kvharbord=build/server/kvharbord]
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "tests/server/subprocess.h"

ABSL_FLAG(std::string, kvharbord, "",
          "kvharbord binary (default: the one next to this bench's build)");
ABSL_FLAG(int, streams, 1030, "abuse 1: unread Fetch streams");
ABSL_FLAG(int, stream_channels, 5,
          "connections the streams are spread over (gRPC queues more than "
          "max_concurrent_streams, 256, on one)");
ABSL_FLAG(int, header_tokens, 262144, "abuse 2: tokens the Insert declares");
ABSL_FLAG(int, big_matches, 8, "abuse 3: concurrent large Match clients");
ABSL_FLAG(int, match_tokens, 262144, "abuse 3: tokens of each large Match");
ABSL_FLAG(double, b_seconds, 3, "how long B measures in each phase");

namespace kvharbor {
namespace {

namespace v1 = ::kvharbor::v1;
using Clock = std::chrono::steady_clock;

constexpr char kARead[] = "tenant-a-read-token-0001";
constexpr char kAWrite[] = "tenant-a-write-token-002";
constexpr char kBRead[] = "tenant-b-read-token-0003";
constexpr char kBWrite[] = "tenant-b-write-token-004";
constexpr uint32_t kPageSize = 16;

// Page bytes = 2 (K, V) * 2 layers * page_size * 2 heads * head_dim * 2
// bytes.
struct NsDef {
  const char* name;
  const char* tenant;
  uint32_t head_dim;
  uint64_t capacity_pages;
  uint32_t page_size = kPageSize;
};

// The bench's files (tests/temp_dir.h needs Catch): removed at exit.
struct BenchDir {
  BenchDir() {
    char tmpl[] = "/tmp/kvharbor_hostile_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~BenchDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  std::string path;
};

uint64_t PageBytes(const NsDef& d) {
  return 16 * uint64_t{d.page_size} * d.head_dim;
}

std::string Config(const std::string& tokens_file,
                   const std::vector<NsDef>& defs) {
  std::string y = absl::StrCat(
      "store:\n  pool_budget_bytes: 1GiB\n  max_tokens_per_request: ",
      std::max(absl::GetFlag(FLAGS_header_tokens),
               absl::GetFlag(FLAGS_match_tokens)),
      "\n  max_lease_ttl_ms: 3600000\nmetrics:\n  listen: \"127.0.0.1:0\"\n"
      "limits:\n  max_receive_message_bytes: "
      "64MiB\nsecurity:\n  tokens_file: ",
      tokens_file, "\nnamespaces:\n");
  for (const NsDef& d : defs) {
    absl::StrAppend(&y, "  - name: ", d.name, "\n    tenant: ", d.tenant,
                    "\n    capacity_bytes: ", d.capacity_pages * PageBytes(d),
                    "\n    geometry: {num_layers: 2, num_kv_heads: 2, "
                    "head_dim: ",
                    d.head_dim, ", page_size: ", d.page_size,
                    ", dtype: fp16}\n");
  }
  return y;
}

std::unique_ptr<v1::KvHarbor::Stub> NewStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::KvHarbor::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
}

void Auth(grpc::ClientContext* ctx, const char* token, int deadline_ms) {
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(deadline_ms));
}

std::vector<int32_t> Chain(int first, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

grpc::Status Insert(v1::KvHarbor::Stub* stub, const char* token,
                    const std::string& ns, const std::vector<int32_t>& tokens,
                    uint64_t bytes) {
  grpc::ClientContext ctx;
  Auth(&ctx, token, 600000);
  v1::InsertResponse resp;
  auto w = stub->Insert(&ctx, &resp);
  v1::InsertRequest h;
  h.mutable_header()->set_namespace_(ns);
  for (int32_t t : tokens) h.mutable_header()->add_token_ids(t);
  w->Write(h);
  const std::string chunk(1 << 20, 'k');
  for (uint64_t off = 0; off < bytes; off += chunk.size()) {
    v1::InsertRequest c;
    c.mutable_chunk()->set_offset(off);
    c.mutable_chunk()->set_data(
        chunk.substr(0, std::min<uint64_t>(chunk.size(), bytes - off)));
    if (!w->Write(c)) break;
  }
  w->WritesDone();
  return w->Finish();
}

grpc::Status Match(v1::KvHarbor::Stub* stub, const char* token,
                   const std::string& ns, const std::vector<int32_t>& tokens,
                   bool lock, v1::MatchResponse* resp, int deadline_ms) {
  grpc::ClientContext ctx;
  Auth(&ctx, token, deadline_ms);
  v1::MatchRequest req;
  req.set_namespace_(ns);
  for (int32_t t : tokens) req.add_token_ids(t);
  req.set_lock(lock);
  req.set_lease_ttl_ms(3600000);
  return stub->Match(&ctx, req, resp);
}

struct Latency {
  std::vector<double> ms;
  int ok = 0, exhausted = 0, other = 0;
  std::string first_error;
  double Pct(double p) {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[std::min(ms.size() - 1, static_cast<size_t>(p * ms.size()))];
  }
};

// B: sequential one-page Matches on its own namespace and connection.
Latency MeasureB(const std::string& address) {
  auto stub = NewStub(address);
  const std::vector<int32_t> tokens = Chain(1, kPageSize);
  Latency l;
  const auto end = Clock::now() + std::chrono::milliseconds(static_cast<int>(
                                      1000 * absl::GetFlag(FLAGS_b_seconds)));
  while (Clock::now() < end) {
    v1::MatchResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status s =
        Match(stub.get(), kBRead, "b-ns", tokens, false, &resp, 1000);
    l.ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (s.ok()) {
      ++l.ok;
    } else {
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++l.exhausted;
      } else {
        ++l.other;
      }
      if (l.first_error.empty()) l.first_error = s.error_message();
    }
  }
  return l;
}

void Row(const std::string& phase, Latency l, const std::string& a_side) {
  const double p50 = l.Pct(0.5), p99 = l.Pct(0.99);  // sorts l.ms
  const double max = l.ms.empty() ? 0.0 : l.ms.back();
  std::printf("%-34s %7.2f %7.2f %7.2f %6d %6d %6d  %s\n", phase.c_str(), p50,
              p99, max, l.ok, l.exhausted, l.other, a_side.c_str());
  if (!l.first_error.empty()) {
    std::printf("%-34s B's first error: %s\n", "", l.first_error.c_str());
  }
  std::fflush(stdout);
}

uint64_t CachedPages(v1::KvHarbor::Stub* stub, const char* token,
                     const std::string& ns) {
  grpc::ClientContext ctx;
  Auth(&ctx, token, 10000);
  v1::StatsRequest req;
  req.set_namespace_(ns);
  v1::StatsResponse resp;
  if (!stub->Stats(&ctx, req, &resp).ok() || resp.namespaces_size() == 0) {
    return 0;
  }
  return resp.namespaces(0).cached_pages();
}

// Abuse 1. Returns "A: n admitted, m refused".
std::string UnreadFetches(const std::string& address, uint64_t lease,
                          Latency* b) {
  const int n = absl::GetFlag(FLAGS_streams);
  std::vector<std::unique_ptr<v1::KvHarbor::Stub>> stubs;
  for (int c = 0; c < absl::GetFlag(FLAGS_stream_channels); ++c) {
    stubs.push_back(NewStub(address));
  }
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<Stream>();
    Auth(&s->ctx, kARead, 600000);
    v1::FetchRequest req;
    req.set_namespace_("a-fetch");
    req.set_lease_id(lease);
    req.set_max_chunk_bytes(64 << 10);
    s->reader = stubs[i % stubs.size()]->Fetch(&s->ctx, req);
    streams.push_back(std::move(s));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  *b = MeasureB(address);
  // An admitted stream has chunks waiting (it stalled on flow control); a
  // refused one ends without any. Read before cancelling: a cancel would
  // turn the refusal's status into CANCELLED.
  int refused = 0, admitted = 0;
  for (auto& s : streams) {
    v1::FetchResponse r;
    if (s->reader->Read(&r)) {
      ++admitted;
      s->ctx.TryCancel();
      while (s->reader->Read(&r)) {
      }
      s->reader->Finish();
    } else if (s->reader->Finish().error_code() ==
               grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
    }
  }
  return absl::StrFormat("A: %d streams admitted, %d refused", admitted,
                         refused);
}

// Abuse 2. Returns what A's namespace held before and during.
std::string HeaderOnlyInsert(const std::string& address, Latency* b) {
  auto stub = NewStub(address);
  const uint64_t before = CachedPages(stub.get(), kARead, "a-ins");
  grpc::ClientContext ctx;
  Auth(&ctx, kAWrite, 600000);
  v1::InsertResponse resp;
  auto w = stub->Insert(&ctx, &resp);
  v1::InsertRequest h;
  h.mutable_header()->set_namespace_("a-ins");
  for (int32_t t : Chain(50000000, absl::GetFlag(FLAGS_header_tokens))) {
    h.mutable_header()->add_token_ids(t);
  }
  w->Write(h);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t during = CachedPages(stub.get(), kARead, "a-ins");
  *b = MeasureB(address);
  ctx.TryCancel();
  w->Finish();
  return absl::StrFormat("a-ins cached pages %u -> %u while it waits", before,
                         during);
}

// Abuse 3. Returns A's Match rate and latency.
std::string BigMatches(const std::string& address, Latency* b) {
  const std::vector<int32_t> chain =
      Chain(1, absl::GetFlag(FLAGS_match_tokens));
  std::atomic<bool> stop{false};
  std::atomic<int> done{0}, failed{0};
  std::atomic<int64_t> total_us{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < absl::GetFlag(FLAGS_big_matches); ++i) {
    threads.emplace_back([&] {
      auto stub = NewStub(address);
      while (!stop) {
        v1::MatchResponse resp;
        const auto t0 = Clock::now();
        if (Match(stub.get(), kARead, "a-chain", chain, false, &resp, 600000)
                .ok()) {
          ++done;
        } else {
          ++failed;
        }
        total_us += std::chrono::duration_cast<std::chrono::microseconds>(
                        Clock::now() - t0)
                        .count();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  *b = MeasureB(address);
  stop = true;
  for (auto& t : threads) t.join();
  const int n = done + failed;
  return absl::StrFormat("A: %d Matches (%d failed), mean %.1f ms", n,
                         failed.load(),
                         n == 0 ? 0.0 : total_us.load() / 1000.0 / n);
}

int Run() {
  std::string binary = absl::GetFlag(FLAGS_kvharbord);
  if (binary.empty()) binary = testing::KvharbordBesideBench();
  BenchDir dir;
  if (dir.path.empty()) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string tokens =
      dir.Write("tokens.yaml",
                absl::StrCat("tokens:\n  - {token: ", kARead,
                             ", tenant: a, role: read}\n  - {token: ", kAWrite,
                             ", tenant: a, role: write}\n  - {token: ", kBRead,
                             ", tenant: b, role: read}\n  - {token: ", kBWrite,
                             ", tenant: b, role: write}\n"));
  const int chain_pages = absl::GetFlag(FLAGS_match_tokens);
  const int header_pages = absl::GetFlag(FLAGS_header_tokens) / kPageSize;
  const std::vector<NsDef> defs = {
      {"a-fetch", "a", 256, 16},  // 64 KiB pages; one lease of 1 MiB
      {"a-ins", "a", 16, static_cast<uint64_t>(header_pages)},     // 4 KiB
      {"a-chain", "a", 4, static_cast<uint64_t>(chain_pages), 1},  // 64 B
      {"b-ns", "b", 16, 64}};
  const std::string config = dir.Write("kvharbord.yaml", Config(tokens, defs));
  testing::Kvharbord daemon(binary, {"--config=" + config},
                            dir.path + "/kvharbord.log");
  if (!daemon.started() || daemon.Connect() == nullptr) {
    std::fprintf(stderr, "cannot start %s (log: %s/kvharbord.log)\n",
                 binary.c_str(), dir.path.c_str());
    return 1;
  }
  const std::string address = daemon.address();
  auto stub = NewStub(address);
  // A's data: a leased MiB to fetch, a full namespace, a long chain.
  grpc::Status s = Insert(stub.get(), kAWrite, "a-fetch",
                          Chain(1, 16 * kPageSize), 16 * PageBytes(defs[0]));
  v1::MatchResponse lease;
  if (s.ok()) {
    s = Match(stub.get(), kARead, "a-fetch", Chain(1, 16 * kPageSize), true,
              &lease, 10000);
  }
  for (int c = 0; s.ok() && c < 8; ++c) {
    s = Insert(stub.get(), kAWrite, "a-ins",
               Chain(1000000 * c, header_pages / 8 * kPageSize),
               header_pages / 8 * PageBytes(defs[1]));
  }
  if (s.ok()) {
    s = Insert(stub.get(), kAWrite, "a-chain", Chain(1, chain_pages),
               chain_pages * PageBytes(defs[2]));
  }
  if (s.ok()) {
    s = Insert(stub.get(), kBWrite, "b-ns", Chain(1, kPageSize),
               PageBytes(defs[3]));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "setup failed: %s\n", s.error_message().c_str());
    return 1;
  }
  std::printf("daemon: %s\n", binary.c_str());
  std::printf("%-34s %7s %7s %7s %6s %6s %6s  %s\n", "phase (B: Match, ms)",
              "p50", "p99", "max", "ok", "R_EXH", "other", "A's side");
  Row("idle", MeasureB(address), "");
  Latency b;
  std::string a = UnreadFetches(address, lease.lease_id(), &b);
  Row(absl::StrCat(absl::GetFlag(FLAGS_streams), " unread Fetch streams"), b,
      a);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  a = HeaderOnlyInsert(address, &b);
  Row(absl::StrCat("Insert header of ", absl::GetFlag(FLAGS_header_tokens),
                   " tokens, no data"),
      b, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  a = BigMatches(address, &b);
  Row(absl::StrCat(absl::GetFlag(FLAGS_big_matches), " x Match of ",
                   absl::GetFlag(FLAGS_match_tokens), " tokens"),
      b, a);
  Row("idle again", MeasureB(address), "");
  std::printf("target: B's p99 < 10 ms and no RESOURCE_EXHAUSTED (R_EXH)\n");
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
