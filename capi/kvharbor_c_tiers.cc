// The C ABI of capi/kvharbor_c.h for calibrations, compressed pages,
// transformed fetches and the same-host handles (ABI 2 and 4), over the
// SDK's calls of the same names. Guard() (capi/capi_util.h) keeps every C++
// exception inside.
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/capi_names.h"
#include "capi/capi_util.h"
#include "capi/json.h"
#include "capi/kvharbor_c.h"
#include "kvharbor/client.h"

namespace {

// Copies a calibration into library memory (freed by kvh_calibration_free).
absl::Status FillCalibration(const client::Calibration& in,
                             kvh_calibration* out) {
  kvh_calibration cal = {};
  KVH_TRY(ReturnString(in.codec, &cal.codec));
  if (!in.bytes.empty()) {
    cal.bytes = static_cast<uint8_t*>(std::malloc(in.bytes.size()));
    if (cal.bytes == nullptr) {
      kvh_calibration_free(&cal);
      return absl::ResourceExhaustedError("out of memory");
    }
    std::memcpy(cal.bytes, in.bytes.data(), in.bytes.size());
    cal.num_bytes = in.bytes.size();
  }
  cal.fingerprint = in.fingerprint;
  *out = cal;
  return absl::OkStatus();
}

// kvh_get_host_handles and kvh_get_device_handles: the handles `get`
// answers for the call, as JSON (`to_json`).
template <typename Get, typename ToJson>
int HandlesCall(kvh_client* c, const char* ns, int64_t timeout_ms,
                char** handles_json, Get get, ToJson to_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(handles_json, "handles_json"));
    return ReturnJson(get(call), to_json, handles_json);
  });
}

}  // namespace

extern "C" {

int kvh_get_calibration(kvh_client* c, const char* ns, int64_t timeout_ms,
                        kvh_calibration* out) {
  return kvh_get_calibration_fp(c, ns, 0, timeout_ms, out);
}

int kvh_get_calibration_fp(kvh_client* c, const char* ns, uint64_t fingerprint,
                           int64_t timeout_ms, kvh_calibration* out) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(out, "out"));
    auto r = c->client->GetCalibration(ns, fingerprint, call);
    if (!r.ok()) return r.status();
    return FillCalibration(*r, out);
  });
}

void kvh_calibration_free(kvh_calibration* cal) {
  if (cal == nullptr) return;
  std::free(cal->codec);
  std::free(cal->bytes);
  *cal = kvh_calibration{};
}

int kvh_upload_calibration(kvh_client* c, const char* ns, const void* bytes,
                           size_t num_bytes, int pin, uint64_t* fingerprint,
                           int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    if (num_bytes == 0) {
      return absl::InvalidArgumentError("calibration: must not be empty");
    }
    KVH_TRY(NotNull(bytes, "calibration"));
    auto r = c->client->UploadCalibration(
        ns, std::string(static_cast<const char*>(bytes), num_bytes), pin != 0,
        call);
    if (!r.ok()) return r.status();
    if (fingerprint != nullptr) *fingerprint = *r;
    return absl::OkStatus();
  });
}

int kvh_list_calibrations(kvh_client* c, const char* ns, int64_t timeout_ms,
                          char** list_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(list_json, "list_json"));
    return ReturnJson(c->client->ListCalibrations(ns, call),
                      kvharbor::capi::CalibrationListJson, list_json);
  });
}

int kvh_pin_calibration(kvh_client* c, const char* ns, uint64_t fingerprint,
                        int pinned, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    return c->client->PinCalibration(ns, fingerprint, pinned != 0, call);
  });
}

int kvh_fetch_compressed(kvh_client* c, const char* ns,
                         const kvh_fetch_source* source,
                         kvh_compressed_page** pages, size_t* num_pages,
                         int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(pages, "pages"));
    KVH_TRY(NotNull(num_pages, "num_pages"));
    client::FetchSource src;
    KVH_TRY(kvharbor::capi::MakeSource(source, &src));
    auto r = c->client->FetchCompressed(ns, src, call);
    if (!r.ok()) return r.status();
    auto* out = static_cast<kvh_compressed_page*>(
        std::calloc(r->empty() ? 1 : r->size(), sizeof(kvh_compressed_page)));
    if (out == nullptr) return absl::ResourceExhaustedError("out of memory");
    for (size_t i = 0; i < r->size(); ++i) {
      const client::CompressedPage& p = (*r)[i];
      kvh_compressed_page& o = out[i];
      o.handle = p.handle;
      o.tier = static_cast<int32_t>(p.tier);
      o.calibration_fingerprint = p.calibration_fingerprint;
      o.codec = kvharbor::capi::CopyString(p.codec);
      o.data = static_cast<uint8_t*>(
          std::malloc(p.buffer.empty() ? 1 : p.buffer.size()));
      if (o.codec == nullptr || o.data == nullptr) {
        kvh_compressed_pages_free(out, i + 1);
        return absl::ResourceExhaustedError("out of memory");
      }
      std::memcpy(o.data, p.buffer.data(), p.buffer.size());
      o.size = p.buffer.size();
    }
    *pages = out;
    *num_pages = r->size();
    return absl::OkStatus();
  });
}

