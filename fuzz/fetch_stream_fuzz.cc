// The SDK's decoders of a Fetch stream, fed untrusted messages: the
// zero-copy wire parser with its FetchAssembler (RAW fetches,
// client/fetch_wire.h) and the CompressedReceiver (COMPRESSED fetches,
// client/compressed_receiver.h), both with packed pages
// (FetchResponse.packed_pages). Neither may crash, write outside the
// destination it was given, or report a page it did not verify.
//
// Input: byte 0: bit 0 picks the decoder (0 wire parser, 1 compressed
// receiver), bits 1-7 the pages the request asked for (0 = open-ended);
// byte 1: the size of the pieces each message is cut into for the wire
// parser (0 = one piece); then messages, each a 2-byte little-endian length
// and that many bytes of serialized FetchResponse.
// FETCH_STREAM_FUZZ_WRITE_CORPUS=<dir> writes the seeds (valid streams,
// packed and chunked, of both kinds) and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/compressed_receiver.h"
#include "client/fetch_assembler.h"
#include "client/fetch_wire.h"
#include "fuzz/fuzz_util.h"
#include "kvharbor/checksum.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace {

// The destination of the wire parser's pages.
constexpr uint64_t kDstBytes = 64 << 10;

// Each decoder: true when the stream decoded whole.
bool FuzzWire(const std::vector<absl::string_view>& messages, size_t piece,
              uint32_t expected) {
  std::vector<uint8_t> dst(kDstBytes);
  client::FetchAssembler a(
      [&](uint32_t i, uint64_t n) -> absl::StatusOr<uint8_t*> {
        if (n == 0 || n > kDstBytes || i >= kDstBytes / n) {
          return absl::ResourceExhaustedError("destination too small");
        }
        return dst.data() + uint64_t{i} * n;
      },
      expected, /*verify_checksums=*/true);
  for (absl::string_view m : messages) {
    std::vector<absl::string_view> pieces;
    const size_t step = piece == 0 ? std::max<size_t>(1, m.size()) : piece;
    for (size_t i = 0; i < m.size(); i += step) {
      pieces.push_back(m.substr(i, step));
    }
    if (!client::ParseFetchResponse(pieces, &a).ok()) return false;
  }
  absl::StatusOr<client::FetchResult> r = a.Finish();
  if (!r.ok()) return false;
  FUZZ_CHECK(uint64_t{r->num_pages} * r->page_bytes <= kDstBytes);
  FUZZ_CHECK(expected == 0 || r->num_pages == expected);
  FUZZ_CHECK(r->handles.size() == r->num_pages);
  return true;
}

bool FuzzCompressed(const std::vector<absl::string_view>& messages,
                    uint32_t expected) {
  uint32_t seen = 0;
  const client::CompressedPageSink sink = [&](uint32_t index,
                                              client::CompressedPage page) {
    FUZZ_CHECK(index == seen);
    FUZZ_CHECK(expected == 0 || index < expected);
    ++seen;
    (void)page;
    return absl::OkStatus();
  };
  client::CompressedReceiver r(expected, /*verify_checksums=*/true, &sink);
  v1::FetchResponse m;
  for (absl::string_view bytes : messages) {
    if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return false;  // gRPC would fail the read
    }
    if (!r.Add(m).ok()) return false;
  }
  absl::StatusOr<uint32_t> n = r.Finish();
  if (!n.ok()) return false;
  FUZZ_CHECK(*n == seen);
  FUZZ_CHECK(expected == 0 || *n == expected);
  return true;
}

