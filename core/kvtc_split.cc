#include "core/kvtc_split.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "core/kvtc_format.h"
#include "core/status_macros.h"

namespace kvharbor {
namespace {

// Copies rows [r0, r0 + one.rows) of every range of batch section `b` into
// the one-page section `one` of `dst`.
void CopyRows(const KvtcSectionLayout& b, const KvtcSectionLayout& one,
              uint64_t r0, const uint8_t* src, uint8_t* dst) {
  const uint64_t n = one.rows;
  if (n == 0) return;
  for (size_t i = 0; i < one.ranges.size(); ++i) {
    const KvtcRangeLayout& br = b.ranges[i];
    const KvtcRangeLayout& orr = one.ranges[i];
    const uint64_t row_bytes = orr.data_bytes / n;
    std::memcpy(dst + orr.data_offset, src + br.data_offset + r0 * row_bytes,
                n * row_bytes);
    if (orr.metadata_bytes == 0) continue;
    // IntX: all rows' minimums, then all rows' maximums.
    std::memcpy(dst + orr.metadata_offset, src + br.metadata_offset + 4 * r0,
                4 * n);
    std::memcpy(dst + orr.metadata_offset + 4 * n,
                src + br.metadata_offset + 4 * (b.rows + r0), 4 * n);
  }
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
      CopyRows(batch.sections[s], one.sections[s],
               sink_section ? sink_row : proj_row, payload.data(), all + kHead);
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

}  // namespace kvharbor
