#include "core/codec/kvtc/kvtc_format.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {

void WriteKvtcRangeHeader(const KvtcRangeHeader& h, uint8_t* out) {
  StoreLe<int32_t>(out, 0, h.quant_type);
  StoreLe<int32_t>(out, 4, h.int_bits);
  StoreLe<uint64_t>(out, 8, h.start_idx);
  StoreLe<uint64_t>(out, 16, h.end_idx);
  StoreLe<uint64_t>(out, 24, h.packed_data_bytes);
  StoreLe<uint64_t>(out, 32, h.metadata_bytes);
}

KvtcRangeHeader ReadKvtcRangeHeader(const uint8_t* in) {
  KvtcRangeHeader h;
  h.quant_type = LoadLe<int32_t>(in, 0);
  h.int_bits = LoadLe<int32_t>(in, 4);
  h.start_idx = LoadLe<uint64_t>(in, 8);
  h.end_idx = LoadLe<uint64_t>(in, 16);
  h.packed_data_bytes = LoadLe<uint64_t>(in, 24);
  h.metadata_bytes = LoadLe<uint64_t>(in, 32);
  return h;
}

uint64_t IntXBytesPerRow(uint64_t width, int bits) {
  const uint64_t per_byte = 8 / static_cast<uint64_t>(bits);
  return width / per_byte + (width % per_byte != 0 ? 1 : 0);
}

uint64_t CountSinkTokens(const uint64_t* first_positions, size_t num_pages,
                         uint32_t page_size, uint32_t sink_tokens) {
  uint64_t n = 0;
  for (size_t i = 0; i < num_pages; ++i) {
    if (first_positions[i] < sink_tokens) {
      n += std::min<uint64_t>(page_size, sink_tokens - first_positions[i]);
    }
  }
  return n;
}

namespace {

absl::Status LayoutSection(KvtcSectionKind kind, uint64_t rows,
                           uint64_t features, uint64_t components,
                           const std::vector<KvtcRange>& ranges,
                           uint64_t offset, KvtcSectionLayout* s) {
  s->kind = kind;
  s->offset = offset;
  s->rows = rows;
  s->features = features;
  s->components = components;
  s->ranges.clear();
  uint64_t pos = offset + kKvtcSectionHeaderBytes;
  for (const KvtcRange& r : ranges) {
    KvtcRangeLayout rl;
    rl.range = r;
    rl.header_offset = pos;
    const uint64_t width = r.end_idx - r.start_idx;
    bool ok = true;
    if (r.quant_type == KvtcQuantType::kIntX) {
      ok = !MulOverflows(rows, 8, &rl.metadata_bytes) &&
           !MulOverflows(rows, IntXBytesPerRow(width, r.int_bits),
                         &rl.data_bytes);
    } else {
      ok = !MulOverflows(rows, width, &rl.data_bytes);
    }
    ok =
        ok && !AddOverflows(pos, kKvtcRangeHeaderBytes, &rl.metadata_offset) &&
        !AddOverflows(rl.metadata_offset, rl.metadata_bytes, &rl.data_offset) &&
        !AddOverflows(rl.data_offset, rl.data_bytes, &pos);
    if (!ok) {
      return absl::OutOfRangeError(
          "kvtc: batch too large, payload size overflows 64 bits");
    }
    s->ranges.push_back(rl);
  }
  s->end = pos;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvtcPayloadLayout> ComputeKvtcPayloadLayout(
    const KvtcCalibration& cal, uint64_t num_pages, uint64_t sink_rows) {
  KvtcPayloadLayout l;
  uint64_t tokens = 0;
  if (!!MulOverflows(num_pages, cal.page_size, &tokens) || sink_rows > tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvtc: %u sink rows for %u pages of %u tokens",
                        sink_rows, num_pages, cal.page_size));
  }
  l.sink_rows = sink_rows;
  if (cal.row_kind == KvtcRowKind::kPerToken) {
    l.projected_rows = tokens - sink_rows;
  } else if (!!MulOverflows(num_pages, cal.num_layers, &l.projected_rows)) {
    return absl::OutOfRangeError("kvtc: batch too large");
  }
  const uint64_t sink_features =
      uint64_t{2} * cal.num_layers * cal.num_kv_heads * cal.head_dim;
  const std::vector<KvtcRange> sink_ranges = {
      {KvtcQuantType::kFp8, 0, 0, sink_features}};
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kKeys, l.projected_rows,
                                    cal.keys.features, cal.keys.components,
                                    cal.keys.ranges, 0, &l.sections[0]));
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kValues, l.projected_rows,
                                    cal.values.features, cal.values.components,
                                    cal.values.ranges, l.sections[0].end,
                                    &l.sections[1]));
  KVH_RETURN_IF_ERROR(LayoutSection(KvtcSectionKind::kSinks, sink_rows,
                                    sink_features, sink_features, sink_ranges,
                                    l.sections[1].end, &l.sections[2]));
  l.raw_payload_bytes = l.sections[2].end;
  return l;
}