// Runs one input through the decoder it names.
bool FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return false;
  const bool compressed = (data[0] & 1) != 0;
  const uint32_t expected = data[0] >> 1;
  const size_t piece = data[1];
  std::vector<absl::string_view> messages;
  const char* p = reinterpret_cast<const char*>(data) + 2;
  size_t left = size - 2;
  while (left >= 2) {
    const size_t len = static_cast<uint8_t>(p[0]) |
                       (static_cast<size_t>(static_cast<uint8_t>(p[1])) << 8);
    p += 2;
    left -= 2;
    const size_t take = std::min(len, left);
    messages.emplace_back(p, take);
    p += take;
    left -= take;
  }
  return compressed ? FuzzCompressed(messages, expected)
                    : FuzzWire(messages, piece, expected);
}

// ---- Seeds ----

template <typename Message>
void SetPage(const std::string& bytes, uint32_t index, bool compressed,
             Message* m) {
  m->set_page_index(index);
  m->set_page_handle(0x1000 + index);
  m->set_page_bytes(bytes.size());
  m->set_page_checksum(client::PageChecksum(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
  if (compressed) {
    m->set_codec("kvtc");
    m->set_calibration_fingerprint(0xC0FFEE);
    m->set_page_tier(v1::TIER_HOST_COMPRESSED);
  }
}

// The daemon's framing: chunks of at most `limit` bytes, whole pages packed
// after a completed one up to `per_message` pages within `limit`.
std::string Stream(const std::vector<std::string>& pages, uint64_t limit,
                   uint32_t per_message, bool compressed) {
  std::string out;
  const auto add = [&out](const v1::FetchResponse& m) {
    const std::string b = m.SerializeAsString();
    out.push_back(static_cast<char>(b.size() & 0xFF));
    out.push_back(static_cast<char>(b.size() >> 8));
    out += b;
  };
  size_t i = 0;
  uint64_t offset = 0;
  while (i < pages.size()) {
    v1::FetchResponse m;
    const uint64_t n = std::min<uint64_t>(limit, pages[i].size() - offset);
    m.set_page_index(static_cast<uint32_t>(i));
    m.set_offset(offset);
    if (offset == 0) {
      SetPage(pages[i], static_cast<uint32_t>(i), compressed, &m);
    }
    m.set_data(pages[i].substr(offset, n));
    offset += n;
    if (offset == pages[i].size()) {
      ++i;
      offset = 0;
      uint64_t used = n;
      for (uint32_t k = 1; k < per_message && i < pages.size() &&
                           used + pages[i].size() <= limit;
           ++k, ++i) {
        v1::PackedPage* p = m.add_packed_pages();
        SetPage(pages[i], static_cast<uint32_t>(i), compressed, p);
        p->set_data(pages[i]);
        used += pages[i].size();
      }
    }
    add(m);
  }
  return out;
}

void WriteCorpus(const std::string& dir) {
  int n = 0;
  const auto write = [&](uint8_t mode, uint8_t piece, const std::string& s) {
    const std::string seed = std::string(1, static_cast<char>(mode)) +
                             std::string(1, static_cast<char>(piece)) + s;
    if (!FuzzOne(reinterpret_cast<const uint8_t*>(seed.data()), seed.size())) {
      std::fprintf(stderr, "seed %d does not decode\n", n);
      std::exit(1);
    }
    WriteSeedOrDie(dir + "/stream_" + std::to_string(n++), seed.data(),
                   seed.size());
  };
  std::vector<std::string> raw, mixed;
  for (int p = 0; p < 6; ++p) raw.push_back(std::string(300, 'a' + p));
  for (size_t size : {40, 700, 25, 25, 260, 1}) {
    mixed.push_back(std::string(size, static_cast<char>('k' + size % 7)));
  }
  for (uint32_t per : {1u, 3u, 64u}) {
    for (uint64_t limit : {uint64_t{128}, uint64_t{1024}}) {
      write(6 << 1, 0, Stream(raw, limit, per, false));
      write(0, 7, Stream(raw, limit, per, false));
      write(1 | (6 << 1), 0, Stream(mixed, limit, per, true));
      write(1, 0, Stream(mixed, limit, per, true));
    }
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("FETCH_STREAM_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvharbor::FuzzOne(data, size);
  return 0;
}
