#include "server/rpc/service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/index/page_key.h"
#include "server/rpc/bulk_fetch_reactor.h"
#include "server/rpc/convert.h"
#include "server/rpc/fetch_reactor.h"
#include "server/rpc/insert_reactor.h"
#include "server/rpc/status_map.h"
#include "spdlog/spdlog.h"
#include "types/bulk_wire.h"

namespace kvharbor {

namespace {

// A unary call's reactor: counted in flight until OnDone (its admitted slot
// is given back before Finish, see CallTracker).
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryReactor(CallTracker* calls) : calls_(calls) {}
  // Finish, with the record the call ends with (any thread; once).
  void FinishCall(const CallRecord& call, const grpc::Status& status) {
    call_.emplace(call);
    Finish(status);
  }
  void OnDone() override {
    if (call_.has_value()) calls_->End(*call_);
    delete this;
  }

 private:
  CallTracker* const calls_;
  std::optional<CallRecord> call_;
};

// Matches of at least this many index elements (tokens, or kPageKeyWords
// words per page key) run on the service's WorkPool, not on gRPC's callback
// threads (server/rpc/work_pool.h). Shorter ones take well under a millisecond.
constexpr int kPoolMatchElements = 4096;

// The namespace's KVCM compressor applied to raw pinned pages, in order.
absl::StatusOr<TransformedKv> TransformPinned(
    const Namespace& ns, const Namespace::PinnedPages& pinned) {
  std::vector<const uint8_t*> pages(pinned.size());
  for (size_t i = 0; i < pinned.size(); ++i) pages[i] = pinned.data(i);
  return TransformPages(*ns.config().kvcm, ns.config().geometry, pages);
}

}  // namespace

GlobalStats TenantCounters(const Store& store, const Caller& caller) {
  GlobalStats c;
  c.pool_budget_bytes = store.options().pool_budget_bytes;
  const bool reserved = store.options().host_arena != nullptr ||
                        store.options().device_tier != nullptr;
  for (const auto& ns : VisibleNamespaces(store, caller)) {
    if (reserved) c.pool_reserved_bytes += ns->config().capacity_bytes;
    ++c.namespaces;
    c.memory_used_bytes += ns->memory_bytes();
    AddNamespaceStats(ns->Counters(), &c);
  }
  return c;
}

Role RequiredRole(RpcMethod rpc) {
  switch (rpc) {
    case RpcMethod::kCreateNamespace:
    case RpcMethod::kDeleteNamespace:
      return Role::kAdmin;
    case RpcMethod::kInsert:
    case RpcMethod::kDeviceInsert:
    case RpcMethod::kEvict:
    case RpcMethod::kDemote:
    case RpcMethod::kUploadCalibration:
    case RpcMethod::kPinCalibration:
      return Role::kWrite;
    case RpcMethod::kDescribeNamespace:
    case RpcMethod::kListNamespaces:
    case RpcMethod::kMatch:
    case RpcMethod::kFetch:
    case RpcMethod::kRelease:
    case RpcMethod::kExtendLease:
    case RpcMethod::kStats:
    case RpcMethod::kDumpTree:
    case RpcMethod::kGetCalibration:
    case RpcMethod::kListCalibrations:
    case RpcMethod::kGetDeviceHandles:
    case RpcMethod::kGetHostHandles:
      return Role::kRead;
  }
  return Role::kAdmin;  // an RPC added without a role: most restrictive
}

KvHarborService::KvHarborService(Store* store, ServiceOptions options,
                                 ServerMetrics* metrics,
                                 std::shared_ptr<const TokenStore> tokens)
    : store_(store),
      options_(options),
      metrics_(metrics),
      tokens_(std::move(tokens)),
      start_time_(absl::Now()),
      calls_(metrics, options.admission),
      idle_(IdleWatchdog::TickFor(
                std::min(options.upload_idle_timeout > absl::ZeroDuration()
                             ? options.upload_idle_timeout
                             : absl::InfiniteDuration(),
                         options.fetch_idle_timeout > absl::ZeroDuration()
                             ? options.fetch_idle_timeout
                             : absl::InfiniteDuration())),
            [this] { calls_.NoteIdleCancelled(); }),
      pool_(std::clamp<int>(std::thread::hardware_concurrency(), 2, 8)) {}

