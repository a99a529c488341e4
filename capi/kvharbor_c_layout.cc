// The engine-layout calls of the C ABI (capi/kvharbor_c.h, ABI 4 and 6):
// kvh_fetch_to_layout, kvh_insert_from_layout and
// kvh_insert_from_layout_with. Host layouts take the
// SDK's CPU path (include/kvharbor/layout_fetch.h); GPU layouts the
// LayoutTransfer of kvharbor_client_cuda (client/cuda/layout_transfer.h) when
// the library is built with CUDA (KVHARBOR_CAPI_CUDA), else UNIMPLEMENTED
// naming the build.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "capi/capi_names.h"
#include "capi/capi_util.h"
#include "capi/json.h"
#include "capi/kvharbor_c.h"
#include "kvharbor/layout_fetch.h"
#if KVHARBOR_CAPI_CUDA
#include "client/cuda/layout_transfer.h"
#endif

namespace kvharbor {
namespace capi {

struct GpuTransfers {
#if KVHARBOR_CAPI_CUDA
  std::unique_ptr<client::LayoutTransfer> transfer;
#endif
};

absl::Status MakeLayout(const kvh_kv_layout* in, PagedKvLayout* out) {
  if (in == nullptr)
    return absl::InvalidArgumentError("layout: must not be null");
  if (in->struct_size != sizeof(kvh_kv_layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.struct_size: ", in->struct_size, " is not ",
                     sizeof(kvh_kv_layout), " (the ABI 4 kvh_kv_layout)"));
  }
  if (in->num_layers == 0) {
    return absl::InvalidArgumentError("layout.num_layers: must be >= 1");
  }
  KVH_TRY(NotNull(in->k, "layout.k"));
  KVH_TRY(NotNull(in->v, "layout.v"));
  out->dtype = static_cast<DType>(in->dtype);
  out->device = in->device;
  out->layer_begin = in->layer_begin;
  out->k.assign(in->k, in->k + in->num_layers);
  out->v.assign(in->v, in->v + in->num_layers);
  if (in->k_bytes != nullptr) {
    out->k_bytes.assign(in->k_bytes, in->k_bytes + in->num_layers);
  }
  if (in->v_bytes != nullptr) {
    out->v_bytes.assign(in->v_bytes, in->v_bytes + in->num_layers);
  }
  out->num_kv_heads = in->num_kv_heads;
  out->head_dim = in->head_dim;
  out->block_size = in->block_size;
  out->num_blocks = in->num_blocks;
  out->block_stride = in->block_stride;
  out->token_stride = in->token_stride;
  out->head_stride = in->head_stride;
  return absl::OkStatus();
}

namespace {

#if KVHARBOR_CAPI_CUDA
absl::StatusOr<client::LayoutTransfer*> Transfers(kvh_client* c) {
  absl::MutexLock l(&c->gpu_mu);
  if (c->gpu == nullptr) {
    auto t = client::LayoutTransfer::Create(c->client.get());
    if (!t.ok()) return t.status();
    auto g = std::make_shared<GpuTransfers>();
    g->transfer = *std::move(t);
    c->gpu = std::move(g);
  }
  return c->gpu->transfer.get();
}
#endif

#if !KVHARBOR_CAPI_CUDA
absl::Status NoGpu(const PagedKvLayout& l) {
  return absl::UnimplementedError(absl::StrCat(
      "layout.device: ", l.device,
      " is GPU memory, but this libkvharbor_c was built without CUDA (no "
      "kvharbor_client_cuda); use a host layout (device -1) or a CUDA build"));
}
#endif

// kvh_layout_insert_options, checked; what a CPU build needs of it too.
struct InsertOptions {
  uint64_t stream = 0;
  std::optional<bool> device_ipc;  // unset: KVH_MODE_AUTO
  absl::Duration ttl = absl::ZeroDuration();
};

absl::Status MakeInsertOptions(const kvh_layout_insert_options* in,
                               InsertOptions* out) {
  if (in == nullptr) return absl::OkStatus();
  if (in->struct_size != sizeof(kvh_layout_insert_options)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.struct_size: ", in->struct_size, " is not ",
        sizeof(kvh_layout_insert_options), " (the ABI 6 options)"));
  }
  if (in->device_ipc != KVH_MODE_AUTO) {
    int mode = 0;
    KVH_TRY(CheckMode(in->device_ipc, "options.device_ipc", &mode));
    out->device_ipc = mode == KVH_MODE_ON;
  }
  out->stream = in->cuda_stream;
  out->ttl = absl::Milliseconds(in->ttl_ms);
  return absl::OkStatus();
}

// What both layout calls check first: the client, `ns`, the blocks of
// `num_pages` pages, and `layout`, unpacked into `l`.
absl::Status CheckLayoutCall(const kvh_client* c, const char* ns,
                             const int64_t* block_ids, size_t num_pages,
                             const kvh_kv_layout* layout, PagedKvLayout* l) {
  KVH_TRY(CheckClient(c));
  KVH_TRY(NotNull(ns, "ns"));
  if (num_pages == 0)
    return absl::InvalidArgumentError("num_pages: must be > 0");
  KVH_TRY(NotNull(block_ids, "block_ids"));
  return MakeLayout(layout, l);
}

}  // namespace
}  // namespace capi
}  // namespace kvharbor

