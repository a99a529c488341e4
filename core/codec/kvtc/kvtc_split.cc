#include "core/codec/kvtc/kvtc_split.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_format.h"

namespace kvharbor {
namespace {

// Copies rows [r0, r0 + one.rows) of every range between batch section `b`
// (in `batch`) and the one-page section `one` (in `page`): into the page
// for a split, into the batch for a merge.
void CopyRows(const KvtcSectionLayout& b, const KvtcSectionLayout& one,
              uint64_t r0, uint8_t* batch, uint8_t* page, bool into_batch) {
  const uint64_t n = one.rows;
  if (n == 0) return;
  const auto copy = [&](uint64_t batch_off, uint64_t page_off, uint64_t len) {
    if (into_batch) {
      std::memcpy(batch + batch_off, page + page_off, len);
    } else {
      std::memcpy(page + page_off, batch + batch_off, len);
    }
  };
  for (size_t i = 0; i < one.ranges.size(); ++i) {
    const KvtcRangeLayout& br = b.ranges[i];
    const KvtcRangeLayout& orr = one.ranges[i];
    const uint64_t row_bytes = orr.data_bytes / n;
    copy(br.data_offset + r0 * row_bytes, orr.data_offset, n * row_bytes);
    if (orr.metadata_bytes == 0) continue;
    // IntX: all rows' minimums, then all rows' maximums.
    copy(br.metadata_offset + 4 * r0, orr.metadata_offset, 4 * n);
    copy(br.metadata_offset + 4 * (b.rows + r0), orr.metadata_offset + 4 * n,
         4 * n);
  }
}

// One page buffer of a merge, checked: its envelope and raw payload (in
// `unzstd` when it has the zstd stage) and layout.
struct CheckedPage {
  ParsedEnvelope env;
  absl::Span<const uint8_t> payload;
  KvtcPayloadLayout layout;
};

absl::StatusOr<CheckedPage> CheckPage(const KvtcCalibration& cal,
                                      uint64_t fingerprint,
                                      const Geometry& geometry,
                                      absl::Span<const uint8_t> buffer,
                                      CodecWorkspace* unzstd) {
  CheckedPage p;
  KVH_ASSIGN_OR_RETURN(p.env, ParseEnvelope(buffer));
  const MutablePageRef ref{
      nullptr, p.env.header.num_pages == 1 ? p.env.position(0) : uint64_t{0}};
  KVH_RETURN_IF_ERROR(CheckEnvelopeMatches(p.env, CodecId::kKvtc, geometry,
                                           absl::MakeConstSpan(&ref, 1),
                                           PageDataUse::kNotWritten));
  if (p.env.header.calibration_fingerprint != fingerprint ||
      p.env.header.row_kind != static_cast<uint32_t>(cal.row_kind)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration_fingerprint: %#x, the decoder holds %#x",
                        p.env.header.calibration_fingerprint, fingerprint));
  }
  const uint64_t sinks = CountSinkTokens(&ref.first_position, 1,
                                         geometry.page_size, cal.sink_tokens);
  KVH_ASSIGN_OR_RETURN(p.layout, ComputeKvtcPayloadLayout(cal, 1, sinks));
  KVH_ASSIGN_OR_RETURN(p.payload,
                       RawPayload(p.env, p.layout.raw_payload_bytes, unzstd));
  KVH_RETURN_IF_ERROR(CheckKvtcPayloadHeaders(p.layout, p.payload));
  return p;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> SplitKvtcBatch(
    const KvtcCalibration& cal, const Geometry& geometry,
    absl::Span<const uint8_t> buffer, bool zstd, int zstd_level) {
  KVH_ASSIGN_OR_RETURN(const ParsedEnvelope env,
                       ParseEnvelopeDeferBodyChecksum(buffer));
  if (env.header.codec_id != CodecId::kKvtc) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffer: codec id %u is not KVTC",
                        static_cast<uint32_t>(env.header.codec_id)));
  }
  const size_t n = env.header.num_pages;
  const uint32_t ps = geometry.page_size;
  std::vector<uint64_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = env.position(i);
  KVH_ASSIGN_OR_RETURN(
      const KvtcPayloadLayout batch,
      ComputeKvtcPayloadLayout(
          cal, n, CountSinkTokens(pos.data(), n, ps, cal.sink_tokens)));
  CodecWorkspace unzstd;
  KVH_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> payload,
                       RawPayload(env, batch.raw_payload_bytes, &unzstd));
  KVH_RETURN_IF_ERROR(CheckKvtcPayloadHeaders(batch, payload));

  std::vector<std::string> out(n);
  CodecWorkspace scratch;
  uint64_t proj_row = 0, sink_row = 0;
  constexpr size_t kHead = kEnvelopeHeaderBytes + 8;
  for (size_t p = 0; p < n; ++p) {
    const uint64_t sinks = CountSinkTokens(&pos[p], 1, ps, cal.sink_tokens);
    KVH_ASSIGN_OR_RETURN(const KvtcPayloadLayout one,
                         ComputeKvtcPayloadLayout(cal, 1, sinks));
    std::string& buf = out[p];
    buf.assign(kHead + one.raw_payload_bytes, '\0');
    uint8_t* all = reinterpret_cast<uint8_t*>(&buf[0]);
    WriteKvtcPayloadHeaders(one, all + kHead);
    for (int s = 0; s < static_cast<int>(kKvtcNumSections); ++s) {
      const bool sink_section = one.sections[s].kind == KvtcSectionKind::kSinks;
      // Split only reads the batch (the const_cast is never written).
      CopyRows(batch.sections[s], one.sections[s],
               sink_section ? sink_row : proj_row,
               const_cast<uint8_t*>(payload.data()), all + kHead,
               /*into_batch=*/false);
    }
    proj_row += one.projected_rows;
    sink_row += sinks;
    const PageRef ref{nullptr, pos[p]};
    KVH_ASSIGN_OR_RETURN(
        const size_t size,
        FinishEnvelope(env.header, absl::MakeConstSpan(&ref, 1),
                       one.raw_payload_bytes, zstd, zstd_level,
                       absl::MakeSpan(all, buf.size()), &scratch));
    buf.resize(size);
  }
  if (proj_row != batch.projected_rows || sink_row != batch.sink_rows) {
    return absl::InternalError("buffer: pages' rows do not add up to batch");
  }
  return out;
}

