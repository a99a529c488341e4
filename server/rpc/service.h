// KvHarborService: the kvharbor.v1.KvHarbor gRPC service on the callback API.
//
// Unary RPCs run to completion inside the handler (the core calls only take
// short namespace locks) and finish through a minimal reactor that keeps the
// call counted in flight (CallTracker) until gRPC is done with it.
// Insert and Fetch are streams with their own reactors (insert_reactor.h,
// fetch_reactor.h). Every call passes admission control
// (ServiceOptions::max_in_flight_calls) and is checked against its deadline
// before any work, and again between the steps of long work (Fetch chunks,
// Insert chunks, after Match): a call whose client gave up stops and frees
// what it held -- pins, staged slots, a lease taken for it. Every input is
// validated here or by the core, and every error reaches the client through
// ToGrpcStatus with a message naming the field.
//
// The service does not own the Store; the Store must outlive the gRPC server
// the service is registered with (the Daemon arranges that). Thread-safe:
// gRPC calls the handlers concurrently; all shared state is in the Store.
#ifndef KVHARBOR_SERVER_RPC_SERVICE_H_
#define KVHARBOR_SERVER_RPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "server/data/bulk_ticket_table.h"
#include "server/local/staging_registry.h"
#include "server/metrics/server_metrics.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/device_insert_reactor.h"
#include "server/rpc/fetch_transform.h"
#include "server/rpc/idle_watchdog.h"
#include "server/rpc/request_checks.h"
#include "server/rpc/work_pool.h"
#include "server/security/auth.h"
#include "types/layer_range.h"

namespace kvharbor {

// Smallest FetchRequest.max_chunk_bytes accepted (besides 0 = default):
// smaller chunks would only multiply per-message overhead.
inline constexpr uint32_t kMinChunkBytes = 1024;
// Largest FetchRequest.max_pages_per_message: a bound on the metadata of
// one message (pages fit the chunk limit long before it at real sizes).
inline constexpr uint32_t kMaxPagesPerMessage = 4096;
// Largest DumpTreeRequest.max_nodes; 0 means kDefaultDumpNodes.
inline constexpr uint32_t kMaxDumpNodes = 100000;
inline constexpr uint32_t kDefaultDumpNodes = 1000;

struct ServiceOptions {
  uint32_t default_chunk_bytes = 1 << 20;
  uint32_t max_chunk_bytes = (4 << 20) - (64 << 10);
  // In-flight limits (limits.max_in_flight_calls*; 0: no limit). The
  // per-tenant one applies only with tokens.
  AdmissionLimits admission;
  // Insert and Fetch streams idle this long are cancelled (zero: never;
  // server/rpc/idle_watchdog.h).
  absl::Duration upload_idle_timeout = absl::ZeroDuration();
  absl::Duration fetch_idle_timeout = absl::ZeroDuration();
  // Same-host Fetch through shared memory: the socket that hands out the
  // store's shared host arena ("" = not served) and the daemon's random
  // identity, both sent with GetHostHandles (server/local/host_ipc_server.h).
  std::string host_ipc_socket;
  uint64_t daemon_id = 0;
  // Same-host Insert through shared memory: the staging socket's path ("" =
  // not served; sent in NamespaceInfo) and its registry (null = not
  // served; must outlive the service).
  std::string staging_socket;
  StagingRegistry* staging = nullptr;
  // The bulk data plane (docs/data_plane.md): the tickets of its transfers
  // (null = not served; must outlive the service) and its TCP port.
  BulkTicketTable* bulk_tickets = nullptr;
  uint16_t bulk_port = 0;
};

// The unary RPCs whose body is Do<Method>(caller, request, response), as
// X(Method, Request, Response): the one list their overrides, their bodies'
// declarations (below) and their definitions (server/rpc/service.cc) expand.
#define KVH_PLAIN_UNARY_RPCS(X)                                             \
  X(CreateNamespace, CreateNamespaceRequest, CreateNamespaceResponse)       \
  X(DescribeNamespace, DescribeNamespaceRequest, NamespaceInfo)             \
  X(ExtendLease, ExtendLeaseRequest, ExtendLeaseResponse)                   \
  X(Evict, EvictRequest, EvictResponse)                                     \
  X(Stats, StatsRequest, StatsResponse)                                     \
  X(DumpTree, DumpTreeRequest, DumpTreeResponse)                            \
  X(GetCalibration, GetCalibrationRequest, GetCalibrationResponse)          \
  X(Demote, DemoteRequest, DemoteResponse)                                  \
  X(UploadCalibration, UploadCalibrationRequest, UploadCalibrationResponse) \
  X(ListCalibrations, ListCalibrationsRequest, ListCalibrationsResponse)    \
  X(GetDeviceHandles, GetDeviceHandlesRequest, GetDeviceHandlesResponse)    \
  X(GetHostHandles, GetHostHandlesRequest, GetHostHandlesResponse)

class KvHarborService final : public v1::KvHarbor::CallbackService {
 public:
  // `metrics` (may be null) records calls and matches; it must outlive the
  // service. With `tokens` every call needs a bearer token whose role
  // allows the RPC, and sees only its tenant's namespaces; without, every
  // caller sees everything (server/security/auth.h).
  KvHarborService(Store* store, ServiceOptions options,
                  ServerMetrics* metrics = nullptr,
                  std::shared_ptr<const TokenStore> tokens = nullptr);