void kvh_compressed_pages_free(kvh_compressed_page* pages, size_t num_pages) {
  if (pages == nullptr) return;
  for (size_t i = 0; i < num_pages; ++i) {
    std::free(pages[i].codec);
    std::free(pages[i].data);
  }
  std::free(pages);
}

int kvh_decode_page(kvh_client* c, const char* ns,
                    const kvh_compressed_page* page, void* dst,
                    size_t dst_capacity, uint64_t* written,
                    int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(page, "page"));
    KVH_TRY(NotNull(dst, "dst"));
    if (page->size > 0) KVH_TRY(NotNull(page->data, "page.data"));
    client::CompressedPage p;
    p.handle = page->handle;
    p.tier = static_cast<client::Tier>(page->tier);
    p.codec = kvharbor::capi::OrEmpty(page->codec);
    p.calibration_fingerprint = page->calibration_fingerprint;
    p.buffer.assign(reinterpret_cast<const char*>(page->data), page->size);
    auto r = c->client->DecodePage(ns, p, call);
    if (!r.ok()) return r.status();
    if (r->size() > dst_capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dst: holds ", dst_capacity, " bytes; the page has ", r->size()));
    }
    std::memcpy(dst, r->data(), r->size());
    if (written != nullptr) *written = r->size();
    return absl::OkStatus();
  });
}

int kvh_fetch_transformed(kvh_client* c, const char* ns,
                          const kvh_fetch_source* source, int transform,
                          void* dst, size_t dst_capacity,
                          kvh_transform_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(dst, "dst"));
    if (transform != KVH_TRANSFORM_NONE && transform != KVH_TRANSFORM_KVCM) {
      return absl::InvalidArgumentError(
          absl::StrCat("transform: unknown value ", transform));
    }
    client::FetchSource src;
    KVH_TRY(kvharbor::capi::MakeSource(source, &src));
    auto r = c->client->FetchTransformed(
        ns, src, static_cast<client::FetchTransform>(transform), call);
    if (!r.ok()) return r.status();
    if (r->bytes.size() > dst_capacity) {
      return absl::InvalidArgumentError(
          absl::StrCat("dst: holds ", dst_capacity, " bytes; the result of ",
                       r->output_tokens, " tokens needs ", r->bytes.size()));
    }
    std::memcpy(dst, r->bytes.data(), r->bytes.size());
    if (out != nullptr) {
      out->input_tokens = r->input_tokens;
      out->output_tokens = r->output_tokens;
      out->bytes_written = r->bytes.size();
    }
    return absl::OkStatus();
  });
}

int kvh_get_host_handles(kvh_client* c, const char* ns, uint64_t lease_id,
                         int64_t timeout_ms, char** handles_json) {
  return HandlesCall(
      c, ns, timeout_ms, handles_json,
      [&](const CallOptions& call) {
        return c->client->GetHostHandles(ns, lease_id, call);
      },
      kvharbor::capi::HostHandlesJson);
}

int kvh_get_device_handles(kvh_client* c, const char* ns, uint64_t lease_id,
                           int64_t timeout_ms, char** handles_json) {
  return HandlesCall(
      c, ns, timeout_ms, handles_json,
      [&](const CallOptions& call) {
        return c->client->GetDeviceHandles(ns, lease_id, call);
      },
      kvharbor::capi::DeviceHandlesJson);
}

int kvh_get_host_fetch_stats(kvh_client* c, kvh_host_fetch_stats* out) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    KVH_TRY(NotNull(out, "out"));
    const client::HostFetchStats s = c->client->host_fetch_stats();
    out->shm_fetches = s.shm_fetches;
    out->shm_pages = s.shm_pages;
    out->fallbacks = s.fallbacks;
    out->checksum_mismatches = s.checksum_mismatches;
    out->connects = s.connects;
    return absl::OkStatus();
  });
}

}  // extern "C"
