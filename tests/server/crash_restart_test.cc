// SIGKILL of kvharbord during heavy inserts into a namespace with a disk
// tier, then a warm restart from the same disk_dir: every page served
// afterwards must be byte-exact (page bytes are a function of their token
// prefix, so any fetched page can be checked), and unfinished or corrupt
// files are dropped with a log line, never served.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/server_test_util.h"
#include "tests/server/subprocess.h"
#include "tests/temp_dir.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

namespace fs = std::filesystem;

// A token space wide enough that most inserts are new pages (an insert
// extending a cold prefix promotes it back to raw and removes its file).
constexpr uint32_t kTrunks = 16, kMaxPages = 6, kBranches = 3;
constexpr size_t kFilesBeforeKill = 12;
// One more trunk, which the writers never touch: it is put on disk whole
// before they start. Cold pages leave only by their tier's budget (the disk
// tier has none here), never to make room for an insert, so the restart
// must serve this chain whole however hard the writers pushed (Insert's
// eviction fallback used to drop it: docs/reliability.md).
constexpr uint32_t kKeptTrunk = kTrunks;

// Pages before `branch_at` follow the trunk, later ones the branch.
std::vector<int32_t> Prompt(uint32_t trunk, uint32_t pages, uint32_t branch_at,
                            uint32_t branch) {
  std::vector<int32_t> t(pages * kPageSize);
  for (size_t j = 0; j < t.size(); ++j) {
    const bool on_trunk = j / kPageSize < branch_at;
    t[j] = static_cast<int32_t>(trunk * 100000 +
                                (on_trunk ? 0 : (branch + 1) * 1000) + j);
  }
  return t;
}

// The bytes of page `page` of `tokens`: seeded by its whole token prefix.
std::string PageData(const std::vector<int32_t>& tokens, size_t page) {
  const uint64_t seed =
      XXH3_64bits(tokens.data(), (page + 1) * kPageSize * sizeof(int32_t));
  return RandomBytes(kPageBytes, static_cast<uint32_t>(seed ^ (seed >> 32)));
}

std::string AllPages(const std::vector<int32_t>& tokens) {
  std::string out;
  for (size_t p = 0; p < tokens.size() / kPageSize; ++p) {
    out += PageData(tokens, p);
  }
  return out;
}

void CreateTiered(v1::KvHarbor::Stub* stub, const std::string& dir) {
  grpc::ClientContext ctx;
  v1::CreateNamespaceRequest req;
  req.mutable_spec()->set_name(kNs);
  *req.mutable_spec()->mutable_geometry() = TestGeometryProto();
  // Less room than the writers' uploads take at once: reservations outrun
  // demotion, and Insert falls back to evicting raw pages.
  req.mutable_spec()->set_capacity_bytes(8 * kPageBytes);
  req.mutable_spec()->set_host_compressed_bytes(4 * (kPageBytes + 256));
  req.mutable_spec()->set_disk_dir(dir);
  v1::CreateNamespaceResponse resp;
  grpc::Status s = stub->CreateNamespace(&ctx, req, &resp);
  INFO(s.error_message());
  REQUIRE(s.ok());
}

size_t CountFiles(const std::string& dir, const std::string& ext) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    n += e.path().extension() == ext;
  }
  return n;
}

// Inserts random prompts until told to stop (errors expected once killed).
void Writer(std::shared_ptr<grpc::Channel> ch, uint32_t seed,
            const std::atomic<bool>* stop) {
  auto stub = v1::KvHarbor::NewStub(ch);
  std::mt19937 rng(seed);
  while (!stop->load()) {
    const uint32_t pages = 1 + rng() % kMaxPages;
    const std::vector<int32_t> t =
        Prompt(rng() % kTrunks, pages, rng() % (pages + 1), rng() % kBranches);
    SendInsert(stub.get(), InsertMessages(kNs, t, AllPages(t), 3000));
  }
}

