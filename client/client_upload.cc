// Client::BeginInsert and client::LayerUpload: a layer-major Insert stream
// held open across calls (include/kvharbor/layer_upload.h).
#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "client/client_impl.h"
#include "client/failed_write.h"
#include "client/insert_wire.h"
#include "core/memory/paged_kv_copy.h"
#include "kvharbor/client.h"
#include "kvharbor/layer_upload.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace client {

struct LayerUpload::State {
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  std::unique_ptr<grpc::ClientWriter<InsertOut>> writer;
  uint32_t chunk_bytes = 0;
  Geometry geometry;
  uint32_t num_layers = 0;
  uint32_t sent_pages = 0;
  uint64_t layer_bytes = 0;
  uint32_t next_layer = 0;
  bool ended = false;
  absl::Status error;  // why it ended, unless committed

  // Ends the stream; the daemon's status.
  absl::Status Finish() {
    ended = true;
    return FromGrpcStatus(writer->Finish());
  }
  // Ends the stream after gRPC refused a write (client/failed_write.h).
  absl::Status FinishAfterFailedWrite() {
    ended = true;
    return FromGrpcStatus(client::FinishAfterFailedWrite(
        &ctx, [&] { return writer->Finish(); }, "Insert"));
  }
  // The upload ended with `s` (the daemon's error, when it gave one).
  absl::Status Fail(absl::Status s) {
    ended = true;
    error = s.ok() ? absl::InternalError("upload: the stream ended early") : s;
    return error;
  }
};

LayerUpload::LayerUpload(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

LayerUpload::~LayerUpload() { Abort(); }

uint32_t LayerUpload::num_layers() const { return state_->num_layers; }
uint32_t LayerUpload::sent_pages() const { return state_->sent_pages; }
uint64_t LayerUpload::layer_bytes() const { return state_->layer_bytes; }
uint32_t LayerUpload::next_layer() const { return state_->next_layer; }

absl::Status LayerUpload::SendLayer(uint32_t layer,
                                    absl::Span<const uint8_t> layer_pages) {
  const absl::Span<const uint8_t> one[] = {layer_pages};
  return SendLayer(layer, one);
}

absl::Status LayerUpload::SendLayer(
    uint32_t layer, absl::Span<const absl::Span<const uint8_t>> pieces) {
  State& s = *state_;
  if (s.ended) {
    return s.error.ok()
               ? absl::FailedPreconditionError("upload: already committed")
               : s.error;
  }
  if (layer != s.next_layer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer: %u, but layer %u is next (layers go in order 0..%u)", layer,
        s.next_layer, s.num_layers - 1));
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].data() == nullptr && !pieces[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("layer_pages[%u]: null data", i));
    }
    bytes += pieces[i].size();
  }
  if (bytes != s.layer_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer_pages: %u bytes; layer %u of %u sent pages takes %u (K then V "
        "of the layer for each page)",
        bytes, layer, s.sent_pages, s.layer_bytes));
  }
  InsertOut chunk;
  chunk.pages = pieces;
  chunk.base = uint64_t{layer} * s.layer_bytes;
  for (uint64_t off = 0; off < bytes; off += s.chunk_bytes) {
    chunk.offset = off;
    chunk.bytes = std::min<uint64_t>(s.chunk_bytes, bytes - off);
    // A failed write: the daemon's status says why (or the stream broke).
    if (!s.writer->Write(chunk)) return s.Fail(s.FinishAfterFailedWrite());
  }
  ++s.next_layer;
  return absl::OkStatus();
}

