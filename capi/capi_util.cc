#include "capi/capi_util.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/time/time.h"

namespace kvharbor {
namespace capi {

namespace {

// Sizes of kvh_namespace_spec this library reads: ABI 2 (through
// disk_bytes) and the whole struct (ABI 5: kvcm_path, online calibration,
// key_kind).
constexpr size_t kSpecV2Size = offsetof(kvh_namespace_spec, kvcm_path);
constexpr size_t kSpecV5Size = offsetof(kvh_namespace_spec, topology);
constexpr size_t kSpecV8Size = sizeof(kvh_namespace_spec);

absl::Status MakeOnlineCalibration(const kvh_online_calibration& in,
                                   client::OnlineCalibration* out) {
  if (in.enabled == 0) return absl::OkStatus();
  if (in.row_kind != KVH_KVTC_ROWS_PER_TOKEN &&
      in.row_kind != KVH_KVTC_ROWS_PER_PAGE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.online_calibration.row_kind: unknown value ", in.row_kind));
  }
  if (in.rope_style < KVH_ROPE_NONE || in.rope_style > KVH_ROPE_HALF_SPLIT) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.online_calibration.rope_style: unknown value ", in.rope_style));
  }
  if (in.sink_tokens < -1 || in.sink_tokens > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.online_calibration.sink_tokens: ", in.sink_tokens,
                     " is not -1 (default) or in [0, 2^32)"));
  }
  // 0 (and sink_tokens -1) keep the defaults *out holds, which are the
  // daemon's (types/online_calibration.h).
  out->enabled = true;
  if (in.min_tokens != 0) out->min_tokens = in.min_tokens;
  out->max_sample_tokens = in.max_sample_tokens;
  if (in.target_ratio != 0) out->target_ratio = in.target_ratio;
  out->row_kind = in.row_kind == KVH_KVTC_ROWS_PER_PAGE
                      ? client::KvtcRowKind::kPerPage
                      : client::KvtcRowKind::kPerToken;
  out->rope_style = static_cast<client::RopeStyle>(in.rope_style);
  if (in.sink_tokens >= 0) {
    out->sink_tokens = static_cast<uint32_t>(in.sink_tokens);
  }
  return absl::OkStatus();
}

// The ABI 4 path options of kvh_connect_options.
absl::Status PathOptions(const kvh_connect_options& in, absl::string_view field,
                         ClientOptions* o) {
  int host = 0, ipc = 0, decode = 0;
  KVH_TRY(CheckMode(in.host_fetch, absl::StrCat(field, ".host_fetch"), &host));
  KVH_TRY(CheckMode(in.device_ipc, absl::StrCat(field, ".device_ipc"), &ipc));
  KVH_TRY(
      CheckMode(in.gpu_decode, absl::StrCat(field, ".gpu_decode"), &decode));
  o->host_fetch = host == KVH_MODE_ON    ? HostFetchMode::kOn
                  : host == KVH_MODE_OFF ? HostFetchMode::kOff
                                         : HostFetchMode::kAuto;
  o->device_ipc = ipc == KVH_MODE_ON    ? DeviceIpcMode::kOn
                  : ipc == KVH_MODE_OFF ? DeviceIpcMode::kOff
                                        : DeviceIpcMode::kAuto;
  o->gpu_decode = decode != KVH_MODE_OFF;
  return absl::OkStatus();
}

// The ABI 7 data plane options of kvh_connect_options.
absl::Status DataPlaneOptions(const kvh_connect_options& in,
                              absl::string_view field, ClientOptions* o) {
  int mode = 0;
  KVH_TRY(CheckMode(in.data_plane, absl::StrCat(field, ".data_plane"), &mode));
  o->data_plane = mode == KVH_MODE_ON    ? DataPlaneMode::kOn
                  : mode == KVH_MODE_OFF ? DataPlaneMode::kOff
                                         : DataPlaneMode::kAuto;
  if (in.data_plane_connections > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data_plane_connections: ", in.data_plane_connections,
        " is not 0 (= 4) to 16"));
  }
  if (in.data_plane_connections != 0) {
    o->data_plane_connections = in.data_plane_connections;
  }
  return absl::OkStatus();
}

// The ABI 6 GPU options of kvh_connect_options.
absl::Status GpuOptions(const kvh_connect_options& in, absl::string_view field,
                        ClientOptions* o) {
  o->stage_cold = in.stage_cold != 0;
  switch (in.gpu_decode_gemm) {
    case KVH_GEMM_DEFAULT:
    case KVH_GEMM_TF32:
      o->gpu_decode_gemm = client::GpuDecodeGemm::kTf32;
      return absl::OkStatus();
    case KVH_GEMM_FP32:
      o->gpu_decode_gemm = client::GpuDecodeGemm::kFp32;
      return absl::OkStatus();
    case KVH_GEMM_BF16:
      o->gpu_decode_gemm = client::GpuDecodeGemm::kBf16;
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".gpu_decode_gemm: ", in.gpu_decode_gemm,
                   " is not KVH_GEMM_DEFAULT, KVH_GEMM_FP32, KVH_GEMM_TF32 "
                   "or KVH_GEMM_BF16"));
}

}  // namespace