absl::StatusOr<Caller> KvHarborService::Accept(grpc::CallbackServerContext* ctx,
                                               CallRecord* call) {
  KVH_RETURN_IF_ERROR(calls_.Begin(call));
  KVH_RETURN_IF_ERROR(CallAlive(*ctx, RpcMethodName(call->method)));
  // Authenticated first: a caller without a valid token takes no place.
  KVH_ASSIGN_OR_RETURN(Caller caller, Authorize(ctx, call->method));
  KVH_RETURN_IF_ERROR(calls_.Admit(
      call, caller.unrestricted ? absl::string_view() : caller.tenant,
      ctx->peer()));
  return caller;
}

absl::StatusOr<Caller> KvHarborService::Authorize(
    grpc::CallbackServerContext* ctx, RpcMethod rpc) const {
  if (tokens_ == nullptr) return Caller::Unrestricted();
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "authorization: missing; this daemon needs a bearer token "
        "(metadata 'authorization: Bearer <token>')");
  }
  KVH_ASSIGN_OR_RETURN(Caller caller,
                       tokens_->Authenticate(absl::string_view(
                           it->second.data(), it->second.size())));
  const Role need = RequiredRole(rpc);
  if (caller.role < need) {
    return absl::PermissionDeniedError(
        absl::StrCat("role: ", RpcMethodName(rpc), " needs role '",
                     RoleName(need), "'; this token (tenant '", caller.tenant,
                     "') has role '", RoleName(caller.role), "'"));
  }
  return caller;
}

absl::StatusOr<std::shared_ptr<Namespace>> KvHarborService::FindLease(
    uint64_t lease_id, const Caller& caller) const {
  KVH_RETURN_IF_ERROR(CheckLeaseId(lease_id));
  // Lease ids are unique store-wide; only the caller's namespaces are
  // searched, so another tenant's lease reads like one that expired.
  for (const auto& ns : VisibleNamespaces(*store_, caller)) {
    if (ns->HasLease(lease_id)) return ns;
  }
  return absl::NotFoundError(
      absl::StrCat("lease_id: ", lease_id, " is not an active lease"));
}

template <typename Body>
grpc::ServerUnaryReactor* KvHarborService::Unary(
    grpc::CallbackServerContext* ctx, RpcMethod rpc, Body&& body) {
  CallRecord call(rpc);
  const absl::StatusOr<Caller> caller = Accept(ctx, &call);
  auto* reactor = new UnaryReactor(&calls_);
  FinishUnary(reactor, &call, caller.ok() ? body(*caller) : caller.status());
  return reactor;
}

template <typename Body>
grpc::ServerUnaryReactor* KvHarborService::UnaryOnPool(
    grpc::CallbackServerContext* ctx, RpcMethod rpc, Body body) {
  CallRecord call(rpc);
  absl::StatusOr<Caller> caller = Accept(ctx, &call);
  auto* reactor = new UnaryReactor(&calls_);
  if (!caller.ok()) {
    FinishUnary(reactor, &call, caller.status());
    return reactor;
  }
  const std::string tenant = caller->tenant;
  // The call holds its admitted place while it waits: a tenant's queue is
  // bounded by its in-flight limit.
  pool_.Run(tenant, [this, ctx, reactor, call, caller = *std::move(caller),
                     body = std::move(body)]() mutable {
    // A call that ended while it waited does no work.
    absl::Status status = CallAlive(*ctx, RpcMethodName(call.method));
    if (status.ok()) status = body(caller);
    FinishUnary(reactor, &call, status);
  });
  return reactor;
}

