#include "client/fetch_wire.h"

#include <algorithm>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace kvharbor {
namespace client {

namespace {

// FetchResponse field numbers (proto/kvharbor/v1/kvharbor.proto).
constexpr uint32_t kPageIndex = 1;
constexpr uint32_t kOffset = 2;
constexpr uint32_t kData = 3;
constexpr uint32_t kPageHandle = 4;
constexpr uint32_t kPageBytes = 5;
constexpr uint32_t kPageChecksum = 6;
constexpr uint32_t kPackedPages = 12;
// PackedPage field numbers.
constexpr uint32_t kPackedIndex = 1;
constexpr uint32_t kPackedHandle = 2;
constexpr uint32_t kPackedBytes = 3;
constexpr uint32_t kPackedChecksum = 4;
constexpr uint32_t kPackedData = 8;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,
};

// Reads bytes across a sequence of pieces.
class PieceReader {
 public:
  explicit PieceReader(absl::Span<const absl::string_view> pieces)
      : pieces_(pieces) {
    SkipEmpty();
  }
  bool done() const { return piece_ == pieces_.size(); }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = static_cast<uint8_t>(pieces_[piece_][pos_]);
    ++pos_;
    SkipEmpty();
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b = 0;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }
  bool Fixed(int bytes, uint64_t* v) {
    *v = 0;
    for (int i = 0; i < bytes; ++i) {
      uint8_t b = 0;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b} << (8 * i);
    }
    return true;
  }
  // The next n bytes as views into the pieces (appended to *out unless
  // null), without copying.
  template <typename Out>
  bool Take(uint64_t n, Out* out) {
    while (n > 0) {
      if (done()) return false;
      const absl::string_view p = pieces_[piece_];
      const size_t k =
          static_cast<size_t>(std::min<uint64_t>(n, p.size() - pos_));
      if (out != nullptr) out->push_back(p.substr(pos_, k));
      pos_ += k;
      n -= k;
      SkipEmpty();
    }
    return true;
  }

 private:
  void SkipEmpty() {
    while (piece_ < pieces_.size() && pos_ == pieces_[piece_].size()) {
      ++piece_;
      pos_ = 0;
    }
  }
  absl::Span<const absl::string_view> pieces_;
  size_t piece_ = 0;
  size_t pos_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("fetch stream: malformed FetchResponse: ", what));
}

using DataPieces = absl::InlinedVector<absl::string_view, 4>;

bool SkipField(PieceReader& r, uint32_t wire_type) {
  uint64_t v = 0;
  switch (wire_type) {
    case kVarint:
      return r.Varint(&v);
    case kFixed64:
      return r.Fixed(8, &v);
    case kFixed32:
      return r.Fixed(4, &v);
    case kLengthDelimited:
      return r.Varint(&v) && r.Take(v, static_cast<DataPieces*>(nullptr));
    default:
      return false;  // groups are not used by this API
  }
}

// Adds the chunk whose data lies in `data` (several pieces: consecutive
// chunks) to the assembler.
absl::Status AddChunk(FetchChunk chunk, const DataPieces& data,
                      FetchAssembler* assembler) {
  if (data.empty()) return assembler->Add(chunk);
  for (absl::string_view piece : data) {
    chunk.data = piece;
    absl::Status s = assembler->Add(chunk);
    if (!s.ok()) return s;
    chunk.offset += piece.size();
  }
  return absl::OkStatus();
}

struct PackedPage {
  FetchChunk chunk;  // offset 0
  DataPieces data;
  uint64_t data_bytes = 0;
};
using PackedPages = absl::InlinedVector<PackedPage, 32>;

// Reads the next field's tag: its number and wire type, or what is wrong
// with it (a truncated tag, field number 0); nullptr when it is fine.
const char* ReadTag(PieceReader& r, uint64_t* field, uint32_t* wire) {
  uint64_t tag = 0;
  if (!r.Varint(&tag)) return "truncated tag";
  *field = tag >> 3;
  *wire = static_cast<uint32_t>(tag & 7);
  return *field == 0 ? "field number 0" : nullptr;
}

