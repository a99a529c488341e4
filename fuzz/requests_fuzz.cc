// libFuzzer target: sequences of kvharbor.v1 requests through the real
// service (KvHarborService: validation, handlers, Insert/Fetch reactors,
// core Store/Namespace), in process over grpc::Server::InProcessChannel, so
// every request goes through serialization and the callback API as on the
// network.
//
// Input: records [op u8][len u16 LE][payload]. The op's low 7 bits pick the
// RPC; its top bit sends a unary request through the in-process gRPC channel
// instead of straight to the service's handler body (Insert and Fetch always
// take the channel: their reactors are the handlers). The direct route is
// the same validation and core calls without the transport's thread hops,
// several times faster; the channel route keeps serialization and the Unary
// wrapper (admission, deadline check, reactor) fuzzed too. The
// payload is that RPC's serialized request (Insert: a run of [len u16 LE]
// [InsertRequest] records, sent as one stream). Lease ids below 16 and page
// handles below 64 are replaced by the ids/handles the previous responses
// returned (i-th remembered), so the fuzzer reaches live leases and pages
// without guessing 64-bit values. Paths in a NamespaceSpec are confined:
// disk_dir is mapped into the target's temp dir, calibration_path and
// kvcm_path are cleared (the file readers have their own targets).
//
// Each input starts from the same state: the fixed namespaces "n" (flat),
// "t" (tiered: host-compressed and disk), "h" (fp8 codec, host-compressed
// only, another geometry) and "k" (page keys, tiered, two layers for layer
// ranges), empty and without leases, and no other namespace. An Insert
// header's non-zero prefix_lease_id is replaced like a lease id (appends
// after a remembered lease). The store, service, server and fixed namespaces
// are made once per process; between inputs (Reset) the gRPC calls are awaited,
// leases released and pages evicted through the namespaces' own APIs,
// namespaces the input created are deleted (with their disk dirs) and fixed
// ones it deleted or replaced are made again. What survives an input is only
// what no request can observe as different: counters, slot generations (so page
// handles differ; inputs name pages by remembered index, see above) and
// lease ids (random anyway). After each input, every namespace's invariants
// must hold (Namespace::CheckInvariants: slots, index, tiers, no upload
// left), every error must carry a message, and every fetched page must
// match the checksum the daemon sent with it.
//
// Seeds: fuzz/corpus/requests/ (written by running the target with
// -runs=0 and KVHARBOR_FUZZ_WRITE_SEEDS=DIR).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>
#include <xxh3.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/codec/fp8/fp8_codec.h"
#include "core/memory/host_arena.h"
#include "fuzz/fuzz_util.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "server/rpc/service.h"
#include "server/rpc/status_map.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace {

namespace v1 = ::kvharbor::v1;

// Top bit of an op byte: through the gRPC channel (see above).
constexpr uint8_t kTransport = 0x80;

enum Op : uint8_t {
  kCreate,
  kDescribe,
  kList,
  kDelete,
  kMatch,
  kInsert,
  kFetch,
  kRelease,
  kExtend,
  kEvict,
  kStats,
  kDump,
  kCalibration,
  kDemote,
  kUploadCalibration,
  kListCalibrations,
  kPinCalibration,
  kGetHostHandles,
  kNumOps
};

// A namespace every input starts with (made once, emptied between inputs).
struct Fixed {
  NamespaceSpec spec;
  std::shared_ptr<Namespace> ns;  // the instance this harness made
};

struct Harness {
  std::string root;
  std::vector<Fixed> fixed;
  std::unique_ptr<Store> store;
  std::unique_ptr<KvHarborService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::KvHarbor::Stub> stub;
};

Harness* harness = nullptr;

// What earlier responses of this input returned.
struct Memory {
  std::vector<uint64_t> leases;
  std::vector<uint64_t> handles;
};

NamespaceSpec BaseSpec(const std::string& name) {
  NamespaceSpec s;
  s.name = name;
  s.geometry.num_layers = 1;
  s.geometry.num_kv_heads = 1;
  s.geometry.head_dim = 8;
  s.geometry.page_size = 2;
  s.geometry.dtype = DType::kFP32;
  s.capacity_bytes = 8 * s.geometry.PageBytes();
  return s;
}