void KvHarborService::FinishUnary(grpc::ServerUnaryReactor* reactor,
                                  CallRecord* call,
                                  const absl::Status& status) {
  if (!status.ok()) {
    spdlog::debug("{} failed: {}", std::string(RpcMethodName(call->method)),
                  status.ToString());
  }
  static_cast<UnaryReactor*>(reactor)->FinishCall(
      *call, calls_.Finishing(call, status));
}

// ---- Namespaces ----

absl::Status KvHarborService::DoCreateNamespace(
    const Caller& caller, const v1::CreateNamespaceRequest& req,
    v1::CreateNamespaceResponse* resp) {
  if (!req.has_spec()) {
    return absl::InvalidArgumentError("spec: required");
  }
  KVH_ASSIGN_OR_RETURN(NamespaceSpec spec,
                       NamespaceSpecFromProto(req.spec(), "spec"));
  spec.tenant = caller.tenant;  // from the token, never from the request
  if (!caller.unrestricted) {
    // Paths on the daemon's machine would let one tenant read or write
    // files (another tenant's disk tier included): config file only.
    for (const auto& [value, field] :
         {std::pair<const std::string&, const char*>{spec.disk_dir,
                                                     "spec.disk_dir"},
          {spec.calibration_path, "spec.calibration_path"},
          {spec.kvcm_path, "spec.kvcm_path"}}) {
      if (!value.empty()) {
        return absl::PermissionDeniedError(absl::StrCat(
            field,
            ": paths on the daemon's machine are set in its config file "
            "when tokens are on (send calibration bytes inline instead)"));
      }
    }
  }
  KVH_ASSIGN_OR_RETURN(auto created,
                       store_->CreateNamespace(spec, req.if_not_exists()));
  const std::shared_ptr<Namespace>& ns = created.first;
  if (created.second) {
    spdlog::info("namespace '{}' created: {} capacity={} bytes codec={}{}",
                 ns->name(), ns->config().geometry.DebugString(),
                 ns->config().capacity_bytes, ns->config().codec,
                 ns->config().kvcm_path.empty()
                     ? ""
                     : " kvcm=" + ns->config().kvcm_path);
  }
  NamespaceInfoToProto(*ns, resp->mutable_info());
  AddLocalPaths(resp->mutable_info());
  resp->set_created(created.second);
  return absl::OkStatus();
}

void KvHarborService::AddLocalPaths(v1::NamespaceInfo* info) const {
  info->set_staging_socket(options_.staging_socket);
  info->set_daemon_id(options_.daemon_id);
}

absl::Status KvHarborService::DoDescribeNamespace(
    const Caller& caller, const v1::DescribeNamespaceRequest& req,
    v1::NamespaceInfo* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  NamespaceInfoToProto(*ns, resp);
  AddLocalPaths(resp);
  return absl::OkStatus();
}

absl::Status KvHarborService::DoListNamespaces(
    const Caller& caller, v1::ListNamespacesResponse* resp) {
  for (const std::shared_ptr<Namespace>& ns :
       VisibleNamespaces(*store_, caller)) {
    v1::NamespaceInfo* info = resp->add_namespaces();
    NamespaceInfoToProto(*ns, info);
    AddLocalPaths(info);
  }
  return absl::OkStatus();
}

absl::Status KvHarborService::DoDeleteNamespace(
    const Caller& caller, const v1::DeleteNamespaceRequest& req) {
  KVH_RETURN_IF_ERROR(RequestNamespace(caller, req).status());
  KVH_RETURN_IF_ERROR(NameField(
      store_->DeleteNamespace(req.namespace_(), req.force()), "namespace"));
  spdlog::info("namespace '{}' deleted{}", req.namespace_(),
               req.force() ? " (forced)" : "");
  if (metrics_ != nullptr) metrics_->ForgetNamespace(req.namespace_());
  return absl::OkStatus();
}