extern "C" {

int kvh_gpu_transfers(void) { return KVHARBOR_CAPI_CUDA ? 1 : 0; }

int kvh_fetch_to_layout(kvh_client* c, const char* ns, uint64_t lease_id,
                        uint32_t start_page, const int32_t* page_tiers,
                        size_t num_page_tiers, const kvh_kv_layout* layout,
                        const int64_t* block_ids, size_t num_pages, int format,
                        uint64_t cuda_stream, int64_t timeout_ms,
                        char** result_json) {
  using namespace kvharbor::capi;  // NOLINT: the helpers of this file
  return Guard([&]() -> absl::Status {
    kvharbor::PagedKvLayout l;
    KVH_TRY(CheckLayoutCall(c, ns, block_ids, num_pages, layout, &l));
    if (num_page_tiers > 0) KVH_TRY(NotNull(page_tiers, "page_tiers"));
    client::LayoutFetchOptions o;
    o.start_page = start_page;
    for (size_t i = 0; i < num_page_tiers; ++i) {
      if (page_tiers[i] < KVH_TIER_RAW || page_tiers[i] > KVH_TIER_DISK) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page_tiers[", i, "]: ", page_tiers[i], " is not a tier"));
      }
      o.page_tiers.push_back(static_cast<client::Tier>(page_tiers[i]));
    }
    if (format == KVH_FETCH_RAW) {
      o.format = client::FetchFormat::kRaw;
    } else if (format == KVH_FETCH_COMPRESSED) {
      o.format = client::FetchFormat::kCompressed;
    } else if (format != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("format: ", format,
                       " (-1 automatic, KVH_FETCH_RAW, "
                       "KVH_FETCH_COMPRESSED)"));
    }
    o.stream = cuda_stream;
    kvharbor::CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    const auto blocks = absl::MakeConstSpan(block_ids, num_pages);
    absl::StatusOr<client::TransferResult> r;
    if (!l.on_device()) {
      r = client::FetchToHostLayout(*c->client, ns, lease_id, l, blocks, o,
                                    call);
    } else {
#if KVHARBOR_CAPI_CUDA
      absl::StatusOr<client::LayoutTransfer*> t = Transfers(c);
      if (!t.ok()) return t.status();
      r = (*t)->Fetch(ns, lease_id, l, blocks, o, call);
#else
      return NoGpu(l);
#endif
    }
    if (!r.ok()) return r.status();
    if (result_json != nullptr) {
      return ReturnString(TransferResultJson(*r), result_json);
    }
    return absl::OkStatus();
  });
}

int kvh_insert_from_layout(kvh_client* c, const char* ns, const int32_t* tokens,
                           size_t num_tokens, const kvh_kv_layout* layout,
                           const int64_t* block_ids, size_t num_pages,
                           uint64_t cuda_stream, kvh_insert_result* out,
                           int64_t timeout_ms, char** result_json) {
  kvh_layout_insert_options o{};
  o.struct_size = sizeof(o);
  o.cuda_stream = cuda_stream;
  return kvh_insert_from_layout_with(c, ns, tokens, num_tokens, layout,
                                     block_ids, num_pages, &o, out, timeout_ms,
                                     result_json);
}

int kvh_insert_from_layout_with(kvh_client* c, const char* ns,
                                const int32_t* tokens, size_t num_tokens,
                                const kvh_kv_layout* layout,
                                const int64_t* block_ids, size_t num_pages,
                                const kvh_layout_insert_options* options,
                                kvh_insert_result* out, int64_t timeout_ms,
                                char** result_json) {
  using namespace kvharbor::capi;  // NOLINT: the helpers of this file
  return Guard([&]() -> absl::Status {
    kvharbor::PagedKvLayout l;
    KVH_TRY(CheckLayoutCall(c, ns, block_ids, num_pages, layout, &l));
    KVH_TRY(CheckTokens(tokens, num_tokens));
    InsertOptions o;
    KVH_TRY(MakeInsertOptions(options, &o));
    kvharbor::CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    const auto toks = absl::MakeConstSpan(tokens, num_tokens);
    const auto blocks = absl::MakeConstSpan(block_ids, num_pages);
    absl::StatusOr<std::pair<client::InsertResult, client::TransferResult>> r;
    if (!l.on_device() && o.device_ipc.value_or(false)) {
      return absl::InvalidArgumentError(
          "device_ipc: KVH_MODE_ON, but the layout is host memory "
          "(layout.device -1); DeviceInsert by CUDA IPC gathers from a GPU "
          "layout");
    }
    if (!l.on_device()) {
      r = client::InsertFromHostLayout(*c->client, ns, toks, l, blocks, call);
    } else {
#if KVHARBOR_CAPI_CUDA
      absl::StatusOr<client::LayoutTransfer*> t = Transfers(c);
      if (!t.ok()) return t.status();
      client::LayoutInsertOptions lo;
      lo.stream = o.stream;
      lo.device_ipc = o.device_ipc;
      lo.ttl = o.ttl;
      r = (*t)->Insert(ns, toks, l, blocks, lo, call);
#else
      return NoGpu(l);
#endif
    }
    if (!r.ok()) return r.status();
    if (out != nullptr) SetInsertResult(r->first, out);
    if (result_json != nullptr) {
      return ReturnString(TransferResultJson(r->second), result_json);
    }
    return absl::OkStatus();
  });
}

}  // extern "C"
