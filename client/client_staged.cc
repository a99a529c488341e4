// Client::InsertStaged: the Insert stream of a same-host insert whose page
// bytes the daemon reads out of the caller's registered staging region
// (include/kvharbor/staging_region.h): the header names the region, and
// each InsertStagedChunk says where the next bytes lie in it.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_format.h"
#include "client/client_impl.h"
#include "client/failed_write.h"
#include "client/insert_wire.h"
#include "client/proto_convert.h"
#include "kvharbor/client.h"

namespace kvharbor {

namespace {

// Bytes one InsertStagedChunk names: the daemon copies each before it reads
// the next message, so this bounds how long one copy holds a gRPC thread and
// how often the upload's idle watchdog hears from the call.
constexpr uint64_t kStagedChunkBytes = uint64_t{256} << 20;

}  // namespace

absl::StatusOr<client::InsertResult> Client::InsertStaged(
    absl::string_view ns, const client::Sequence& sequence,
    const client::StagingRegion& region, uint64_t offset, uint64_t bytes,
    absl::Span<const uint64_t> page_checksums,
    const client::InsertOptions& options, const CallOptions& call,
    const std::function<absl::Status(uint64_t end)>& filled) {
  if (offset > region.size() || region.size() - offset < bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "offset: %u bytes at offset %u do not lie in the %u-byte staging "
        "region",
        bytes, offset, region.size()));
  }
  grpc::ClientContext ctx;
  absl::Status s = impl_->Prepare(&ctx, call);
  if (!s.ok()) return s;
  v1::InsertRequest header_req;
  v1::InsertHeader* header = header_req.mutable_header();
  client::InsertHeaderToProto(ns, sequence, options.skip_pages,
                              options.prefix_lease_id, header);
  for (uint64_t sum : page_checksums) header->add_page_checksums(sum);
  header->mutable_staging()->set_id(region.id());
  header->mutable_staging()->set_key(region.key());
  v1::InsertResponse resp;
  std::unique_ptr<grpc::ClientWriter<client::InsertOut>> writer(
      grpc::internal::ClientWriterFactory<client::InsertOut>::Create(
          impl_->channel.get(), *impl_->insert_method, &ctx, &resp));
  client::InsertOut msg;
  msg.header = &header_req;
  bool sent = writer->Write(msg);
  v1::InsertRequest staged_req;
  msg.header = &staged_req;
  absl::Status fill;
  for (uint64_t done = 0; sent && done < bytes; done += kStagedChunkBytes) {
    const uint64_t length = std::min(kStagedChunkBytes, bytes - done);
    if (filled) {
      fill = filled(done + length);
      if (!fill.ok()) break;
    }
    v1::InsertStagedChunk* c = staged_req.mutable_staged();
    c->set_offset(done);
    c->set_staging_offset(offset + done);
    c->set_length(length);
    sent = writer->Write(msg);
  }
  if (!fill.ok()) {
    // The producer failed: the daemon aborts the upload, nothing stored.
    ctx.TryCancel();
    (void)writer->Finish();
    return fill;
  }
  if (sent) writer->WritesDone();
  const auto finish = [&] { return writer->Finish(); };
  s = client::FromGrpcStatus(
      sent ? finish() : client::FinishAfterFailedWrite(&ctx, finish, "Insert"));
  if (!s.ok()) return s;
  return client::FromProto(resp);
}

}  // namespace kvharbor