// ---- Match and leases ----

absl::Status KvHarborService::DoMatch(const grpc::CallbackServerContext& ctx,
                                      const Caller& caller,
                                      const v1::MatchRequest& req,
                                      v1::MatchResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_ASSIGN_OR_RETURN(Elements seq, SequenceFromProto(*ns, req.token_ids(),
                                                       req.page_keys(), ""));
  // A long walk stops when the client gave up (issue 18: it ran on for
  // seconds after the deadline).
  KVH_ASSIGN_OR_RETURN(
      Namespace::MatchOutcome m,
      ns->Match(seq.elements, req.lock(), TtlFromProto(req.lease_ttl_ms()),
                [&ctx] { return CallAlive(ctx, "Match"); }));
  // A client that gave up during the walk would never learn the lease id;
  // release the lease now instead of leaving the pages pinned for its TTL.
  if (absl::Status alive = CallAlive(ctx, "Match"); !alive.ok()) {
    if (m.lease_id != 0) store_->Release(m.lease_id).IgnoreError();
    return alive;
  }
  resp->set_matched_tokens(m.matched_tokens);
  resp->mutable_page_handles()->Reserve(static_cast<int>(m.pages.size()));
  for (PageHandle h : m.pages) resp->add_page_handles(h);
  resp->mutable_page_tiers()->Reserve(static_cast<int>(m.tiers.size()));
  for (Tier t : m.tiers) resp->add_page_tiers(TierToProto(t));
  resp->set_lease_id(m.lease_id);
  if (m.lease_id != 0) {
    resp->set_lease_expires_unix_ms(UnixMillisToProto(m.lease_expiry));
  }
  resp->set_page_bytes(ns->page_bytes());
  if (metrics_ != nullptr) metrics_->ObserveMatch(ns->name(), m.matched_tokens);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::Match(
    grpc::CallbackServerContext* ctx, const v1::MatchRequest* req,
    v1::MatchResponse* resp) {
  auto body = [this, ctx, req, resp](const Caller& caller) {
    return DoMatch(*ctx, caller, *req, resp);
  };
  if (req->token_ids_size() >= kPoolMatchElements ||
      static_cast<uint64_t>(req->page_keys_size()) * kPageKeyWords >=
          kPoolMatchElements) {
    return UnaryOnPool(ctx, RpcMethod::kMatch, std::move(body));
  }
  return Unary(ctx, RpcMethod::kMatch, std::move(body));
}

absl::Status KvHarborService::DoRelease(const Caller& caller,
                                        const v1::ReleaseRequest& req) {
  KVH_ASSIGN_OR_RETURN(auto ns, FindLease(req.lease_id(), caller));
  return NameField(ns->Release(req.lease_id()), "lease_id");
}

absl::Status KvHarborService::DoExtendLease(const Caller& caller,
                                            const v1::ExtendLeaseRequest& req,
                                            v1::ExtendLeaseResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, FindLease(req.lease_id(), caller));
  absl::StatusOr<absl::Time> expiry =
      ns->ExtendLease(req.lease_id(), TtlFromProto(req.lease_ttl_ms()));
  if (!expiry.ok()) return NameField(expiry.status(), "lease_id");
  resp->set_lease_expires_unix_ms(UnixMillisToProto(*expiry));
  return absl::OkStatus();
}

// ---- Insert and Fetch ----

grpc::ServerBidiReactor<v1::DeviceInsertRequest, v1::DeviceInsertResponse>*
KvHarborService::DeviceInsert(grpc::CallbackServerContext* ctx) {
  CallRecord call(RpcMethod::kDeviceInsert);
  // Admitted like Insert (the tenant's in-flight limit), and watched for
  // idleness like it until its begin arrives; then no more: between its
  // slots answer and its commit the client copies on its GPU, and the
  // upload's TTL bounds that wait (DeviceUploadTable).
  absl::StatusOr<Caller> caller = Accept(ctx, &call);
  IdleWatchdog::Entry* idle =
      caller.ok() ? idle_.Watch(ctx, options_.upload_idle_timeout) : nullptr;
  return new DeviceInsertReactor(ctx, store_, &calls_, &device_uploads_, call,
                                 std::move(caller), &idle_, idle);
}

