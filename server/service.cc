#include "server/service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/convert.h"
#include "server/fetch_reactor.h"
#include "server/insert_reactor.h"
#include "server/status_map.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

// A unary call's reactor: counted in flight until OnDone.
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(CallTracker* calls, const CallRecord& call)
      : calls_(calls), call_(call) {}
  void OnDone() override {
    calls_->End(call_);
    delete this;
  }

 private:
  CallTracker* const calls_;
  const CallRecord call_;
};

absl::Status CheckLeaseId(uint64_t lease_id) {
  if (lease_id == 0) {
    return absl::InvalidArgumentError(
        "lease_id: 0 is not a lease (use the id Match(lock=true) returned)");
  }
  return absl::OkStatus();
}

// The namespace's KVCM compressor applied to raw pinned pages, in order.
absl::StatusOr<TransformedKv> TransformPinned(
    const Namespace& ns, const Namespace::PinnedPages& pinned) {
  std::vector<const uint8_t*> pages(pinned.size());
  for (size_t i = 0; i < pinned.size(); ++i) pages[i] = pinned.data(i);
  return TransformPages(*ns.config().kvcm, ns.config().geometry, pages);
}

}  // namespace

absl::Status NameField(const absl::Status& status, absl::string_view field) {
  if (status.ok() || absl::StartsWith(status.message(), field)) return status;
  absl::string_view msg = status.message();
  const size_t colon = msg.find(": ");
  if (colon != absl::string_view::npos &&
      absl::EndsWith(field, absl::StrCat(".", msg.substr(0, colon)))) {
    // "namespace: x" for field "header.namespace".
    return absl::Status(status.code(), absl::StrCat(field, msg.substr(colon)));
  }
  return absl::Status(status.code(), absl::StrCat(field, ": ", msg));
}

absl::Status UnderPrefix(const absl::Status& status, absl::string_view prefix) {
  absl::string_view msg = status.message();
  const size_t end = msg.find_first_not_of("abcdefghijklmnopqrstuvwxyz_");
  if (status.ok() || end == 0 || end == absl::string_view::npos ||
      (msg[end] != ':' && msg[end] != '[')) {
    return status;
  }
  return absl::Status(status.code(), absl::StrCat(prefix, ".", msg));
}

absl::StatusOr<std::shared_ptr<Namespace>> FindNamespace(
    const Store& store, absl::string_view name, absl::string_view field) {
  KVH_RETURN_IF_ERROR(ValidateNamespaceName(name, field));
  absl::StatusOr<std::shared_ptr<Namespace>> ns = store.Get(name);
  if (!ns.ok()) return NameField(ns.status(), field);
  return ns;
}

KvHarborService::KvHarborService(Store* store, ServiceOptions options,
                                 ServerMetrics* metrics)
    : store_(store),
      options_(options),
      metrics_(metrics),
      start_time_(absl::Now()),
      calls_(metrics) {}

template <typename Body>
grpc::ServerUnaryReactor* KvHarborService::Unary(RpcMethod rpc, Body&& body) {
  CallRecord call(rpc);
  absl::Status status = calls_.Begin();
  if (status.ok()) status = body();
  if (!status.ok()) {
    spdlog::debug("{} failed: {}", std::string(RpcMethodName(rpc)),
                  status.ToString());
  }
  const grpc::Status grpc_status = ToGrpcStatus(status);
  call.code = grpc_status.error_code();
  auto* reactor = new UnaryReactor(&calls_, call);
  reactor->Finish(grpc_status);
  return reactor;
}

// ---- Namespaces ----

