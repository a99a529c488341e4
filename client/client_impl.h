// Client::Impl: the channel and stub behind kvharbor::Client, shared by
// client.cc (unary calls) and client_stream.cc (Insert and Fetch).
//
// Internal to the SDK (not installed). Immutable after construction except
// for the decoder cache, which locks itself, hence thread-safe; every call
// builds its own grpc::ClientContext.
#ifndef KVHARBOR_CLIENT_CLIENT_IMPL_H_
#define KVHARBOR_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/fetch_assembler.h"
#include "client/page_decoder.h"
#include "client/proto_convert.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"

namespace kvharbor {

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvHarbor::Stub> stub;
  // Fetch read through FetchSink (client/fetch_wire.h) rather than the
  // stub, so that page bytes go from gRPC's slices to the caller in one copy.
  std::unique_ptr<grpc::internal::RpcMethod> fetch_method;
  // Insert sent through InsertOut (client/insert_wire.h), for the same reason.
  std::unique_ptr<grpc::internal::RpcMethod> insert_method;

  // Deadline and wait-for-ready of one call. DEADLINE_EXCEEDED when the
  // deadline has already passed: the call is then not started at all, so
  // the outcome does not depend on how gRPC races its timer against a fast
  // reply.
  absl::Status Prepare(grpc::ClientContext* ctx, const CallOptions& call) const;

  // One unary RPC through `method` of the stub.
  template <typename Req, typename Resp>
  absl::Status Unary(grpc::Status (v1::KvHarbor::Stub::*method)(
                         grpc::ClientContext*, const Req&, Resp*),
                     const Req& req, Resp* resp,
                     const CallOptions& call) const {
    grpc::ClientContext ctx;
    absl::Status s = Prepare(&ctx, call);
    if (!s.ok()) return s;
    return client::FromGrpcStatus((stub.get()->*method)(&ctx, req, resp));
  }

  // The decoders of compressed fetches, with their calibrations (the only
  // mutable state; internally synchronized).
  std::unique_ptr<client::PageDecoder> decoder;

  // Fills a FetchRequest (RAW format) from `source`; returns the number of
  // pages it implies (0 = unknown, a lease fetched to its end).
  absl::StatusOr<uint32_t> BuildFetchRequest(absl::string_view ns,
                                             const client::FetchSource& source,
                                             v1::FetchRequest* req) const;

  // Runs a Fetch stream, handing every chunk to an assembler built from
  // `destination`.
  absl::StatusOr<client::FetchResult> Fetch(
      absl::string_view ns, const client::FetchSource& source,
      client::FetchAssembler::Destination destination,
      const CallOptions& call) const;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLIENT_IMPL_H_