grpc::ServerReadReactor<v1::InsertRequest>* KvHarborService::Insert(
    grpc::CallbackServerContext* ctx, v1::InsertResponse* resp) {
  CallRecord call(RpcMethod::kInsert);
  absl::StatusOr<Caller> caller = Accept(ctx, &call);
  IdleWatchdog::Entry* idle =
      caller.ok() ? idle_.Watch(ctx, options_.upload_idle_timeout) : nullptr;
  return new InsertReactor(ctx, store_, &calls_, call, std::move(caller), resp,
                           &idle_, idle, options_.staging,
                           options_.bulk_tickets, options_.bulk_port);
}

namespace {

// Pins the pages `req` names (a lease's range, or a list of handles) in
// `format`; errors name the request field.
absl::StatusOr<Namespace::PinnedPages> PinFetchSource(
    Namespace* ns, const v1::FetchRequest& req, FetchFormat format) {
  switch (req.source_case()) {
    case v1::FetchRequest::kLeaseId: {
      KVH_RETURN_IF_ERROR(CheckLeaseId(req.lease_id()));
      absl::StatusOr<Namespace::PinnedPages> pinned = ns->PinLease(
          req.lease_id(), req.start_page(), req.page_count(), format);
      if (!pinned.ok() &&
          pinned.status().code() == absl::StatusCode::kNotFound) {
        return NameField(pinned.status(), "lease_id");
      }
      return pinned;
    }
    case v1::FetchRequest::kPages: {
      if (req.start_page() != 0 || req.page_count() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            req.start_page() != 0 ? "start_page" : "page_count",
            ": only valid with lease_id (with pages, list exactly the pages "
            "to send)"));
      }
      if (req.pages().page_handles_size() == 0) {
        return absl::InvalidArgumentError("pages.page_handles: empty");
      }
      absl::StatusOr<Namespace::PinnedPages> pinned =
          ns->PinPages(HandlesFromProto(req.pages().page_handles()), format);
      if (!pinned.ok()) return NameField(pinned.status(), "pages.page_handles");
      return pinned;
    }
    case v1::FetchRequest::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "source: set lease_id or pages (neither was given)");
}

}  // namespace

