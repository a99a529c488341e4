// Send path of Insert: InsertOut is the message type of the raw Insert
// stream. It serializes either the header (a generated InsertRequest) or a
// chunk of page bytes taken from the caller's pages, encoding the chunk's
// InsertRequest{chunk{offset, data}} straight into one gRPC slice: one copy
// of the page bytes instead of two (into a std::string, then into a slice).
//
// Internal to the SDK (not installed). An InsertOut views its header and
// pages; they must outlive the Write that sends it (Serialize copies).
// Thread-compatible.
#ifndef KVHARBOR_CLIENT_INSERT_WIRE_H_
#define KVHARBOR_CLIENT_INSERT_WIRE_H_

#include <grpcpp/impl/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace client {

struct InsertOut {
  // The header message, or null for a chunk.
  const v1::InsertRequest* header = nullptr;
  // A chunk: `bytes` bytes starting at byte `offset` of the concatenation
  // of `pages`, sent with InsertChunk.offset base + offset (a layer-major
  // upload sends each layer from its own buffers at the layer's offset).
  absl::Span<const absl::Span<const uint8_t>> pages;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t base = 0;
};

// The serialized InsertRequest of `msg` (for tests; Serialize below builds
// the same bytes in a gRPC slice).
std::string SerializeInsertOut(const InsertOut& msg);

}  // namespace client
}  // namespace kvharbor

template <>
class grpc::SerializationTraits<kvharbor::client::InsertOut, void> {
 public:
  static grpc::Status Serialize(const kvharbor::client::InsertOut& msg,
                                grpc::ByteBuffer* buffer, bool* own_buffer);
  // The stream only sends InsertOut.
  static grpc::Status Deserialize(grpc::ByteBuffer*,
                                  kvharbor::client::InsertOut*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "InsertOut cannot be received");
  }
};

#endif  // KVHARBOR_CLIENT_INSERT_WIRE_H_