  // Calls in flight; the daemon drains them at shutdown.
  CallTracker& calls() { return calls_; }
  // Where long calls run (server/rpc/work_pool.h).
  WorkPool& pool() { return pool_; }

  // The unary RPCs, defined in server/rpc/service.cc (all but Match by its
  // KVH_UNARY_RPC; GetDeviceHandles and GetHostHandles run the bodies in
  // server/rpc/device_handles.cc and server/rpc/host_handles.cc).
#define KVH_DECLARE_UNARY_RPC(Method, Request, Response)                       \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx,           \
                                   const v1::Request* req, v1::Response* resp) \
      override;
  KVH_PLAIN_UNARY_RPCS(KVH_DECLARE_UNARY_RPC)
  KVH_DECLARE_UNARY_RPC(ListNamespaces, ListNamespacesRequest,
                        ListNamespacesResponse)
  KVH_DECLARE_UNARY_RPC(DeleteNamespace, DeleteNamespaceRequest,
                        DeleteNamespaceResponse)
  KVH_DECLARE_UNARY_RPC(Match, MatchRequest, MatchResponse)
  KVH_DECLARE_UNARY_RPC(Release, ReleaseRequest, ReleaseResponse)
  KVH_DECLARE_UNARY_RPC(PinCalibration, PinCalibrationRequest,
                        PinCalibrationResponse)
#undef KVH_DECLARE_UNARY_RPC

  grpc::ServerReadReactor<v1::InsertRequest>* Insert(
      grpc::CallbackServerContext* ctx, v1::InsertResponse* resp) override;
  grpc::ServerWriteReactor<v1::FetchResponse>* Fetch(
      grpc::CallbackServerContext* ctx, const v1::FetchRequest* req) override;
  // Same-host insert into device slots by CUDA IPC
  // (server/rpc/device_insert_reactor.h).
  grpc::ServerBidiReactor<v1::DeviceInsertRequest, v1::DeviceInsertResponse>*
  DeviceInsert(grpc::CallbackServerContext* ctx) override;
  // Aborts DeviceInsert uploads whose TTL ran out (the daemon's reaper
  // calls it); returns how many.
  size_t ReapDeviceUploads(absl::Time now) {
    return device_uploads_.AbortExpired(now);
  }

 private:
  // The daemon-wide same-host fields of a NamespaceInfo (staging_socket,
  // daemon_id).
  void AddLocalPaths(v1::NamespaceInfo* info) const;
  // The request fuzzer (fuzz/requests_fuzz.cc) calls the Do* bodies below
  // in process without the gRPC transport -- the same validation and
  // handlers, at a rate the transport's thread hops would cut tenfold.
  friend class KvHarborServicePeer;