std::vector<NamespaceSpec> FixedSpecs(const std::string& root) {
  NamespaceSpec t = BaseSpec("t");
  t.host_compressed_bytes = 4 * (t.geometry.PageBytes() + 128);
  t.disk_dir = root + "/t";
  t.disk_bytes = 6 * (t.geometry.PageBytes() + 256);
  // fp8 pages are about half a bf16 page: room for 3 of them, then drops.
  NamespaceSpec h = BaseSpec("h");
  h.geometry.num_layers = 2;
  h.geometry.num_kv_heads = 2;
  h.geometry.head_dim = 4;
  h.geometry.page_size = 4;
  h.geometry.dtype = DType::kBF16;
  h.capacity_bytes = 4 * h.geometry.PageBytes();
  h.codec = kFp8CodecName;
  h.host_compressed_bytes = 3 * (h.geometry.PageBytes() / 2 + 128);
  NamespaceSpec k = BaseSpec("k");
  k.key_kind = KeyKind::kPageKeys;
  k.geometry.num_layers = 2;
  k.capacity_bytes = 6 * k.geometry.PageBytes();
  k.host_compressed_bytes = 4 * (k.geometry.PageBytes() + 128);
  return {BaseSpec("n"), t, h, k};
}

// Makes fixed namespace `f` anew; its disk dir is emptied first so that no
// page of an earlier input comes back by warm restart.
void CreateFixed(Fixed* f) {
  // The old instance (deleted or replaced by the input) must go first: while
  // anything holds it, its disk_dir counts as busy and the create is refused.
  f->ns.reset();
  std::error_code ec;
  if (!f->spec.disk_dir.empty())
    std::filesystem::remove_all(f->spec.disk_dir, ec);
  auto created = harness->store->CreateNamespace(f->spec, false);
  if (!created.ok()) {
    std::fprintf(stderr, "fixed namespace %s: %s\n", f->spec.name.c_str(),
                 created.status().ToString().c_str());
  }
  FUZZ_CHECK(created.ok());
  f->ns = created->first;
}

bool IsFixed(const std::shared_ptr<Namespace>& ns) {
  for (const Fixed& f : harness->fixed) {
    if (f.ns == ns) return true;
  }
  return false;
}

// Brings the store back to the state every input starts from. The calls of
// the previous input are done (AwaitCalls), so nothing else holds a lease,
// pin or upload.
void Reset() {
  Store& store = *harness->store;
  for (const auto& ns : store.List()) {
    if (!IsFixed(ns)) FUZZ_CHECK(store.DeleteNamespace(ns->name(), true).ok());
  }
  // Disk dirs of the input's namespaces (Confine maps them to c0..c3): a
  // namespace made there later would load their pages.
  std::error_code ec;
  for (int i = 0; i < 4; ++i) {
    const std::string dir = harness->root + "/c" + std::to_string(i);
    if (std::filesystem::exists(dir, ec)) std::filesystem::remove_all(dir, ec);
  }
  for (Fixed& f : harness->fixed) {
    auto current = store.Get(f.spec.name);
    if (!current.ok() || *current != f.ns) {
      CreateFixed(&f);
      continue;
    }
    f.ns->ReleaseAllLeases();
    f.ns->EvictAll();
    const NamespaceStats c = f.ns->Counters();
    FUZZ_CHECK(c.cached_pages == 0 && c.active_leases == 0);
    FUZZ_CHECK(c.free_pages == c.capacity_pages);
    for (int t = 0; t < kNumTiers; ++t) FUZZ_CHECK(c.tiers[t].bytes == 0);
  }
}

// Waits until gRPC is done with every call of the input: a stream reactor
// releases its upload or pins just after the client saw the status.
void AwaitCalls() {
  FUZZ_CHECK(
      harness->service->calls().AwaitIdle(absl::Now() + absl::Seconds(10)));
}