// Parses one PackedPage given as pieces; a packed page is whole.
absl::Status ParsePackedPage(const DataPieces& pieces, size_t i,
                             PackedPage* out) {
  PieceReader r(pieces);
  const auto bad = [i](absl::string_view what) {
    return Malformed(absl::StrCat("packed_pages[", i, "]: ", what));
  };
  while (!r.done()) {
    uint64_t field = 0;
    uint32_t wire = 0;
    if (const char* why = ReadTag(r, &field, &wire)) return bad(why);
    uint64_t v = 0;
    if (field == kPackedIndex && wire == kVarint) {
      if (!r.Varint(&v)) return bad("page_index");
      out->chunk.page_index = static_cast<uint32_t>(v);
    } else if (field == kPackedHandle && wire == kFixed64) {
      if (!r.Fixed(8, &out->chunk.page_handle)) return bad("page_handle");
    } else if (field == kPackedBytes && wire == kVarint) {
      if (!r.Varint(&out->chunk.page_bytes)) return bad("page_bytes");
    } else if (field == kPackedChecksum && wire == kFixed64) {
      if (!r.Fixed(8, &out->chunk.page_checksum)) return bad("page_checksum");
    } else if (field == kPackedData && wire == kLengthDelimited) {
      out->data.clear();  // the last occurrence wins, as in protobuf
      if (!r.Varint(&v) || !r.Take(v, &out->data)) return bad("data");
      out->data_bytes = v;
    } else if (!SkipField(r, wire)) {
      return bad(absl::StrCat("field ", field));
    }
  }
  if (out->data_bytes != out->chunk.page_bytes) {
    return bad(absl::StrCat("page ", out->chunk.page_index, " has ",
                            out->data_bytes, " data bytes, page_bytes says ",
                            out->chunk.page_bytes,
                            " (a packed page is whole)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseFetchResponse(absl::Span<const absl::string_view> pieces,
                                FetchAssembler* assembler) {
  PieceReader r(pieces);
  FetchChunk chunk;
  DataPieces data;
  PackedPages packed;
  while (!r.done()) {
    uint64_t field = 0;
    uint32_t wire = 0;
    if (const char* why = ReadTag(r, &field, &wire)) return Malformed(why);
    uint64_t v = 0;
    // A known field with an unexpected wire type is an unknown field to
    // protobuf too.
    if (field == kPageIndex && wire == kVarint) {
      if (!r.Varint(&v)) return Malformed("page_index");
      chunk.page_index = static_cast<uint32_t>(v);
    } else if (field == kOffset && wire == kVarint) {
      if (!r.Varint(&chunk.offset)) return Malformed("offset");
    } else if (field == kData && wire == kLengthDelimited) {
      data.clear();  // the last occurrence wins, as in protobuf
      if (!r.Varint(&v) || !r.Take(v, &data)) return Malformed("data");
    } else if (field == kPageHandle && wire == kFixed64) {
      if (!r.Fixed(8, &chunk.page_handle)) return Malformed("page_handle");
    } else if (field == kPageBytes && wire == kVarint) {
      if (!r.Varint(&chunk.page_bytes)) return Malformed("page_bytes");
    } else if (field == kPageChecksum && wire == kFixed64) {
      if (!r.Fixed(8, &chunk.page_checksum)) return Malformed("page_checksum");
    } else if (field == kPackedPages && wire == kLengthDelimited) {
      DataPieces sub;
      if (!r.Varint(&v) || !r.Take(v, &sub)) return Malformed("packed_pages");
      packed.emplace_back();
      absl::Status s = ParsePackedPage(sub, packed.size() - 1, &packed.back());
      if (!s.ok()) return s;
    } else if (!SkipField(r, wire)) {
      return Malformed(absl::StrCat("field ", field));
    }
  }
  absl::Status s = AddChunk(chunk, data, assembler);
  // Packed pages follow the message's page one by one; the assembler then
  // sees each as a page of its own (and refuses one that starts while the
  // message's page is incomplete).
  uint32_t prev = chunk.page_index;
  for (size_t i = 0; s.ok() && i < packed.size(); ++i) {
    const uint32_t index = packed[i].chunk.page_index;
    if (index != prev + 1 || index == 0) {
      return Malformed(absl::StrCat("packed_pages[", i, "]: page_index ", index,
                                    " does not follow page ", prev));
    }
    prev = index;
    s = AddChunk(packed[i].chunk, packed[i].data, assembler);
  }
  return s;
}

}  // namespace client
}  // namespace kvharbor

grpc::Status
grpc::SerializationTraits<kvharbor::client::FetchSink>::Deserialize(
    grpc::ByteBuffer* buffer, kvharbor::client::FetchSink* sink) {
  std::vector<grpc::Slice> slices;
  grpc::Status st = buffer->Dump(&slices);
  // Deserialize owns the buffer (gRPC released it to us).
  absl::Status s;
  if (st.ok()) {
    absl::InlinedVector<absl::string_view, 8> pieces;
    for (const grpc::Slice& slice : slices) {
      pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                          slice.size());
    }
    s = kvharbor::client::ParseFetchResponse(pieces, sink->assembler);
  } else {
    s = absl::InternalError(absl::StrCat(
        "fetch stream: cannot read the message: ", st.error_message()));
  }
  slices.clear();
  buffer->Clear();
  if (s.ok()) return grpc::Status::OK;
  if (sink->error.ok()) sink->error = s;
  return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
}