  // Runs a unary RPC: counts it in flight, authorizes the caller, runs
  // `body` (an absl::Status function of the Caller) unless draining, over
  // the in-flight limit or past its deadline, and finishes with its status.
  template <typename Body>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx,
                                  RpcMethod rpc, Body&& body);
  // The same, with `body` run on pool_ (a long call: server/rpc/work_pool.h);
  // `body` must own or outlive what it uses until the call finishes.
  template <typename Body>
  grpc::ServerUnaryReactor* UnaryOnPool(grpc::CallbackServerContext* ctx,
                                        RpcMethod rpc, Body body);
  // Logs a failure, gives back the call's admitted place and finishes the
  // call (`reactor` is a unary reactor of this service).
  void FinishUnary(grpc::ServerUnaryReactor* reactor, CallRecord* call,
                   const absl::Status& status);
  // The caller of `ctx`: UNAUTHENTICATED without a valid token,
  // PERMISSION_DENIED when its role does not allow `rpc`.
  absl::StatusOr<Caller> Authorize(grpc::CallbackServerContext* ctx,
                                   RpcMethod rpc) const;
  // Begins `call` and, unless draining, past its deadline or not
  // authorized, admits it under the in-flight limits: the caller, or why
  // the call is refused.
  absl::StatusOr<Caller> Accept(grpc::CallbackServerContext* ctx,
                                CallRecord* call);
  // The namespace `req` names in its `namespace` field, as `caller` may see
  // it (FindNamespace).
  template <typename Request>
  absl::StatusOr<std::shared_ptr<Namespace>> RequestNamespace(
      const Caller& caller, const Request& req) const {
    return FindNamespace(*store_, req.namespace_(), "namespace", caller);
  }
  // The caller's namespace holding `lease_id`; NotFound otherwise.
  absl::StatusOr<std::shared_ptr<Namespace>> FindLease(
      uint64_t lease_id, const Caller& caller) const;

  // The bodies of the unary RPCs: plain functions from request to response
  // (those of KVH_PLAIN_UNARY_RPCS declared by KVH_DECLARE_DO).
#define KVH_DECLARE_DO(Method, Request, Response)                       \
  absl::Status Do##Method(const Caller& caller, const v1::Request& req, \
                          v1::Response* resp);
  KVH_PLAIN_UNARY_RPCS(KVH_DECLARE_DO)
#undef KVH_DECLARE_DO
  absl::Status DoListNamespaces(const Caller& caller,
                                v1::ListNamespacesResponse* resp);
  absl::Status DoDeleteNamespace(const Caller& caller,
                                 const v1::DeleteNamespaceRequest& req);
  absl::Status DoMatch(const grpc::CallbackServerContext& ctx,
                       const Caller& caller, const v1::MatchRequest& req,
                       v1::MatchResponse* resp);
  absl::Status DoRelease(const Caller& caller, const v1::ReleaseRequest& req);
  absl::Status DoPinCalibration(const Caller& caller,
                                const v1::PinCalibrationRequest& req);
  // How a Fetch sends its pinned pages.
  struct FetchPlan {
    uint32_t chunk_bytes = 0;
    std::shared_ptr<Namespace> ns;  // the one pinned from, not a namesake
    FetchTransform transform = FetchTransform::kNone;
    PageRuns runs;  // a layer range's runs of each page; count 0 = all
    uint32_t pages_per_message = 1;  // max_pages_per_message (0 -> 1)
  };
  // Checks the request and pins its pages, filling `plan`.
  absl::StatusOr<Namespace::PinnedPages> PinForFetch(
      const Caller& caller, const v1::FetchRequest& req, FetchPlan* plan);

  Store* const store_;
  const ServiceOptions options_;
  ServerMetrics* const metrics_;
  const std::shared_ptr<const TokenStore> tokens_;  // null: no auth
  const absl::Time start_time_;
  CallTracker calls_;
  DeviceUploadTable device_uploads_;
  IdleWatchdog idle_;
  // Last: destroyed first, after the server has ended every call.
  WorkPool pool_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_SERVICE_H_