void InitHarness() {
  harness = new Harness;
  // tmpfs when there is one: fsync per page write is not what is fuzzed.
  const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  harness->root =
      std::string(base) + "/kvharbor_requests_fuzz_" + std::to_string(getpid());
  for (NamespaceSpec& spec : FixedSpecs(harness->root)) {
    harness->fixed.push_back(Fixed{std::move(spec), nullptr});
  }
  StoreOptions so;
  so.pool_budget_bytes = 4 << 20;
  so.default_namespace_bytes = 64 << 10;
  so.max_tokens_per_request = 4096;
  so.max_lease_ttl = absl::Seconds(30);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(harness->root, ec);
  });
  // Host pools cut from the shared arena, as with store.host_ipc_socket, so
  // that GetHostHandles answers (the socket itself is the daemon's, not
  // needed to compute the handles).
  auto arena = HostArena::Create(so.pool_budget_bytes * 2, "fuzz");
  FUZZ_CHECK(arena.ok());
  so.host_arena = *arena;
  harness->store = std::make_unique<Store>(so);
  ServiceOptions svc;
  svc.default_chunk_bytes = 4096;
  svc.host_ipc_socket = harness->root + "/host_ipc.sock";
  svc.daemon_id = 1;
  harness->service =
      std::make_unique<KvHarborService>(harness->store.get(), svc, nullptr);
  grpc::ServerBuilder b;
  b.RegisterService(harness->service.get());
  harness->server = b.BuildAndStart();
  FUZZ_CHECK(harness->server != nullptr);
  harness->stub = v1::KvHarbor::NewStub(
      harness->server->InProcessChannel(grpc::ChannelArguments()));
  std::error_code ec;
  std::filesystem::remove_all(harness->root, ec);
  std::filesystem::create_directories(harness->root, ec);
  for (Fixed& f : harness->fixed) CreateFixed(&f);
}

uint64_t Lease(const Memory& m, uint64_t id) {
  return id < 16 && !m.leases.empty() ? m.leases[id % m.leases.size()] : id;
}

void Handles(const Memory& m, google::protobuf::RepeatedField<uint64_t>* hs) {
  for (uint64_t& h : *hs) {
    if (h < 64 && !m.handles.empty()) h = m.handles[h % m.handles.size()];
  }
}

void Confine(v1::NamespaceSpec* spec) {
  if (!spec->disk_dir().empty()) {
    spec->set_disk_dir(harness->root + "/c" +
                       std::to_string(spec->disk_dir().size() % 4));
  }
  spec->clear_calibration_path();
  spec->clear_kvcm_path();
}

void Remember(Memory* m, const v1::MatchResponse& r) {
  if (r.lease_id() != 0) m->leases.push_back(r.lease_id());
  for (uint64_t h : r.page_handles()) m->handles.push_back(h);
}

void CheckStatus(const grpc::Status& s) {
  // Every refusal says why (and, for bad input, names the field).
  FUZZ_CHECK(s.ok() || !s.error_message().empty());
  FUZZ_CHECK(s.error_code() != grpc::StatusCode::INTERNAL);
  FUZZ_CHECK(s.error_code() != grpc::StatusCode::UNKNOWN);
}

void DoInsert(const std::string& payload, const Memory& m) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::InsertResponse resp;
  auto w = harness->stub->Insert(&ctx, &resp);
  size_t pos = 0;
  while (pos + 2 <= payload.size()) {
    const size_t len = static_cast<uint8_t>(payload[pos]) |
                       static_cast<uint8_t>(payload[pos + 1]) << 8;
    pos += 2;
    v1::InsertRequest r;
    if (!r.ParseFromString(payload.substr(pos, len))) break;
    pos += len;
    if (r.has_header() && r.header().prefix_lease_id() != 0) {
      r.mutable_header()->set_prefix_lease_id(
          Lease(m, r.header().prefix_lease_id()));
    }
    if (!w->Write(r)) break;
  }
  w->WritesDone();
  CheckStatus(w->Finish());
}