absl::Status CheckMode(int v, absl::string_view field, int* out) {
  if (v != KVH_MODE_AUTO && v != KVH_MODE_ON && v != KVH_MODE_OFF) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", v, " is not KVH_MODE_AUTO, KVH_MODE_ON or KVH_MODE_OFF"));
  }
  *out = v;
  return absl::OkStatus();
}

const char* OrEmpty(const char* s) { return s != nullptr ? s : ""; }

char* CopyString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return nullptr;
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

absl::Status MakeSource(const kvh_fetch_source* in, client::FetchSource* out) {
  if (in == nullptr) {
    return absl::InvalidArgumentError("source: must not be null");
  }
  if (in->num_handles > 0 && in->handles == nullptr) {
    return absl::InvalidArgumentError(
        "source.handles: null with num_handles > 0");
  }
  out->lease_id = in->lease_id;
  out->start_page = in->start_page;
  out->page_count = in->page_count;
  out->pages = absl::MakeConstSpan(in->handles, in->num_handles);
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> DefaultTimeout(int64_t ms,
                                              absl::string_view field) {
  if (ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", ms, " must not be negative"));
  }
  return ms == 0 ? absl::InfiniteDuration() : absl::Milliseconds(ms);
}

absl::Status MakeClientOptions(const kvh_connect_options* in,
                               absl::string_view field, ClientOptions* out) {
  out->default_timeout = absl::InfiniteDuration();
  if (in == nullptr) return absl::OkStatus();
  // ABI 3 ends at token, ABI 4 at gpu_decode (the path options), ABI 5 at
  // no_checksums.
  constexpr size_t kAbi3Size = offsetof(kvh_connect_options, host_fetch);
  constexpr size_t kAbi4Size = offsetof(kvh_connect_options, own_connection);
  constexpr size_t kAbi5Size = offsetof(kvh_connect_options, stage_cold);
  constexpr size_t kAbi6Size = offsetof(kvh_connect_options, data_plane);
  if (in->struct_size != kAbi3Size && in->struct_size != kAbi4Size &&
      in->struct_size != kAbi5Size && in->struct_size != kAbi6Size &&
      in->struct_size != sizeof(kvh_connect_options)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".struct_size: ", in->struct_size, " is not ",
                     sizeof(kvh_connect_options), " (ABI 7), ", kAbi6Size,
                     " (ABI 6), ", kAbi5Size, " (ABI 5), ", kAbi4Size,
                     " (ABI 4) or ", kAbi3Size, " (ABI 3)"));
  }
  absl::StatusOr<absl::Duration> timeout = DefaultTimeout(
      in->default_timeout_ms, absl::StrCat(field, ".default_timeout_ms"));
  if (!timeout.ok()) return timeout.status();
  out->default_timeout = *timeout;
  out->tls = in->tls != 0;
  out->tls_ca_file = OrEmpty(in->tls_ca_file);
  out->tls_cert_file = OrEmpty(in->tls_cert_file);
  out->tls_key_file = OrEmpty(in->tls_key_file);
  out->tls_server_name = OrEmpty(in->tls_server_name);
  out->token = OrEmpty(in->token);
  if (in->struct_size < kAbi4Size) return absl::OkStatus();
  KVH_TRY(PathOptions(*in, field, out));
  if (in->struct_size < kAbi5Size) return absl::OkStatus();
  if (in->max_reconnect_backoff_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".max_reconnect_backoff_ms: ", in->max_reconnect_backoff_ms,
        " must not be negative"));
  }
  out->own_connection = in->own_connection != 0;
  out->max_reconnect_backoff = absl::Milliseconds(in->max_reconnect_backoff_ms);
  out->fetch_chunk_bytes = in->fetch_chunk_bytes;
  if (in->insert_chunk_bytes != 0) {
    out->insert_chunk_bytes = in->insert_chunk_bytes;
  }
  out->send_checksums = out->verify_checksums = in->no_checksums == 0;
  if (in->struct_size < kAbi6Size) return absl::OkStatus();
  KVH_TRY(GpuOptions(*in, field, out));
  if (in->struct_size < sizeof(kvh_connect_options)) return absl::OkStatus();
  return DataPlaneOptions(*in, field, out);
}

void SetFetchResult(const client::FetchResult& r, kvh_fetch_result* out) {
  out->num_pages = r.num_pages;
  out->page_bytes = r.page_bytes;
  out->bytes_written = uint64_t{r.num_pages} * r.page_bytes;
}