absl::Status KvHarborService::DoCreateNamespace(
    const v1::CreateNamespaceRequest& req, v1::CreateNamespaceResponse* resp) {
  if (!req.has_spec()) {
    return absl::InvalidArgumentError("spec: required");
  }
  KVH_ASSIGN_OR_RETURN(NamespaceSpec spec,
                       NamespaceSpecFromProto(req.spec(), "spec"));
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
  resp->set_created(created.second);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::CreateNamespace(
    grpc::CallbackServerContext* ctx, const v1::CreateNamespaceRequest* req,
    v1::CreateNamespaceResponse* resp) {
  return Unary(RpcMethod::kCreateNamespace,
               [&] { return DoCreateNamespace(*req, resp); });
}

absl::Status KvHarborService::DoDescribeNamespace(
    const v1::DescribeNamespaceRequest& req, v1::NamespaceInfo* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  NamespaceInfoToProto(*ns, resp);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::DescribeNamespace(
    grpc::CallbackServerContext* ctx, const v1::DescribeNamespaceRequest* req,
    v1::NamespaceInfo* resp) {
  return Unary(RpcMethod::kDescribeNamespace,
               [&] { return DoDescribeNamespace(*req, resp); });
}

grpc::ServerUnaryReactor* KvHarborService::ListNamespaces(
    grpc::CallbackServerContext* ctx, const v1::ListNamespacesRequest* req,
    v1::ListNamespacesResponse* resp) {
  return Unary(RpcMethod::kListNamespaces, [&] {
    for (const std::shared_ptr<Namespace>& ns : store_->List()) {
      NamespaceInfoToProto(*ns, resp->add_namespaces());
    }
    return absl::OkStatus();
  });
}

absl::Status KvHarborService::DoDeleteNamespace(
    const v1::DeleteNamespaceRequest& req) {
  KVH_RETURN_IF_ERROR(
      FindNamespace(*store_, req.namespace_(), "namespace").status());
  KVH_RETURN_IF_ERROR(NameField(
      store_->DeleteNamespace(req.namespace_(), req.force()), "namespace"));
  spdlog::info("namespace '{}' deleted{}", req.namespace_(),
               req.force() ? " (forced)" : "");
  if (metrics_ != nullptr) metrics_->ForgetNamespace(req.namespace_());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::DeleteNamespace(
    grpc::CallbackServerContext* ctx, const v1::DeleteNamespaceRequest* req,
    v1::DeleteNamespaceResponse* resp) {
  return Unary(RpcMethod::kDeleteNamespace,
               [&] { return DoDeleteNamespace(*req); });
}

// ---- Match and leases ----

absl::Status KvHarborService::DoMatch(const v1::MatchRequest& req,
                                      v1::MatchResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  absl::Span<const Token> tokens = TokensFromProto(req.token_ids());
  KVH_RETURN_IF_ERROR(
      ValidateTokens(tokens, ns->config().max_tokens_per_request, "token_ids"));
  KVH_ASSIGN_OR_RETURN(
      Namespace::MatchOutcome m,
      ns->Match(tokens, req.lock(), TtlFromProto(req.lease_ttl_ms())));
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
  return Unary(RpcMethod::kMatch, [&] { return DoMatch(*req, resp); });
}

grpc::ServerUnaryReactor* KvHarborService::Release(
    grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
    v1::ReleaseResponse* resp) {
  return Unary(RpcMethod::kRelease, [&] {
    KVH_RETURN_IF_ERROR(CheckLeaseId(req->lease_id()));
    return NameField(store_->Release(req->lease_id()), "lease_id");
  });
}

absl::Status KvHarborService::DoExtendLease(const v1::ExtendLeaseRequest& req,
                                            v1::ExtendLeaseResponse* resp) {
  KVH_RETURN_IF_ERROR(CheckLeaseId(req.lease_id()));
  absl::StatusOr<absl::Time> expiry =
      store_->ExtendLease(req.lease_id(), TtlFromProto(req.lease_ttl_ms()));
  if (!expiry.ok()) return NameField(expiry.status(), "lease_id");
  resp->set_lease_expires_unix_ms(UnixMillisToProto(*expiry));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::ExtendLease(
    grpc::CallbackServerContext* ctx, const v1::ExtendLeaseRequest* req,
    v1::ExtendLeaseResponse* resp) {
  return Unary(RpcMethod::kExtendLease,
               [&] { return DoExtendLease(*req, resp); });
}

// ---- Insert and Fetch ----

grpc::ServerReadReactor<v1::InsertRequest>* KvHarborService::Insert(
    grpc::CallbackServerContext* ctx, v1::InsertResponse* resp) {
  CallRecord call(RpcMethod::kInsert);
  absl::Status accepted = calls_.Begin();
  return new InsertReactor(ctx, store_, &calls_, call, accepted, resp);
}

absl::StatusOr<Namespace::PinnedPages> KvHarborService::PinForFetch(
    const v1::FetchRequest& req, uint32_t* chunk_bytes,
    std::shared_ptr<Namespace>* ns_out, FetchTransform* transform) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  *ns_out = ns;
  if (req.max_chunk_bytes() == 0) {
    *chunk_bytes = options_.default_chunk_bytes;
  } else if (req.max_chunk_bytes() < kMinChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes: ", req.max_chunk_bytes(), " is below the minimum of ",
        kMinChunkBytes, " (0 = the daemon's default)"));
  } else {
    *chunk_bytes = std::min(req.max_chunk_bytes(), options_.max_chunk_bytes);
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

grpc::ServerWriteReactor<v1::FetchResponse>* KvHarborService::Fetch(
    grpc::CallbackServerContext* ctx, const v1::FetchRequest* req) {
  CallRecord call(RpcMethod::kFetch);
  absl::Status accepted = calls_.Begin();
  uint32_t chunk_bytes = 0;
  std::shared_ptr<Namespace> ns;  // the one pinned from, not a namesake
  FetchTransform transform = FetchTransform::kNone;
  absl::StatusOr<Namespace::PinnedPages> pinned =
      accepted.ok() ? PinForFetch(*req, &chunk_bytes, &ns, &transform)
                    : absl::StatusOr<Namespace::PinnedPages>(accepted);
  if (pinned.ok() && transform == FetchTransform::kKvcm) {
    absl::StatusOr<TransformedKv> transformed = TransformPinned(*ns, *pinned);
    if (transformed.ok()) {
      return new FetchReactor(&calls_, call, *std::move(pinned), chunk_bytes,
                              *std::move(transformed));
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
    return new FetchReactor(&calls_, call, ToGrpcStatus(pinned.status()));
  }
  return new FetchReactor(&calls_, call, *std::move(pinned), chunk_bytes);
}

// ---- Tiers ----

absl::Status KvHarborService::DoGetCalibration(
    const v1::GetCalibrationRequest& req, v1::GetCalibrationResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  KVH_ASSIGN_OR_RETURN(auto cal,
                       ns->GetCalibration(req.calibration_fingerprint()));
  resp->set_codec(cal.first);
  resp->set_calibration(*cal.second);
  resp->set_calibration_fingerprint(
      req.calibration_fingerprint() != 0
          ? req.calibration_fingerprint()
          : ns->calibration_status().active_fingerprint);
  return absl::OkStatus();
}

absl::Status KvHarborService::DoUploadCalibration(
    const v1::UploadCalibrationRequest& req,
    v1::UploadCalibrationResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  KVH_ASSIGN_OR_RETURN(
      const uint64_t fp,
      ns->UploadCalibration(req.calibration(), req.pin(), "calibration"));
  resp->set_calibration_fingerprint(fp);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::UploadCalibration(
    grpc::CallbackServerContext* ctx, const v1::UploadCalibrationRequest* req,
    v1::UploadCalibrationResponse* resp) {
  return Unary(RpcMethod::kUploadCalibration,
               [&] { return DoUploadCalibration(*req, resp); });
}

absl::Status KvHarborService::DoListCalibrations(
    const v1::ListCalibrationsRequest& req,
    v1::ListCalibrationsResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  for (const Namespace::CalibrationInfo& info : ns->ListCalibrations()) {
    CalibrationInfoToProto(info, resp->add_calibrations());
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::ListCalibrations(
    grpc::CallbackServerContext* ctx, const v1::ListCalibrationsRequest* req,
    v1::ListCalibrationsResponse* resp) {
  return Unary(RpcMethod::kListCalibrations,
               [&] { return DoListCalibrations(*req, resp); });
}

absl::Status KvHarborService::DoPinCalibration(
    const v1::PinCalibrationRequest& req) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  return ns->PinCalibration(req.calibration_fingerprint(), req.pinned());
}

grpc::ServerUnaryReactor* KvHarborService::PinCalibration(
    grpc::CallbackServerContext* ctx, const v1::PinCalibrationRequest* req,
    v1::PinCalibrationResponse* resp) {
  return Unary(RpcMethod::kPinCalibration,
               [&] { return DoPinCalibration(*req); });
}

grpc::ServerUnaryReactor* KvHarborService::GetCalibration(
    grpc::CallbackServerContext* ctx, const v1::GetCalibrationRequest* req,
    v1::GetCalibrationResponse* resp) {
  return Unary(RpcMethod::kGetCalibration,
               [&] { return DoGetCalibration(*req, resp); });
}

absl::Status KvHarborService::DoDemote(const v1::DemoteRequest& req,
                                       v1::DemoteResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
  KVH_ASSIGN_OR_RETURN(Tier tier, TierFromProto(req.tier(), "tier"));
  if (tier == Tier::kRaw) {
    return absl::InvalidArgumentError(
        "tier: TIER_RAW is not a demotion target (use TIER_HOST_COMPRESSED "
        "or TIER_DISK)");
  }
  absl::StatusOr<uint64_t> moved = ns->DemoteAll(tier);
  if (!moved.ok()) return NameField(moved.status(), "tier");
  resp->set_pages_moved(*moved);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::Demote(
    grpc::CallbackServerContext* ctx, const v1::DemoteRequest* req,
    v1::DemoteResponse* resp) {
  return Unary(RpcMethod::kDemote, [&] { return DoDemote(*req, resp); });
}

// ---- Eviction, stats, debugging ----

absl::Status KvHarborService::DoEvict(const v1::EvictRequest& req,
                                      v1::EvictResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
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

grpc::ServerUnaryReactor* KvHarborService::Evict(
    grpc::CallbackServerContext* ctx, const v1::EvictRequest* req,
    v1::EvictResponse* resp) {
  return Unary(RpcMethod::kEvict, [&] { return DoEvict(*req, resp); });
}

absl::Status KvHarborService::DoStats(const v1::StatsRequest& req,
                                      v1::StatsResponse* resp) {
  if (req.namespace_().empty()) {
    for (const std::shared_ptr<Namespace>& ns : store_->List()) {
      NamespaceStatsToProto(*ns, resp->add_namespaces());
    }
  } else {
    KVH_ASSIGN_OR_RETURN(auto ns,
                         FindNamespace(*store_, req.namespace_(), "namespace"));
    NamespaceStatsToProto(*ns, resp->add_namespaces());
  }
  StoreCountersToProto(store_->Counters(), absl::Now() - start_time_,
                       resp->mutable_global());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvHarborService::Stats(
    grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
    v1::StatsResponse* resp) {
  return Unary(RpcMethod::kStats, [&] { return DoStats(*req, resp); });
}

absl::Status KvHarborService::DoDumpTree(const v1::DumpTreeRequest& req,
                                         v1::DumpTreeResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns,
                       FindNamespace(*store_, req.namespace_(), "namespace"));
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

grpc::ServerUnaryReactor* KvHarborService::DumpTree(
    grpc::CallbackServerContext* ctx, const v1::DumpTreeRequest* req,
    v1::DumpTreeResponse* resp) {
  return Unary(RpcMethod::kDumpTree, [&] { return DoDumpTree(*req, resp); });
}

}  // namespace kvharbor