void DoFetch(const std::string& payload, const Memory& m) {
  v1::FetchRequest req;
  if (!req.ParseFromString(payload)) return;
  if (req.source_case() == v1::FetchRequest::kLeaseId) {
    req.set_lease_id(Lease(m, req.lease_id()));
  }
  if (req.has_pages()) Handles(m, req.mutable_pages()->mutable_page_handles());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto reader = harness->stub->Fetch(&ctx, req);
  v1::FetchResponse r;
  std::string page;
  uint64_t want = 0, size = 0;
  while (reader->Read(&r)) {
    if (r.offset() == 0) {
      page.clear();
      want = r.page_checksum();
      size = r.page_bytes();
    }
    page += r.data();
    FUZZ_CHECK(page.size() <= size);
    if (page.size() == size && req.transform() == v1::FETCH_TRANSFORM_NONE) {
      FUZZ_CHECK(XXH3_64bits(page.data(), page.size()) == want);
    }
  }
  CheckStatus(reader->Finish());
}

}  // namespace

// Dispatches one record. Unary requests go straight to the service's
// handler bodies (validation and core calls, as under gRPC) unless the op's
// top bit asks for the in-process gRPC channel (serialization, the Unary
// wrapper: admission, deadline, reactor). Insert and Fetch are streams whose
// reactors are the handlers: always through the channel.
class KvHarborServicePeer {
 public:
  static void RunOne(uint8_t op, const std::string& payload, Memory* m);

 private:
  // Parses a unary request, applies `fix`, runs it through the channel
  // (`call`) or straight through its handler body (`body`), and checks the
  // status as the client sees it (the direct route maps it with
  // ToGrpcStatus, the daemon's one mapping). The response goes to
  // `resp_out` when the call succeeded.
  template <typename Req, typename Resp>
  static void Route(bool transport, const std::string& payload,
                    grpc::Status (v1::KvHarbor::Stub::*call)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const std::function<absl::Status(const Req&, Resp*)>& body,
                    const std::function<void(Req*)>& fix = nullptr,
                    Resp* resp_out = nullptr) {
    Req req;
    if (!req.ParseFromString(payload)) return;
    if (fix) fix(&req);
    Resp resp;
    grpc::Status s;
    if (transport) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
      s = (harness->stub.get()->*call)(&ctx, req, &resp);
    } else {
      s = ToGrpcStatus(body(req, &resp));
    }
    CheckStatus(s);
    if (resp_out != nullptr && s.ok()) *resp_out = resp;
  }
};