absl::Status ReturnFetch(const absl::StatusOr<client::FetchResult>& r,
                         kvh_fetch_result* out) {
  if (r.ok() && out != nullptr) SetFetchResult(*r, out);
  return r.status();
}

absl::Status ReturnInsert(const absl::StatusOr<client::InsertResult>& r,
                          kvh_insert_result* out) {
  if (r.ok() && out != nullptr) SetInsertResult(*r, out);
  return r.status();
}

absl::Status MakeFetchCall(const kvh_client* c, const char* ns, const void* dst,
                           const char* dst_field,
                           const kvh_fetch_source* source, int64_t timeout_ms,
                           FetchCall* out) {
  KVH_TRY(CheckClient(c));
  KVH_TRY(NotNull(ns, "ns"));
  KVH_TRY(NotNull(dst, dst_field));
  KVH_TRY(MakeSource(source, &out->source));
  return CheckTimeout(timeout_ms, &out->call);
}

void SetMatchResult(const client::Lease& r, kvh_match_result* out) {
  out->lease_id = r.id;
  out->lease_expires_unix_ms = r.locked() ? absl::ToUnixMillis(r.expiry) : 0;
  out->matched_tokens = r.matched_tokens;
  out->page_bytes = r.page_bytes;
  out->num_pages = r.pages.size();
}

absl::Status MakeSpec(const kvh_namespace_spec* in,
                      client::NamespaceSpec* out) {
  if (in == nullptr) {
    return absl::InvalidArgumentError("spec: must not be null");
  }
  if (in->struct_size != kSpecV2Size && in->struct_size != kSpecV5Size &&
      in->struct_size != kSpecV8Size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.struct_size: ", in->struct_size,
        " is not a size this library "
        "(ABI ",
        KVH_ABI_VERSION,
        ") knows; set it to "
        "sizeof(kvh_namespace_spec), ",
        kSpecV8Size, " (ABI 5: ", kSpecV5Size, "; ABI 2: ", kSpecV2Size, ")"));
  }
  if (in->name == nullptr) {
    return absl::InvalidArgumentError("spec.name: must not be null");
  }
  if (in->calibration_len > 0 && in->calibration == nullptr) {
    return absl::InvalidArgumentError(
        "spec.calibration: null with calibration_len > 0");
  }
  const kvh_geometry& g = in->geometry;
  out->name = in->name;
  out->geometry.num_layers = g.num_layers;
  out->geometry.num_kv_heads = g.num_kv_heads;
  out->geometry.head_dim = g.head_dim;
  out->geometry.page_size = g.page_size;
  out->geometry.dtype = static_cast<client::DType>(g.dtype);
  out->geometry.layout = static_cast<client::PageLayout>(g.layout);
  out->geometry.rope_theta = g.rope_theta;
  out->capacity_bytes = in->capacity_bytes;
  out->codec = OrEmpty(in->codec);
  out->calibration_path = OrEmpty(in->calibration_path);
  if (in->calibration_len > 0) {
    out->calibration.assign(static_cast<const char*>(in->calibration),
                            in->calibration_len);
  }
  out->host_compressed_bytes = in->host_compressed_bytes;
  out->disk_dir = OrEmpty(in->disk_dir);
  out->disk_bytes = in->disk_bytes;
  if (in->struct_size < kSpecV5Size) return absl::OkStatus();
  out->kvcm_path = OrEmpty(in->kvcm_path);
  // Page hashes came with ABI 8: an ABI 5 caller cannot mean them.
  const bool v8 = in->struct_size >= kSpecV8Size;
  if (in->key_kind != KVH_KEY_TOKENS && in->key_kind != KVH_KEY_PAGE_KEYS &&
      !(v8 && in->key_kind == KVH_KEY_PAGE_HASHES)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.key_kind: unknown value ", in->key_kind,
        v8 ? " (KVH_KEY_TOKENS, KVH_KEY_PAGE_KEYS or KVH_KEY_PAGE_HASHES)"
           : " (KVH_KEY_TOKENS or KVH_KEY_PAGE_KEYS; KVH_KEY_PAGE_HASHES "
             "needs the ABI 8 struct_size)"));
  }
  out->key_kind = static_cast<client::KeyKind>(in->key_kind);
  absl::Status online =
      MakeOnlineCalibration(in->online_calibration, &out->online_calibration);
  if (!online.ok() || !v8) return online;
  const kvh_topology& t = in->topology;
  out->topology.model = OrEmpty(t.model);
  out->topology.total_layers = t.total_layers;
  out->topology.layer_begin = t.layer_begin;
  out->topology.layer_end = t.layer_end;
  out->topology.total_kv_heads = t.total_kv_heads;
  out->topology.kv_head_begin = t.kv_head_begin;
  out->topology.kv_head_end = t.kv_head_end;
  return absl::OkStatus();
}

}  // namespace capi
}  // namespace kvharbor
