#include "client/insert_wire.h"

#include <grpc/slice.h>

#include <algorithm>
#include <cstring>

namespace kvharbor {
namespace client {

namespace {

// Tags of InsertRequest.chunk (field 2), InsertChunk.offset (1) and
// InsertChunk.data (2): (field << 3) | wire type.
constexpr uint8_t kChunkTag = (2 << 3) | 2;
constexpr uint8_t kOffsetTag = (1 << 3) | 0;
constexpr uint8_t kDataTag = (2 << 3) | 2;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint64_t v, uint8_t* p) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

size_t ChunkSize(const InsertOut& m) {
  const uint64_t inner =
      1 + VarintSize(m.base + m.offset) + 1 + VarintSize(m.bytes) + m.bytes;
  return 1 + VarintSize(inner) + inner;
}

// Writes the chunk message to `out` (ChunkSize(m) bytes). The caller has
// checked that the pages hold offset + bytes.
void WriteChunk(const InsertOut& m, uint8_t* out) {
  const uint64_t inner =
      1 + VarintSize(m.base + m.offset) + 1 + VarintSize(m.bytes) + m.bytes;
  uint8_t* p = out;
  *p++ = kChunkTag;
  p = PutVarint(inner, p);
  *p++ = kOffsetTag;
  p = PutVarint(m.base + m.offset, p);
  *p++ = kDataTag;
  p = PutVarint(m.bytes, p);
  uint64_t skip = m.offset;
  uint64_t left = m.bytes;
  for (absl::Span<const uint8_t> page : m.pages) {
    if (left == 0) break;
    if (skip >= page.size()) {
      skip -= page.size();
      continue;
    }
    const size_t take =
        static_cast<size_t>(std::min<uint64_t>(left, page.size() - skip));
    std::memcpy(p, page.data() + skip, take);
    p += take;
    left -= take;
    skip = 0;
  }
}

uint64_t TotalBytes(const InsertOut& m) {
  uint64_t total = 0;
  for (absl::Span<const uint8_t> page : m.pages) total += page.size();
  return total;
}

}  // namespace

std::string SerializeInsertOut(const InsertOut& msg) {
  if (msg.header != nullptr) return msg.header->SerializeAsString();
  std::string out(ChunkSize(msg), '\0');
  WriteChunk(msg, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

}  // namespace client
}  // namespace kvharbor

grpc::Status grpc::SerializationTraits<kvharbor::client::InsertOut>::Serialize(
    const kvharbor::client::InsertOut& msg, grpc::ByteBuffer* buffer,
    bool* own_buffer) {
  *own_buffer = true;
  if (msg.header != nullptr) {
    const size_t n = msg.header->ByteSizeLong();
    grpc_slice s = grpc_slice_malloc(n);
    msg.header->SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(s));
    grpc::Slice slice(s, grpc::Slice::STEAL_REF);
    grpc::ByteBuffer out(&slice, 1);
    buffer->Swap(&out);
    return grpc::Status::OK;
  }
  const uint64_t total = kvharbor::client::TotalBytes(msg);
  if (msg.offset > total || msg.bytes > total - msg.offset) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "InsertOut: chunk runs past the pages");
  }
  grpc_slice s = grpc_slice_malloc(kvharbor::client::ChunkSize(msg));
  kvharbor::client::WriteChunk(msg, GRPC_SLICE_START_PTR(s));
  grpc::Slice slice(s, grpc::Slice::STEAL_REF);
  grpc::ByteBuffer out(&slice, 1);
  buffer->Swap(&out);
  return grpc::Status::OK;
}