void KvHarborServicePeer::RunOne(uint8_t op, const std::string& payload,
                                 Memory* m) {
  using S = v1::KvHarbor::Stub;
  KvHarborService* svc = harness->service.get();
  const Caller caller = Caller::Unrestricted();
  const bool transport = (op & 0x80) != 0;
  const auto lease_fix = [m](auto* r) {
    r->set_lease_id(Lease(*m, r->lease_id()));
  };
  switch ((op & 0x7f) % kNumOps) {
    case kCreate:
      Route<v1::CreateNamespaceRequest, v1::CreateNamespaceResponse>(
          transport, payload, &S::CreateNamespace,
          [&](const auto& q, auto* r) {
            return svc->DoCreateNamespace(caller, q, r);
          },
          [](v1::CreateNamespaceRequest* r) { Confine(r->mutable_spec()); });
      break;
    case kDescribe:
      Route<v1::DescribeNamespaceRequest, v1::NamespaceInfo>(
          transport, payload, &S::DescribeNamespace,
          [&](const auto& q, auto* r) {
            return svc->DoDescribeNamespace(caller, q, r);
          });
      break;
    case kList:
      Route<v1::ListNamespacesRequest, v1::ListNamespacesResponse>(
          transport, payload, &S::ListNamespaces, [&](const auto&, auto* r) {
            return svc->DoListNamespaces(caller, r);
          });
      break;
    case kDelete:
      Route<v1::DeleteNamespaceRequest, v1::DeleteNamespaceResponse>(
          transport, payload, &S::DeleteNamespace, [&](const auto& q, auto*) {
            return svc->DoDeleteNamespace(caller, q);
          });
      break;
    case kMatch: {
      // A context of no call: no deadline, never cancelled.
      const grpc::CallbackServerContext ctx;
      v1::MatchResponse resp;
      Route<v1::MatchRequest, v1::MatchResponse>(
          transport, payload, &S::Match,
          [&](const auto& q, auto* r) {
            return svc->DoMatch(ctx, caller, q, r);
          },
          nullptr, &resp);
      Remember(m, resp);
      break;
    }
    case kInsert:
      DoInsert(payload, *m);
      break;
    case kFetch:
      DoFetch(payload, *m);
      break;
    case kRelease:
      Route<v1::ReleaseRequest, v1::ReleaseResponse>(
          transport, payload, &S::Release,
          [&](const auto& q, auto*) { return svc->DoRelease(caller, q); },
          lease_fix);
      break;
    case kExtend:
      Route<v1::ExtendLeaseRequest, v1::ExtendLeaseResponse>(
          transport, payload, &S::ExtendLease,
          [&](const auto& q, auto* r) {
            return svc->DoExtendLease(caller, q, r);
          },
          lease_fix);
      break;
    case kEvict:
      Route<v1::EvictRequest, v1::EvictResponse>(
          transport, payload, &S::Evict,
          [&](const auto& q, auto* r) { return svc->DoEvict(caller, q, r); },
          [m](v1::EvictRequest* r) {
            if (r->has_pages()) {
              Handles(*m, r->mutable_pages()->mutable_page_handles());
            }
          });
      break;
    case kStats:
      Route<v1::StatsRequest, v1::StatsResponse>(
          transport, payload, &S::Stats,
          [&](const auto& q, auto* r) { return svc->DoStats(caller, q, r); });
      break;
    case kDump:
      Route<v1::DumpTreeRequest, v1::DumpTreeResponse>(
          transport, payload, &S::DumpTree, [&](const auto& q, auto* r) {
            return svc->DoDumpTree(caller, q, r);
          });
      break;
    case kCalibration:
      Route<v1::GetCalibrationRequest, v1::GetCalibrationResponse>(
          transport, payload, &S::GetCalibration, [&](const auto& q, auto* r) {
            return svc->DoGetCalibration(caller, q, r);
          });
      break;
    case kDemote:
      Route<v1::DemoteRequest, v1::DemoteResponse>(
          transport, payload, &S::Demote,
          [&](const auto& q, auto* r) { return svc->DoDemote(caller, q, r); });
      break;
    case kUploadCalibration:
      Route<v1::UploadCalibrationRequest, v1::UploadCalibrationResponse>(
          transport, payload, &S::UploadCalibration,
          [&](const auto& q, auto* r) {
            return svc->DoUploadCalibration(caller, q, r);
          });
      break;
    case kListCalibrations:
      Route<v1::ListCalibrationsRequest, v1::ListCalibrationsResponse>(
          transport, payload, &S::ListCalibrations,
          [&](const auto& q, auto* r) {
            return svc->DoListCalibrations(caller, q, r);
          });
      break;
    case kPinCalibration:
      Route<v1::PinCalibrationRequest, v1::PinCalibrationResponse>(
          transport, payload, &S::PinCalibration, [&](const auto& q, auto*) {
            return svc->DoPinCalibration(caller, q);
          });
      break;
    case kGetHostHandles:
      Route<v1::GetHostHandlesRequest, v1::GetHostHandlesResponse>(
          transport, payload, &S::GetHostHandles,
          [&](const auto& q, auto* r) {
            return svc->DoGetHostHandles(caller, q, r);
          },
          lease_fix);
      break;
  }
}

namespace {

void CheckAll() {
  AwaitCalls();
  for (const auto& ns : harness->store->List()) {
    FUZZ_CHECK(ns->Counters().uploads_in_flight == 0);
    const absl::Status inv = ns->CheckInvariants();
    if (!inv.ok()) std::fprintf(stderr, "%s\n", inv.ToString().c_str());
    FUZZ_CHECK(inv.ok());
  }
}

// ---- Seeds: realistic request sequences, one file each.

void Record(std::string* out, uint8_t op, const std::string& payload) {
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(payload.size() & 0xff));
  out->push_back(static_cast<char>(payload.size() >> 8));
  *out += payload;
}

