// libFuzzer target: the bulk data plane's handshake decoders
// (types/bulk_wire.h) on arbitrary bytes: the daemon decodes every hello a
// TCP peer sends, the SDK every accept a daemon (or whatever answers on
// that port) sends.
//
// The first input byte picks the decoder, the rest is its input. Whatever
// decodes must keep the format's promises (trapped otherwise): a hello's
// index is below its connection count, which is 1 to kBulkMaxConnections,
// and re-encoding it gives the same bytes; an accept's message is at most
// kBulkErrorBytes bytes without a NUL, and encoding and decoding it again
// gives the same accept.
//
// Seeds: fuzz/corpus/bulk_wire/ (a valid hello and a valid accept, each
// behind its selector byte).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "types/bulk_wire.h"

namespace kvharbor {
namespace {

void FuzzHello(absl::Span<const uint8_t> in) {
  absl::StatusOr<BulkHello> h = DecodeBulkHello(in);
  if (!h.ok()) {
    FUZZ_CHECK(!h.status().message().empty());
    return;
  }
  FUZZ_CHECK(h->connections >= 1 && h->connections <= kBulkMaxConnections);
  FUZZ_CHECK(h->index < h->connections);
  const auto again = EncodeBulkHello(*h);
  FUZZ_CHECK(std::memcmp(again.data(), in.data(), again.size()) == 0);
}

void FuzzAccept(absl::Span<const uint8_t> in) {
  absl::StatusOr<BulkAccept> a = DecodeBulkAccept(in);
  if (!a.ok()) {
    FUZZ_CHECK(!a.status().message().empty());
    return;
  }
  FUZZ_CHECK(a->error.size() <= kBulkErrorBytes);
  FUZZ_CHECK(a->error.find('\0') == std::string::npos);
  const auto bytes = EncodeBulkAccept(*a);
  absl::StatusOr<BulkAccept> b = DecodeBulkAccept(bytes);
  FUZZ_CHECK(b.ok() && b->code == a->code && b->error == a->error);
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::Span<const uint8_t> rest(data + 1, size - 1);
  if (data[0] & 1) {
    kvharbor::FuzzAccept(rest);
  } else {
    kvharbor::FuzzHello(rest);
  }
  return 0;
}