absl::Status LayerUpload::SendLayerFromLayout(
    uint32_t layer, const PagedKvLayout& layout,
    absl::Span<const int64_t> block_ids) {
  const State& s = *state_;
  if (layout.on_device()) {
    return absl::UnimplementedError(absl::StrFormat(
        "layout.device: %d is GPU memory; a layer-by-layer upload gathers "
        "from host memory only (copy the layer's blocks to the host first)",
        layout.device));
  }
  if (layer < layout.layer_begin ||
      layer - layout.layer_begin >= layout.num_layers()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer: %u is not among the layout's layers [%u, %u)", layer,
        layout.layer_begin, layout.layer_begin + layout.num_layers()));
  }
  // The layer alone: a one-layer page is K then V of that layer, exactly
  // the layer-major stream's bytes for one page.
  const size_t i = layer - layout.layer_begin;
  PagedKvLayout one = layout;
  one.layer_begin = 0;
  one.k = {layout.k[i]};
  one.v = {layout.v[i]};
  one.k_bytes = layout.k_bytes.empty()
                    ? std::vector<uint64_t>()
                    : std::vector<uint64_t>{layout.k_bytes[i]};
  one.v_bytes = layout.v_bytes.empty()
                    ? std::vector<uint64_t>()
                    : std::vector<uint64_t>{layout.v_bytes[i]};
  Geometry g = s.geometry;
  g.num_layers = 1;
  std::vector<uint8_t> bytes(s.layer_bytes);
  std::vector<uint8_t*> pages;
  for (uint32_t p = 0; p < s.sent_pages; ++p) {
    pages.push_back(bytes.data() + uint64_t{p} * g.PageBytes());
  }
  absl::Status gathered = GatherLayoutToPages(g, one, block_ids, pages);
  if (!gathered.ok()) return gathered;
  return SendLayer(layer, bytes);
}

absl::StatusOr<InsertResult> LayerUpload::Commit() {
  State& s = *state_;
  if (s.ended) {
    return s.error.ok()
               ? absl::FailedPreconditionError("upload: already committed")
               : s.error;
  }
  if (s.sent_pages > 0 && s.next_layer < s.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer: commit after %u of %u layers; send the others or Abort",
        s.next_layer, s.num_layers));
  }
  s.writer->WritesDone();
  const absl::Status done = s.Finish();
  if (!done.ok()) return s.Fail(done);
  return FromProto(s.resp);
}

void LayerUpload::Abort() {
  State& s = *state_;
  if (s.ended) return;
  s.ctx.TryCancel();
  s.Finish().IgnoreError();
  s.error = absl::CancelledError("upload: aborted");
}

}  // namespace client

absl::StatusOr<std::unique_ptr<client::LayerUpload>> Client::BeginInsert(
    absl::string_view ns, const client::Sequence& sequence,
    const client::InsertOptions& options, const CallOptions& given_call) {
  const CallOptions call = impl_->OneDeadline(given_call);
  absl::StatusOr<client::NamespaceInfo> info = DescribeNamespace(ns, call);
  if (!info.ok()) return info.status();
  const Geometry g = info->spec.geometry;
  auto st = std::make_unique<client::LayerUpload::State>();
  absl::Status s = impl_->Prepare(&st->ctx, call);
  if (!s.ok()) return s;
  v1::InsertRequest req;
  v1::InsertHeader* header = req.mutable_header();
  client::InsertHeaderToProto(ns, sequence, options.skip_pages,
                              options.prefix_lease_id, header);
  header->set_layer_major(true);
  st->writer.reset(
      grpc::internal::ClientWriterFactory<client::InsertOut>::Create(
          impl_->channel.get(), *impl_->insert_method, &st->ctx, &st->resp));
  client::InsertOut header_msg;
  header_msg.header = &req;
  if (!st->writer->Write(header_msg)) {
    return st->Fail(st->FinishAfterFailedWrite());
  }
  // The daemon answers an accepted header with the number of pages it
  // expects (proto: InsertHeader); a rejected one ends the call.
  st->writer->WaitForInitialMetadata();
  const auto& md = st->ctx.GetServerInitialMetadata();
  auto it = md.find("kvh-sent-pages");
  uint32_t sent = 0;
  if (it == md.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                        &sent)) {
    return st->Fail(st->Finish());
  }
  st->chunk_bytes = impl_->options.insert_chunk_bytes;
  st->geometry = g;
  st->num_layers = g.num_layers;
  st->sent_pages = sent;
  st->layer_bytes = uint64_t{sent} * 2 * KvLayerBytes(g);
  return std::make_unique<client::LayerUpload>(std::move(st));
}

}  // namespace kvharbor