NamespaceSpec FixedSpec(const std::string& ns) {
  for (const NamespaceSpec& spec : FixedSpecs("")) {
    if (spec.name == ns) return spec;
  }
  return NamespaceSpec();
}

// The sequence of `pages` pages from `first` into a Match or Insert
// request: token ids, or page keys ("p<first + i>") in "k".
template <typename Req>
void AddSequence(const std::string& ns, int first, int pages, Req* r) {
  const NamespaceSpec spec = FixedSpec(ns);
  if (spec.key_kind == KeyKind::kPageKeys) {
    for (int i = 0; i < pages; ++i) {
      r->add_page_keys("p" + std::to_string(first + i));
    }
    return;
  }
  for (uint32_t i = 0; i < pages * spec.geometry.page_size; ++i) {
    r->add_token_ids(first + static_cast<int>(i));
  }
}

// An Insert of pages [skip, pages) of the sequence from `first`: page after
// page, or layer by layer.
std::string InsertPayload(const std::string& ns, int first, int pages,
                          uint32_t skip = 0, bool layer_major = false,
                          uint64_t prefix_lease = 0) {
  const Geometry g = FixedSpec(ns).geometry;
  const size_t page_bytes = g.PageBytes();
  v1::InsertRequest h;
  h.mutable_header()->set_namespace_(ns);
  AddSequence(ns, first, pages, h.mutable_header());
  h.mutable_header()->set_skip_pages(skip);
  h.mutable_header()->set_layer_major(layer_major);
  h.mutable_header()->set_prefix_lease_id(prefix_lease);
  std::string out;
  const auto add = [&](const v1::InsertRequest& r) {
    const std::string b = r.SerializeAsString();
    out.push_back(static_cast<char>(b.size() & 0xff));
    out.push_back(static_cast<char>(b.size() >> 8));
    out += b;
  };
  add(h);
  for (uint32_t p = skip; p < static_cast<uint32_t>(pages); ++p) {
    v1::InsertRequest c;
    c.mutable_chunk()->set_offset((p - skip) * page_bytes);
    c.mutable_chunk()->set_data(std::string(page_bytes, static_cast<char>(p)));
    add(c);
  }
  return out;
}

std::string MatchPayload(const std::string& ns, int first, int tokens,
                         bool lock) {
  v1::MatchRequest r;
  r.set_namespace_(ns);
  const NamespaceSpec spec = FixedSpec(ns);
  if (spec.key_kind == KeyKind::kPageKeys) {
    AddSequence(ns, first, tokens / spec.geometry.page_size, &r);
  } else {
    for (int i = 0; i < tokens; ++i) r.add_token_ids(first + i);
  }
  r.set_lock(lock);
  return r.SerializeAsString();
}

// Engine traffic in `ns`: an append after a cached prefix, one after a
// lease, a layer-major insert, and a layer-range fetch.
void AddEngineSeeds(const std::string& ns, std::vector<std::string>* seeds) {
  std::string s;
  Record(&s, kInsert, InsertPayload(ns, 1, 2));
  Record(&s, kInsert, InsertPayload(ns, 1, 3, /*skip=*/2));
  Record(&s, kMatch, MatchPayload(ns, 1, 4, true));
  Record(&s, kInsert, InsertPayload(ns, 1, 4, 2, false, /*prefix_lease=*/1));
  Record(&s, kInsert, InsertPayload(ns, 1, 5, 4, /*layer_major=*/true));
  v1::FetchRequest f;
  f.set_namespace_(ns);
  f.set_lease_id(0);  // the remembered lease
  f.set_layer_begin(1);
  f.set_layer_end(2);
  Record(&s, kFetch, f.SerializeAsString());
  v1::DemoteRequest d;
  d.set_namespace_(ns);
  d.set_tier(v1::TIER_HOST_COMPRESSED);
  Record(&s, kDemote, d.SerializeAsString());
  Record(&s, kInsert, InsertPayload(ns, 1, 6, /*skip=*/5));
  v1::DumpTreeRequest dt;
  dt.set_namespace_(ns);
  Record(&s, kDump, dt.SerializeAsString());
  seeds->push_back(s);
}