void WriteKvtcPayloadHeaders(const KvtcPayloadLayout& layout,
                             uint8_t* payload) {
  for (const KvtcSectionLayout& s : layout.sections) {
    uint8_t* h = payload + s.offset;
    StoreLe<uint32_t>(h, 0, static_cast<uint32_t>(s.kind));
    StoreLe<uint32_t>(h, 4, static_cast<uint32_t>(s.ranges.size()));
    StoreLe<uint64_t>(h, 8, s.rows);
    StoreLe<uint64_t>(h, 16, s.features);
    StoreLe<uint64_t>(h, 24, s.components);
    for (const KvtcRangeLayout& r : s.ranges) {
      KvtcRangeHeader rh;
      rh.quant_type = static_cast<int32_t>(r.range.quant_type);
      rh.int_bits = r.range.int_bits;
      rh.start_idx = r.range.start_idx;
      rh.end_idx = r.range.end_idx;
      rh.packed_data_bytes = r.data_bytes;
      rh.metadata_bytes = r.metadata_bytes;
      WriteKvtcRangeHeader(rh, payload + r.header_offset);
    }
  }
}

namespace {

absl::Status CheckField(absl::string_view where, absl::string_view field,
                        uint64_t got, uint64_t want) {
  if (got == want) return absl::OkStatus();
  return BufferCorrupt(absl::StrCat(where, ".", field),
                       absl::StrFormat("%u, expected %u", got, want));
}

}  // namespace

absl::Status CheckKvtcPayloadHeaders(const KvtcPayloadLayout& layout,
                                     absl::Span<const uint8_t> payload) {
  if (payload.size() != layout.raw_payload_bytes) {
    return BufferCorrupt(
        "payload", absl::StrFormat("%u bytes, expected %u", payload.size(),
                                   layout.raw_payload_bytes));
  }
  static constexpr const char* kNames[] = {"keys", "values", "sinks"};
  for (int si = 0; si < static_cast<int>(kKvtcNumSections); ++si) {
    const KvtcSectionLayout& s = layout.sections[si];
    const std::string where =
        absl::StrCat("sections[", si, "](", kNames[si], ")");
    const uint8_t* h = payload.data() + s.offset;
    KVH_RETURN_IF_ERROR(CheckField(where, "kind", LoadLe<uint32_t>(h, 0),
                                   static_cast<uint32_t>(s.kind)));
    KVH_RETURN_IF_ERROR(CheckField(where, "num_ranges", LoadLe<uint32_t>(h, 4),
                                   s.ranges.size()));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "rows", LoadLe<uint64_t>(h, 8), s.rows));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "features", LoadLe<uint64_t>(h, 16), s.features));
    KVH_RETURN_IF_ERROR(
        CheckField(where, "components", LoadLe<uint64_t>(h, 24), s.components));
    for (size_t ri = 0; ri < s.ranges.size(); ++ri) {
      const KvtcRangeLayout& r = s.ranges[ri];
      const std::string rw = absl::StrCat(where, ".ranges[", ri, "]");
      const KvtcRangeHeader got =
          ReadKvtcRangeHeader(payload.data() + r.header_offset);
      // Compared as unsigned so that negative values print unambiguously.
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "quant_type", static_cast<uint32_t>(got.quant_type),
                     static_cast<uint32_t>(r.range.quant_type)));
      KVH_RETURN_IF_ERROR(CheckField(rw, "int_bits",
                                     static_cast<uint32_t>(got.int_bits),
                                     static_cast<uint32_t>(r.range.int_bits)));
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "start_idx", got.start_idx, r.range.start_idx));
      KVH_RETURN_IF_ERROR(
          CheckField(rw, "end_idx", got.end_idx, r.range.end_idx));
      KVH_RETURN_IF_ERROR(CheckField(rw, "packed_data_bytes",
                                     got.packed_data_bytes, r.data_bytes));
      KVH_RETURN_IF_ERROR(CheckField(rw, "metadata_bytes", got.metadata_bytes,
                                     r.metadata_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