absl::StatusOr<Namespace::PinnedPages> KvHarborService::PinForFetch(
    const Caller& caller, const v1::FetchRequest& req, FetchPlan* plan) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  plan->ns = ns;
  uint32_t* const chunk_bytes = &plan->chunk_bytes;
  FetchTransform* const transform = &plan->transform;
  if (req.max_chunk_bytes() == 0) {
    *chunk_bytes = options_.default_chunk_bytes;
  } else if (req.max_chunk_bytes() < kMinChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes: ", req.max_chunk_bytes(), " is below the minimum of ",
        kMinChunkBytes, " (0 = the daemon's default)"));
  } else {
    *chunk_bytes = std::min(req.max_chunk_bytes(), options_.max_chunk_bytes);
  }
  if (req.max_pages_per_message() > kMaxPagesPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pages_per_message: ", req.max_pages_per_message(),
                     " is above the maximum of ", kMaxPagesPerMessage,
                     " (0 or 1 = one page per message)"));
  }
  plan->pages_per_message = std::max<uint32_t>(1, req.max_pages_per_message());
  if (req.has_bulk()) {
    KVH_RETURN_IF_ERROR(CheckBulk(req.bulk(), "bulk"));
    // Refused before anything is pinned: the client then streams.
    if (options_.bulk_tickets == nullptr) {
      return absl::FailedPreconditionError(
          "bulk: this daemon serves no bulk data plane (config "
          "data_plane.listen); fetch without FetchRequest.bulk");
    }
    if (req.transform() != v1::FETCH_TRANSFORM_NONE) {
      return absl::FailedPreconditionError(
          "bulk: only fetches without a transform go on the bulk data "
          "plane; fetch without FetchRequest.bulk");
    }
  }
  KVH_ASSIGN_OR_RETURN(FetchFormat format,
                       FetchFormatFromProto(req.format(), "format"));
  KVH_ASSIGN_OR_RETURN(*transform,
                       FetchTransformFromProto(req.transform(), "transform"));
  if (*transform == FetchTransform::kKvcm) {
    if (format != FetchFormat::kRaw) {
      return absl::InvalidArgumentError(
          "transform: FETCH_TRANSFORM_KVCM needs format FETCH_FORMAT_RAW (the "
          "compressor runs on decoded pages and returns no codec buffers)");
    }
    if (ns->config().kvcm == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transform: FETCH_TRANSFORM_KVCM needs a namespace created with "
          "spec.kvcm_path; namespace '",
          ns->name(), "' has none"));
    }
  }
  if (req.layer_begin() != 0 || req.layer_end() != 0) {
    if (format != FetchFormat::kRaw || *transform != FetchTransform::kNone) {
      return absl::InvalidArgumentError(
          "layer_begin: a layer range needs format FETCH_FORMAT_RAW and no "
          "transform (a codec buffer holds every layer of its page)");
    }
    const Geometry& g = ns->config().geometry;
    KVH_ASSIGN_OR_RETURN(
        LayerRange r, ResolveLayerRange(g, req.layer_begin(), req.layer_end(),
                                        "layer_begin", "layer_end"));
    if (r.count() < g.num_layers) plan->runs = LayerRuns(g, r);
  }
  return PinFetchSource(ns.get(), req, format);
}

grpc::ServerWriteReactor<v1::FetchResponse>* KvHarborService::Fetch(
    grpc::CallbackServerContext* ctx, const v1::FetchRequest* req) {
  CallRecord call(RpcMethod::kFetch);
  FetchPlan plan;
  const absl::StatusOr<Caller> caller = Accept(ctx, &call);
  absl::StatusOr<Namespace::PinnedPages> pinned =
      caller.ok() ? PinForFetch(*caller, *req, &plan)
                  : absl::StatusOr<Namespace::PinnedPages>(caller.status());
  if (pinned.ok() && plan.transform == FetchTransform::kKvcm) {
    absl::StatusOr<TransformedKv> transformed =
        TransformPinned(*plan.ns, *pinned);
    // The transform is the long part; one whose client left is dropped here.
    if (transformed.ok()) {
      const absl::Status alive = CallAlive(*ctx, "Fetch (transform)");
      if (!alive.ok()) transformed = alive;
    }
    if (transformed.ok()) {
      return new FetchReactor(
          ctx, &calls_, call, *std::move(pinned), plan.chunk_bytes, &idle_,
          idle_.Watch(ctx, options_.fetch_idle_timeout), PageRuns(),
          /*pages_per_message=*/1, *std::move(transformed));
    }
    pinned = transformed.status();
  }
  if (!pinned.ok()) {
    if (pinned.status().code() == absl::StatusCode::kDataLoss) {
      spdlog::warn("Fetch from '{}' found corrupt data: {}", req->namespace_(),
                   std::string(pinned.status().message()));
    } else {
      spdlog::debug("Fetch failed: {}", pinned.status().ToString());
    }
    return new FetchReactor(ctx, &calls_, call, ToGrpcStatus(pinned.status()));
  }
  // No pages: the stream alone answers at once (nothing would connect).
  if (req->has_bulk() && options_.bulk_tickets != nullptr &&
      pinned->size() > 0 && plan.transform == FetchTransform::kNone) {
    BulkTicket::Options bulk;
    bulk.connections = req->bulk().connections();
    bulk.stripe_pages = req->bulk().stripe_pages();
    return new BulkFetchReactor(&calls_, call, *std::move(pinned), bulk,
                                plan.runs, options_.bulk_tickets,
                                options_.bulk_port, &idle_,
                                idle_.Watch(ctx, options_.fetch_idle_timeout));
  }
  return new FetchReactor(ctx, &calls_, call, *std::move(pinned),
                          plan.chunk_bytes, &idle_,
                          idle_.Watch(ctx, options_.fetch_idle_timeout),
                          plan.runs, plan.pages_per_message);
}