// Two seeds of page traffic in `ns`: insert, match with a lease, (demote,)
// fetch, release; insert, match, fetch and evict by handle, stats.
void AddPageSeeds(const std::string& ns, std::vector<std::string>* seeds) {
  {
    std::string s;
    Record(&s, kInsert, InsertPayload(ns, 1, 3));
    Record(&s, kMatch | kTransport, MatchPayload(ns, 1, 8, true));
    v1::FetchRequest f;
    f.set_namespace_(ns);
    f.set_lease_id(0);  // the remembered lease
    f.set_format(ns != "n" ? v1::FETCH_FORMAT_COMPRESSED
                           : v1::FETCH_FORMAT_RAW);
    if (ns != "n") {
      v1::DemoteRequest d;
      d.set_namespace_(ns);
      d.set_tier(ns == "t" ? v1::TIER_DISK : v1::TIER_HOST_COMPRESSED);
      Record(&s, kDemote, d.SerializeAsString());
    }
    Record(&s, kFetch, f.SerializeAsString());
    v1::GetHostHandlesRequest hh;
    hh.set_namespace_(ns);
    hh.set_lease_id(0);  // the remembered lease
    Record(&s, kGetHostHandles, hh.SerializeAsString());
    v1::ReleaseRequest r;
    r.set_lease_id(0);
    Record(&s, kRelease | kTransport, r.SerializeAsString());
    seeds->push_back(s);
  }
  {
    std::string e;  // insert, match, fetch and evict by handle
    Record(&e, kInsert, InsertPayload(ns, 50, 4));
    Record(&e, kMatch, MatchPayload(ns, 50, 8, false));
    v1::FetchRequest fh;
    fh.set_namespace_(ns);
    fh.mutable_pages()->add_page_handles(1);
    fh.mutable_pages()->add_page_handles(2);
    Record(&e, kFetch, fh.SerializeAsString());
    v1::EvictRequest ev;
    ev.set_namespace_(ns);
    ev.mutable_pages()->add_page_handles(0);
    Record(&e, kEvict, ev.SerializeAsString());
    v1::StatsRequest st;
    st.set_namespace_(ns);
    Record(&e, kStats, st.SerializeAsString());
    seeds->push_back(e);
  }
}

