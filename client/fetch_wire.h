// Zero-copy receive path of Fetch: parses each serialized FetchResponse
// straight out of gRPC's receive slices and hands its page bytes to a
// FetchAssembler, which copies them once, into the caller's memory. (The
// generated message type would first copy them into a std::string.)
//
// Internal to the SDK (not installed). FetchSink is the message type of the
// raw Fetch stream: grpc::SerializationTraits<FetchSink> below lets a
// grpc::ClientReader<FetchSink> read the Fetch method with it. Not
// thread-safe; one sink per stream.
#ifndef KVHARBOR_CLIENT_FETCH_WIRE_H_
#define KVHARBOR_CLIENT_FETCH_WIRE_H_

#include <grpcpp/impl/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/fetch_assembler.h"

namespace kvharbor {
namespace client {

// Parses one FetchResponse in protobuf wire format, given as consecutive
// pieces of any size, and adds its data to `assembler` (several chunks when
// the data spans pieces). Unknown fields are skipped, as protobuf would.
// INTERNAL for malformed input; otherwise the assembler's verdict.
absl::Status ParseFetchResponse(absl::Span<const absl::string_view> pieces,
                                FetchAssembler* assembler);

struct FetchSink {
  FetchAssembler* assembler = nullptr;
  absl::Status error;  // the first parse or assembler error
};

}  // namespace client
}  // namespace kvharbor

template <>
class grpc::SerializationTraits<kvharbor::client::FetchSink, void> {
 public:
  // The sink only receives.
  static grpc::Status Serialize(const kvharbor::client::FetchSink&,
                                grpc::ByteBuffer*, bool*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "FetchSink cannot be sent");
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer,
                                  kvharbor::client::FetchSink* sink);
};

#endif  // KVHARBOR_CLIENT_FETCH_WIRE_H_