// ---- Tiers ----

absl::Status KvHarborService::DoGetCalibration(
    const Caller& caller, const v1::GetCalibrationRequest& req,
    v1::GetCalibrationResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_ASSIGN_OR_RETURN(auto cal,
                       ns->calibrations().Get(req.calibration_fingerprint()));
  resp->set_codec(cal.first);
  resp->set_calibration(*cal.second);
  resp->set_calibration_fingerprint(
      req.calibration_fingerprint() != 0
          ? req.calibration_fingerprint()
          : ns->calibrations().status().fingerprint);
  return absl::OkStatus();
}

absl::Status KvHarborService::DoUploadCalibration(
    const Caller& caller, const v1::UploadCalibrationRequest& req,
    v1::UploadCalibrationResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_ASSIGN_OR_RETURN(
      const uint64_t fp,
      ns->calibrations().Upload(req.calibration(), req.pin(), "calibration"));
  resp->set_calibration_fingerprint(fp);
  return absl::OkStatus();
}

absl::Status KvHarborService::DoListCalibrations(
    const Caller& caller, const v1::ListCalibrationsRequest& req,
    v1::ListCalibrationsResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  for (const CalibrationInfo& info : ns->ListCalibrations()) {
    CalibrationInfoToProto(info, resp->add_calibrations());
  }
  return absl::OkStatus();
}

absl::Status KvHarborService::DoPinCalibration(
    const Caller& caller, const v1::PinCalibrationRequest& req) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  return ns->calibrations().Pin(req.calibration_fingerprint(), req.pinned());
}

absl::Status KvHarborService::DoDemote(const Caller& caller,
                                       const v1::DemoteRequest& req,
                                       v1::DemoteResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_ASSIGN_OR_RETURN(Tier tier, TierFromProto(req.tier(), "tier"));
  if (tier == Tier::kRaw) {
    return absl::InvalidArgumentError(
        "tier: TIER_RAW is not a demotion target (use TIER_HOST_COMPRESSED "
        "or TIER_DISK)");
  }
  absl::StatusOr<DemoteOutcome> out = ns->tiers().Demote(tier);
  if (!out.ok()) return NameField(out.status(), "tier");
  resp->set_pages_moved(out->pages_moved);
  resp->set_pages_to_host_compressed(out->to_host_compressed);
  resp->set_pages_to_disk(out->to_disk);
  resp->set_pages_left(out->pages_left);
  return absl::OkStatus();
}

// ---- Eviction, stats, debugging ----

absl::Status KvHarborService::DoEvict(const Caller& caller,
                                      const v1::EvictRequest& req,
                                      v1::EvictResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  Namespace::EvictOutcome out;
  switch (req.target_case()) {
    case v1::EvictRequest::kPages: {
      if (req.pages().page_handles_size() == 0) {
        return absl::InvalidArgumentError("pages.page_handles: empty");
      }
      absl::StatusOr<Namespace::EvictOutcome> r =
          ns->EvictPages(HandlesFromProto(req.pages().page_handles()));
      if (!r.ok()) return NameField(r.status(), "pages.page_handles");
      out = *r;
      break;
    }
    case v1::EvictRequest::kBytes:
      if (req.bytes() == 0) {
        return absl::InvalidArgumentError("bytes: must be > 0");
      }
      out = ns->EvictBytes(req.bytes());
      break;
    case v1::EvictRequest::kAll:
      if (!req.all()) {
        return absl::InvalidArgumentError(
            "all: must be true (false selects nothing)");
      }
      out = ns->EvictAll();
      break;
    case v1::EvictRequest::TARGET_NOT_SET:
      return absl::InvalidArgumentError(
          "target: set pages, bytes or all (none was given)");
  }
  if (out.pages > 0) {
    spdlog::info("namespace '{}': Evict removed {} pages ({} bytes)",
                 ns->name(), out.pages, out.bytes);
  }
  resp->set_pages_evicted(out.pages);
  resp->set_bytes_freed(out.bytes);
  return absl::OkStatus();
}

