// kvharbor::client::LayerUpload: one open layer-major Insert (Client::
// BeginInsert; docs/engines_api.md "Layer ranges"), for an engine that stores
// each layer of a request's pages as its prefill finishes the layer
// (vLLM's save_kv_layer): layers go out one by one on a single Insert
// stream, and the pages become visible in the daemon at Commit, when every
// layer of every page arrived.
//
// BeginInsert waits until the daemon accepted the header (the skipped
// prefix is cached and locked, the slots reserved), so its errors come from
// BeginInsert itself. Layers are sent in order 0..num_layers-1: layer l
// holds, for each sent page (the pages after InsertOptions::skip_pages),
// K then V of layer l, page_size x num_kv_heads x head_dim elements each:
// layer_bytes() bytes in all. Abort, an error, the deadline of the call
// options given to BeginInsert (which covers the whole upload) or the
// destructor without Commit ends the upload with nothing stored and the
// daemon's slots freed.
//
// Memory: the caller's layer bytes are read only during SendLayer. Not
// thread-safe: one thread drives an upload (the Client stays thread-safe).
#ifndef KVHARBOR_CLIENT_LAYER_UPLOAD_H_
#define KVHARBOR_CLIENT_LAYER_UPLOAD_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvharbor/types.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace client {

class LayerUpload {
 public:
  struct State;  // client/client_upload.cc
  explicit LayerUpload(std::unique_ptr<State> state);
  ~LayerUpload();  // Abort unless committed.
  LayerUpload(const LayerUpload&) = delete;
  LayerUpload& operator=(const LayerUpload&) = delete;

  uint32_t num_layers() const;
  // Pages whose layers are sent (the sequence's, less the skipped ones).
  uint32_t sent_pages() const;
  // Bytes of one layer: sent_pages() * 2 * KvLayerBytes(geometry).
  uint64_t layer_bytes() const;
  // The next layer SendLayer expects (num_layers() when all were sent).
  uint32_t next_layer() const;

  // Sends `layer` (== next_layer(): INVALID_ARGUMENT naming "layer"
  // otherwise) from `layer_pages`, layer_bytes() bytes (INVALID_ARGUMENT
  // naming "layer_pages" otherwise); after either the upload stays open and
  // nothing was sent. The pieces form: their concatenation is the layer
  // (e.g. each page's K and V where the engine keeps them). Any other error
  // (the daemon refused a page, the stream broke, the deadline passed) ends
  // the upload; later calls return the same error.
  absl::Status SendLayer(uint32_t layer, absl::Span<const uint8_t> layer_pages);
  absl::Status SendLayer(uint32_t layer,
                         absl::Span<const absl::Span<const uint8_t>> pieces);
  // Layer `layer` gathered from an engine's paged KV cache in HOST memory
  // (types/kv_layout.h): sent page i from block block_ids[i]. The layout
  // must hold the layer ("layer" otherwise); it and the block ids are
  // checked as the layout calls check them (INVALID_ARGUMENT naming
  // layout.<field> or block_ids). A GPU layout is UNIMPLEMENTED naming
  // layout.device: gather it to host memory first.
  absl::Status SendLayerFromLayout(uint32_t layer, const PagedKvLayout& layout,
                                   absl::Span<const int64_t> block_ids);
  // Makes the pages visible. INVALID_ARGUMENT naming "layer" (the upload
  // stays open) while layers are missing.
  absl::StatusOr<InsertResult> Commit();
  // Ends the upload with nothing stored (a no-op once it ended).
  void Abort();

 private:
  std::unique_ptr<State> state_;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_LAYER_UPLOAD_H_
