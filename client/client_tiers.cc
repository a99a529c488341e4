// Client: the tier calls (GetCalibration, Demote) and compressed Fetch.
//
// Compressed pages have sizes of their own, so they do not go through the
// zero-copy FetchAssembler (which puts equal-sized raw pages into caller
// memory) but through the generated stub and a CompressedReceiver
// (client/compressed_receiver.h), one string per page.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client_impl.h"
#include "client/compressed_receiver.h"
#include "kvharbor/checksum.h"
#include "kvharbor/client.h"

namespace kvharbor {

using client::FromGrpcStatus;

namespace {

// Largest size announced for one compressed page that is taken at its word
// when reserving memory (the buffer still grows to what really arrives).
constexpr uint64_t kMaxReserve = uint64_t{64} << 20;

absl::Status BadStream(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fetch stream: ", what));
}

}  // namespace

absl::StatusOr<uint32_t> Client::FetchCompressedStreaming(
    absl::string_view ns, const client::FetchSource& source,
    const client::CompressedPageSink& on_page, const CallOptions& call) {
  // The bulk data plane when allowed and offered; else the stream.
  absl::StatusOr<std::optional<uint32_t>> bulk =
      impl_->TryBulkFetchCompressed(ns, source, on_page, call);
  if (!bulk.ok()) return bulk.status();
  if (bulk->has_value()) return **bulk;
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected =
      impl_->BuildFetchRequest(ns, source, &req);
  if (!expected.ok()) return expected.status();
  req.set_format(v1::FETCH_FORMAT_COMPRESSED);
  grpc::ClientContext ctx;
  absl::Status prepared = impl_->Prepare(&ctx, call);
  if (!prepared.ok()) return prepared;
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader =
      impl_->stub->Fetch(&ctx, req);
  client::CompressedReceiver receiver(
      *expected, impl_->options.verify_checksums, &on_page);
  absl::Status error;
  v1::FetchResponse r;
  while (reader->Read(&r)) {
    if (!error.ok()) continue;
    error = receiver.Add(r);
    if (!error.ok()) ctx.TryCancel();
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!error.ok()) return error;
  if (!s.ok()) return s;
  return receiver.Finish();
}

absl::StatusOr<std::vector<client::CompressedPage>> Client::FetchCompressed(
    absl::string_view ns, const client::FetchSource& source,
    const CallOptions& call) {
  std::vector<client::CompressedPage> pages;
  absl::StatusOr<uint32_t> n = FetchCompressedStreaming(
      ns, source,
      [&pages](uint32_t, client::CompressedPage page) {
        pages.push_back(std::move(page));
        return absl::OkStatus();
      },
      call);
  if (!n.ok()) return n.status();
  return pages;
}

absl::StatusOr<std::vector<uint8_t>> Client::DecodePage(
    absl::string_view ns, const client::CompressedPage& page,
    const CallOptions& call) {
  std::vector<uint8_t> out;
  auto load = [&](uint64_t fp) { return GetCalibration(ns, fp, call); };
  absl::Status s = impl_->decoder->Decode(ns, page, load, &out);
  if (!s.ok()) return s;
  return out;
}

uint64_t Client::calibrations_loaded() const {
  return impl_->decoder->calibrations_loaded();
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> Client::Fetch(
    absl::string_view ns, const client::FetchSource& source,
    client::FetchFormat format, const CallOptions& call) {
  if (format == client::FetchFormat::kRaw) return Fetch(ns, source, call);
  if (format != client::FetchFormat::kCompressed) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: unknown value ", static_cast<int>(format)));
  }
  absl::StatusOr<std::vector<client::CompressedPage>> pages =
      FetchCompressed(ns, source, call);
  if (!pages.ok()) return pages.status();
  std::vector<std::vector<uint8_t>> out(pages->size());
  for (size_t i = 0; i < pages->size(); ++i) {
    absl::StatusOr<std::vector<uint8_t>> raw =
        DecodePage(ns, (*pages)[i], call);
    if (!raw.ok()) return raw.status();
    out[i] = *std::move(raw);
  }
  return out;
}

namespace {

// Adds one chunk of a transformed fetch to `out`: everything is page 0, in
// order, the first chunk (offset 0) announcing size, checksum and token
// counts.
absl::Status AddTransformedChunk(const v1::FetchResponse& r, bool* started,
                                 uint64_t* size, uint64_t* checksum,
                                 client::TransformedKv* out) {
  if (r.page_index() != 0) {
    return BadStream(absl::StrFormat(
        "page_index %u in a transformed fetch (its result is page 0)",
        r.page_index()));
  }
  if (r.offset() == 0 && !*started) {
    *started = true;
    *size = r.page_bytes();
    *checksum = r.page_checksum();
    out->input_tokens = r.input_tokens();
    out->output_tokens = r.transformed_tokens();
    if (out->output_tokens == 0 || *size % (2 * out->output_tokens) != 0) {
      return BadStream(
          absl::StrFormat("%u bytes cannot be K and V of %u transformed tokens",
                          *size, out->output_tokens));
    }
    out->bytes.reserve(std::min(*size, kMaxReserve));
  } else if (!*started || r.offset() != out->bytes.size()) {
    return BadStream(absl::StrFormat(
        "chunk at %u of the transformed result out of order", r.offset()));
  }
  if (r.data().size() > *size - out->bytes.size()) {
    return BadStream(absl::StrFormat(
        "the transformed result has more than its %u bytes", *size));
  }
  out->bytes.insert(out->bytes.end(), r.data().begin(), r.data().end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<client::TransformedKv> Client::FetchTransformed(
    absl::string_view ns, const client::FetchSource& source,
    client::FetchTransform transform, const CallOptions& call) {
  if (transform != client::FetchTransform::kKvcm) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transform: %d is not a transform (kKvcm; for the pages as they are, "
        "use Fetch)",
        static_cast<int>(transform)));
  }
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected =
      impl_->BuildFetchRequest(ns, source, &req);
  if (!expected.ok()) return expected.status();
  req.set_transform(v1::FETCH_TRANSFORM_KVCM);
  grpc::ClientContext ctx;
  absl::Status prepared = impl_->Prepare(&ctx, call);
  if (!prepared.ok()) return prepared;
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader =
      impl_->stub->Fetch(&ctx, req);
  client::TransformedKv out;
  bool started = false;
  uint64_t size = 0;
  uint64_t checksum = 0;
  absl::Status error;
  v1::FetchResponse r;
  while (reader->Read(&r)) {
    if (!error.ok()) continue;
    error = AddTransformedChunk(r, &started, &size, &checksum, &out);
    if (!error.ok()) ctx.TryCancel();
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!error.ok()) return error;
  if (!s.ok()) return s;
  if (!started || out.bytes.size() != size) {
    return BadStream(
        absl::StrFormat("the transformed result ended after %u of %u bytes",
                        out.bytes.size(), size));
  }
  if (impl_->options.verify_checksums) {
    absl::Status ok =
        client::VerifyPageChecksum(out.bytes, checksum, /*page_index=*/0,
                                   /*handle=*/0);
    if (!ok.ok()) return ok;
  }
  return out;
}

absl::StatusOr<client::Calibration> Client::GetCalibration(
    absl::string_view ns, const CallOptions& call) {
  return GetCalibration(ns, 0, call);
}

absl::StatusOr<client::Calibration> Client::GetCalibration(
    absl::string_view ns, uint64_t fingerprint, const CallOptions& call) {
  v1::GetCalibrationRequest req;
  req.set_namespace_(std::string(ns));
  req.set_calibration_fingerprint(fingerprint);
  return impl_->Call(&v1::KvHarbor::Stub::GetCalibration, req, call,
                     [](const v1::GetCalibrationResponse& resp) {
                       return client::FromProto(resp);
                     });
}

absl::StatusOr<uint64_t> Client::Demote(absl::string_view ns, client::Tier tier,
                                        const CallOptions& call) {
  v1::DemoteRequest req;
  req.set_namespace_(std::string(ns));
  req.set_tier(static_cast<v1::Tier>(tier));
  return impl_->Call(
      &v1::KvHarbor::Stub::Demote, req, call,
      [](const v1::DemoteResponse& resp) { return resp.pages_moved(); });
}

// ---- Calibrations ----

absl::StatusOr<uint64_t> Client::UploadCalibration(absl::string_view ns,
                                                   std::string bytes, bool pin,
                                                   const CallOptions& call) {
  v1::UploadCalibrationRequest req;
  req.set_namespace_(std::string(ns));
  req.set_calibration(std::move(bytes));
  req.set_pin(pin);
  return impl_->Call(&v1::KvHarbor::Stub::UploadCalibration, req, call,
                     [](const v1::UploadCalibrationResponse& resp) {
                       return resp.calibration_fingerprint();
                     });
}

absl::StatusOr<std::vector<client::CalibrationInfo>> Client::ListCalibrations(
    absl::string_view ns, const CallOptions& call) {
  v1::ListCalibrationsRequest req;
  req.set_namespace_(std::string(ns));
  return impl_->Call(
      &v1::KvHarbor::Stub::ListCalibrations, req, call,
      [](const v1::ListCalibrationsResponse& resp) {
        std::vector<client::CalibrationInfo> out;
        for (const v1::CalibrationInfo& c : resp.calibrations()) {
          client::CalibrationInfo info;
          info.codec = c.codec();
          info.fingerprint = c.fingerprint();
          switch (c.source()) {
            case v1::CALIBRATION_SOURCE_UPLOADED:
              info.source = "uploaded";
              break;
            case v1::CALIBRATION_SOURCE_ONLINE:
              info.source = "online";
              break;
            default:
              info.source = "config";
          }
          info.created_unix_ms = c.created_unix_ms();
          info.active = c.active();
          info.pinned = c.pinned();
          info.pages = c.pages();
          out.push_back(std::move(info));
        }
        return out;
      });
}

absl::Status Client::PinCalibration(absl::string_view ns, uint64_t fingerprint,
                                    bool pinned, const CallOptions& call) {
  v1::PinCalibrationRequest req;
  req.set_namespace_(std::string(ns));
  req.set_calibration_fingerprint(fingerprint);
  req.set_pinned(pinned);
  v1::PinCalibrationResponse resp;
  return impl_->Unary(&v1::KvHarbor::Stub::PinCalibration, req, &resp, call);
}

}  // namespace kvharbor