void WriteSeeds(const std::string& dir) {
  std::vector<std::string> seeds;
  AddPageSeeds("n", &seeds);
  AddPageSeeds("t", &seeds);
  std::string admin;
  v1::CreateNamespaceRequest c;
  c.mutable_spec()->set_name("x");
  c.mutable_spec()->mutable_geometry()->set_num_layers(2);
  c.mutable_spec()->mutable_geometry()->set_num_kv_heads(1);
  c.mutable_spec()->mutable_geometry()->set_head_dim(4);
  c.mutable_spec()->mutable_geometry()->set_page_size(2);
  c.mutable_spec()->mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  c.mutable_spec()->set_host_compressed_bytes(4096);
  c.mutable_spec()->set_disk_dir("d");
  Record(&admin, kCreate, c.SerializeAsString());
  v1::DescribeNamespaceRequest d;
  d.set_namespace_("x");
  Record(&admin, kDescribe | kTransport, d.SerializeAsString());
  Record(&admin, kList | kTransport, "");
  v1::DumpTreeRequest dt;
  dt.set_namespace_("n");
  Record(&admin, kDump, dt.SerializeAsString());
  v1::GetCalibrationRequest g;
  g.set_namespace_("t");
  Record(&admin, kCalibration, g.SerializeAsString());
  v1::ExtendLeaseRequest x;
  x.set_lease_id(7);
  Record(&admin, kExtend, x.SerializeAsString());
  v1::DeleteNamespaceRequest del;
  del.set_namespace_("x");
  Record(&admin, kDelete, del.SerializeAsString());
  seeds.push_back(admin);
  AddPageSeeds("h", &seeds);
  AddPageSeeds("k", &seeds);
  AddEngineSeeds("k", &seeds);
  AddEngineSeeds("n", &seeds);
  // Calibration RPCs on a calibration-free codec, and a fixed namespace
  // deleted and made again with another geometry (Reset restores it).
  std::string cal;
  v1::ListCalibrationsRequest lc;
  lc.set_namespace_("h");
  Record(&cal, kListCalibrations, lc.SerializeAsString());
  v1::PinCalibrationRequest pc;
  pc.set_namespace_("h");
  pc.set_pinned(true);
  Record(&cal, kPinCalibration, pc.SerializeAsString());
  v1::UploadCalibrationRequest uc;
  uc.set_namespace_("h");
  uc.set_calibration("calibration");
  Record(&cal, kUploadCalibration, uc.SerializeAsString());
  v1::DeleteNamespaceRequest dn;
  dn.set_namespace_("n");
  dn.set_force(true);
  Record(&cal, kDelete, dn.SerializeAsString());
  c.mutable_spec()->set_name("n");
  c.mutable_spec()->clear_disk_dir();
  Record(&cal, kCreate, c.SerializeAsString());
  seeds.push_back(cal);
  // The tiered fixed namespace replaced by one with a disk tier: the next
  // input's Reset must make "t" again on its own (old instance released
  // first, or its disk_dir counts as busy).
  std::string replace_t;
  dn.set_namespace_("t");
  Record(&replace_t, kDelete, dn.SerializeAsString());
  c.mutable_spec()->set_name("t");
  c.mutable_spec()->set_disk_dir("dd");
  Record(&replace_t, kCreate, c.SerializeAsString());
  seeds.push_back(replace_t);
  for (size_t i = 0; i < seeds.size(); ++i) {
    WriteSeedOrDie(dir + "/seed_" + std::to_string(i), seeds[i].data(),
                   seeds[i].size());
  }
}

// libFuzzer's per-input leak check re-runs every input whose mallocs
// outnumber its frees under a whole-heap LeakSanitizer scan. Here the count
// never balances: gRPC frees a call's arena and reactor on its own threads
// after the client returned (inside the next input's window). That made
// the target 4x slower, and libFuzzer gives the check up after 1000 tries
// anyway. So -detect_leaks=0 is the default here (an explicit
// -detect_leaks=1 wins); LeakSanitizer still checks the whole process at
// exit, where a leak fails the run.
// Protobuf logs every string field with invalid UTF-8 it parses (mutated
// inputs hit that all the time; the parse then fails as it should). Those
// lines went to stderr once per input; every other line still does.
void QuietUtf8Errors(google::protobuf::LogLevel level, const char* file,
                     int line, const std::string& message) {
  if (message.find("invalid UTF-8") != std::string::npos) return;
  std::fprintf(stderr, "[libprotobuf %d %s:%d] %s\n", static_cast<int>(level),
               file, line, message.c_str());
}

void DefaultNoPerInputLeakCheck(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp((*argv)[i], "-detect_leaks=", 14) == 0) return;
  }
  static std::vector<char*> args;
  args.assign(*argv, *argv + *argc);
  static char flag[] = "-detect_leaks=0";
  args.push_back(flag);
  args.push_back(nullptr);
  *argc += 1;
  *argv = args.data();
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  if (const char* dir = std::getenv("KVHARBOR_FUZZ_WRITE_SEEDS")) {
    kvharbor::WriteSeeds(dir);
    std::exit(0);
  }
  google::protobuf::SetLogHandler(kvharbor::QuietUtf8Errors);
  kvharbor::DefaultNoPerInputLeakCheck(argc, argv);
  kvharbor::InitHarness();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvharbor;
  Reset();
  Memory m;
  size_t pos = 0;
  int calls = 0;
  while (pos + 3 <= size && calls++ < 64) {
    const uint8_t op = data[pos];
    const size_t len = data[pos + 1] | data[pos + 2] << 8;
    pos += 3;
    const size_t n = std::min(len, size - pos);
    KvHarborServicePeer::RunOne(
        op, std::string(reinterpret_cast<const char*>(data + pos), n), &m);
    pos += n;
  }
  CheckAll();
  return 0;
}