TEST_CASE(
    "faults: SIGKILL during inserts, warm restart serves only exact "
    "pages",
    "[server][faults][process]") {
  TempDir tmp;
  const std::string dir = tmp.path + "/disk";
  {
    Kvharbord proc(KVHARBORD_PATH, {"--pool_bytes=16MiB"});
    REQUIRE(proc.started());
    auto ch = proc.Connect();
    REQUIRE(ch != nullptr);
    auto stub = v1::KvHarbor::NewStub(ch);
    CreateTiered(stub.get(), dir);
    const std::vector<int32_t> kept = Prompt(kKeptTrunk, kMaxPages, 0, 0);
    SendInsert(stub.get(), InsertMessages(kNs, kept, AllPages(kept), 3000));
    {
      v1::DemoteRequest req;
      req.set_namespace_(kNs);
      req.set_tier(v1::TIER_DISK);
      v1::DemoteResponse resp;
      grpc::ClientContext ctx;
      REQUIRE(stub->Demote(&ctx, req, &resp).ok());
      REQUIRE(resp.pages_moved() > 0);
    }
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (uint32_t i = 0; i < 4; ++i) writers.emplace_back(Writer, ch, i, &stop);
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (CountFiles(dir, ".kvh") < kFilesBeforeKill &&
           std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(37));
    proc.Signal(SIGKILL);  // mid-write: inserts and disk writes in flight
    const int status = proc.WaitExit(std::chrono::seconds(10));
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    stop = true;
    for (std::thread& w : writers) w.join();
  }
  // Promotions remove files, so fewer may be left than there were.
  REQUIRE(CountFiles(dir, ".kvh") > 0);
  // What a crash on a file system without atomic rename could leave: a torn
  // page file under a valid name, and an unfinished temp file.
  fs::path some;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".kvh") some = e.path();
  }
  const fs::path torn = dir + "/page-00000000deadbeef.kvh";
  const fs::path tmpfile = dir + "/page-00000000deadbef0.kvh.tmp";
  fs::copy_file(some, torn);
  fs::resize_file(torn, fs::file_size(torn) / 2);
  fs::copy_file(some, tmpfile);

  const std::string log_path = tmp.path + "/restart.log";
  Kvharbord proc(KVHARBORD_PATH, {"--pool_bytes=16MiB"}, log_path);
  REQUIRE(proc.started());
  auto ch = proc.Connect();
  REQUIRE(ch != nullptr);
  auto stub = v1::KvHarbor::NewStub(ch);
  CreateTiered(stub.get(), dir);  // loads the disk tier
  CHECK(!fs::exists(torn));
  CHECK(!fs::exists(tmpfile));
  // Every prompt of the token space: whatever is served is byte-exact.
  size_t served = 0;
  const v1::MatchResponse kept =
      MatchOk(stub.get(), Prompt(kKeptTrunk, kMaxPages, 0, 0));
  CHECK(kept.page_handles_size() == kMaxPages);
  for (uint32_t trunk = 0; trunk <= kKeptTrunk; ++trunk) {
    for (uint32_t branch_at = 0; branch_at <= kMaxPages; ++branch_at) {
      for (uint32_t branch = 0; branch < kBranches; ++branch) {
        const std::vector<int32_t> t =
            Prompt(trunk, kMaxPages, branch_at, branch);
        v1::MatchResponse m = MatchOk(stub.get(), t);
        if (m.page_handles_size() == 0) continue;
        v1::FetchRequest req;
        req.set_namespace_(kNs);
        for (uint64_t h : m.page_handles()) {
          req.mutable_pages()->add_page_handles(h);
        }
        FetchResult f = FetchAll(stub.get(), req);
        INFO(f.status.error_message());
        REQUIRE(f.status.ok());
        const std::string got = Reassemble(f, 1 << 20);
        REQUIRE(got.size() == m.page_handles_size() * kPageBytes);
        for (int p = 0; p < m.page_handles_size(); ++p) {
          CHECK(got.substr(p * kPageBytes, kPageBytes) == PageData(t, p));
        }
        served += m.page_handles_size();
      }
    }
  }
  std::ifstream log(log_path);
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  INFO(text);
  CHECK(served > 0);
  CHECK(text.find("dropped corrupt disk page " + torn.string()) !=
        std::string::npos);
  CHECK(text.find("removed unfinished write " + tmpfile.string()) !=
        std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