absl::Status KvHarborService::DoStats(const Caller& caller,
                                      const v1::StatsRequest& req,
                                      v1::StatsResponse* resp) {
  if (req.namespace_().empty()) {
    for (const std::shared_ptr<Namespace>& ns :
         VisibleNamespaces(*store_, caller)) {
      NamespaceStatsToProto(ns->Counters(), resp->add_namespaces());
    }
  } else {
    KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
    NamespaceStatsToProto(ns->Counters(), resp->add_namespaces());
  }
  // The store-wide totals are the daemon's own admin's view; every other
  // caller, a tenant's admin included, gets the totals of its tenant's
  // namespaces, which say nothing about other tenants.
  GlobalStats global = caller.daemon_admin ? store_->Counters()
                                           : TenantCounters(*store_, caller);
  global.uptime_seconds = absl::ToInt64Seconds(absl::Now() - start_time_);
  GlobalStatsToProto(global, resp->mutable_global());
  return absl::OkStatus();
}

absl::Status KvHarborService::DoDumpTree(const Caller& caller,
                                         const v1::DumpTreeRequest& req,
                                         v1::DumpTreeResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  if (req.max_nodes() > kMaxDumpNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_nodes: ", req.max_nodes(), " is over the limit of ",
                     kMaxDumpNodes));
  }
  const uint32_t max_nodes =
      req.max_nodes() == 0 ? kDefaultDumpNodes : req.max_nodes();
  resp->set_text(ns->DumpTree(max_nodes));
  resp->set_nodes(ns->Counters().index_nodes);
  return absl::OkStatus();
}

// ---- The unary RPCs ----
// Each runs its Do* body through Unary() (in-flight count, caller's
// authorization, drain and deadline checks, status mapping); Match, which
// may go to the work pool, is written out above.
#define KVH_UNARY_RPC(Method, Request, Response, body)          \
  grpc::ServerUnaryReactor* KvHarborService::Method(            \
      grpc::CallbackServerContext* ctx, const v1::Request* req, \
      v1::Response* resp) {                                     \
    return Unary(ctx, RpcMethod::k##Method,                     \
                 [&](const Caller& caller) { return body; });   \
  }

#define KVH_PLAIN_UNARY_RPC(Method, Request, Response) \
  KVH_UNARY_RPC(Method, Request, Response, Do##Method(caller, *req, resp))
KVH_PLAIN_UNARY_RPCS(KVH_PLAIN_UNARY_RPC)
#undef KVH_PLAIN_UNARY_RPC
KVH_UNARY_RPC(ListNamespaces, ListNamespacesRequest, ListNamespacesResponse,
              DoListNamespaces(caller, resp))
KVH_UNARY_RPC(DeleteNamespace, DeleteNamespaceRequest, DeleteNamespaceResponse,
              DoDeleteNamespace(caller, *req))
KVH_UNARY_RPC(Release, ReleaseRequest, ReleaseResponse, DoRelease(caller, *req))
KVH_UNARY_RPC(PinCalibration, PinCalibrationRequest, PinCalibrationResponse,
              DoPinCalibration(caller, *req))

#undef KVH_UNARY_RPC

}  // namespace kvharbor