absl::StatusOr<size_t> MergeKvtcPages(
    const KvtcCalibration& cal, uint64_t fingerprint, const Geometry& geometry,
    absl::Span<const absl::Span<const uint8_t>> pages,
    absl::Span<uint8_t> out) {
  const size_t n = pages.size();
  if (n == 0 || n > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages: %u buffers to merge", n));
  }
  std::vector<PageRef> refs(n);
  std::vector<CheckedPage> checked(n);
  std::vector<CodecWorkspace> unzstd(n);  // holds decompressed payloads
  for (size_t p = 0; p < n; ++p) {
    absl::StatusOr<CheckedPage> c =
        CheckPage(cal, fingerprint, geometry, pages[p], &unzstd[p]);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrFormat("pages[%u]: %s", p, c.status().message()));
    }
    checked[p] = *std::move(c);
    refs[p] = PageRef{nullptr, checked[p].env.position(0)};
  }
  std::vector<uint64_t> pos(n);
  for (size_t p = 0; p < n; ++p) pos[p] = refs[p].first_position;
  KVH_ASSIGN_OR_RETURN(
      const KvtcPayloadLayout batch,
      ComputeKvtcPayloadLayout(
          cal, n,
          CountSinkTokens(pos.data(), n, geometry.page_size, cal.sink_tokens)));
  const uint64_t head = kEnvelopeHeaderBytes + 8 * uint64_t{n};
  if (out.size() < head + batch.raw_payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("out: %u bytes, the merged buffer needs %u", out.size(),
                        head + batch.raw_payload_bytes));
  }
  uint8_t* payload = out.data() + head;
  WriteKvtcPayloadHeaders(batch, payload);
  uint64_t proj_row = 0, sink_row = 0;
  for (size_t p = 0; p < n; ++p) {
    const KvtcPayloadLayout& one = checked[p].layout;
    uint8_t* page = const_cast<uint8_t*>(checked[p].payload.data());
    for (int s = 0; s < static_cast<int>(kKvtcNumSections); ++s) {
      const bool sink_section = one.sections[s].kind == KvtcSectionKind::kSinks;
      // Merge only reads the page (the const_cast is never written).
      CopyRows(batch.sections[s], one.sections[s],
               sink_section ? sink_row : proj_row, payload, page,
               /*into_batch=*/true);
    }
    proj_row += one.projected_rows;
    sink_row += one.sink_rows;
  }
  return FinishEnvelope(checked[0].env.header, refs, batch.raw_payload_bytes,
                        /*zstd=*/false, 0, out, nullptr);
}

}  // namespace kvharbor
