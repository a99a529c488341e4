// The engine API of the C ABI (capi/kvharbor_c.h, ABI 5;
// docs/engines_api.md): sequences of token ids or page keys, appends,
// layer-range fetches and layer-by-layer uploads, over the SDK's
// client::Sequence, InsertOptions, FetchSource::Layers and
// client::LayerUpload.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/capi_names.h"
#include "capi/capi_util.h"
#include "capi/kvharbor_c.h"
#include "kvharbor/layer_upload.h"

struct kvh_upload {
  std::unique_ptr<kvharbor::client::LayerUpload> upload;
};

namespace kvharbor {
namespace capi {
namespace {

// A kvh_sequence as the SDK's view of it; `keys` holds the key views.
absl::StatusOr<client::Sequence> MakeSequence(
    const kvh_sequence* in, std::vector<absl::string_view>* keys) {
  if (in == nullptr) {
    return absl::InvalidArgumentError("sequence: must not be null");
  }
  if (in->struct_size != sizeof(kvh_sequence)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence.struct_size: ", in->struct_size, " is not ",
                     sizeof(kvh_sequence), " (the ABI 5 kvh_sequence)"));
  }
  if ((in->num_tokens > 0) == (in->num_keys > 0)) {
    return absl::InvalidArgumentError(
        "sequence: give token ids (num_tokens) or page keys (num_keys), "
        "exactly one of the two");
  }
  if (in->num_tokens > 0) {
    KVH_TRY(CheckTokens(in->tokens, in->num_tokens));
    return client::Sequence::OfTokens(
        absl::MakeConstSpan(in->tokens, in->num_tokens));
  }
  KVH_TRY(NotNull(in->keys, "sequence.keys"));
  KVH_TRY(NotNull(in->key_lens, "sequence.key_lens"));
  keys->clear();
  for (size_t i = 0; i < in->num_keys; ++i) {
    if (in->keys[i] == nullptr && in->key_lens[i] > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence.keys[", i, "]: null"));
    }
    keys->emplace_back(static_cast<const char*>(in->keys[i]), in->key_lens[i]);
  }
  return client::Sequence::OfKeys(*keys);
}

absl::StatusOr<client::InsertOptions> MakeOptions(
    const kvh_insert_options* in) {
  client::InsertOptions out;
  if (in == nullptr) return out;
  if (in->struct_size != sizeof(kvh_insert_options)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.struct_size: ", in->struct_size, " is not ",
        sizeof(kvh_insert_options), " (the ABI 5 kvh_insert_options)"));
  }
  out.skip_pages = in->skip_pages;
  out.prefix_lease_id = in->prefix_lease_id;
  out.retry_full = in->no_retry == 0;
  return out;
}

// What the sequence calls unpack: the sequence (whose page-key views
// `keys` holds), the insert options and the deadline.
struct SeqArgs {
  std::vector<absl::string_view> keys;
  std::optional<client::Sequence> sequence;
  client::InsertOptions options;
  CallOptions call;
};

// Checks the client, `ns` and the call's argument `arg` (named `field`),
// then unpacks `seq`, `opts` and `timeout_ms`.
absl::Status UnpackSeq(const kvh_client* c, const char* ns, const void* arg,
                       const char* field, const kvh_sequence* seq,
                       const kvh_insert_options* opts, int64_t timeout_ms,
                       SeqArgs* out) {
  KVH_TRY(CheckClient(c));
  KVH_TRY(NotNull(ns, "ns"));
  KVH_TRY(NotNull(arg, field));
  absl::StatusOr<client::Sequence> s = MakeSequence(seq, &out->keys);
  if (!s.ok()) return s.status();
  out->sequence.emplace(*s);
  absl::StatusOr<client::InsertOptions> o = MakeOptions(opts);
  if (!o.ok()) return o.status();
  out->options = *o;
  return CheckTimeout(timeout_ms, &out->call);
}

absl::Status CheckUpload(const kvh_upload* up) {
  if (up == nullptr || up->upload == nullptr) {
    return absl::InvalidArgumentError("upload: must not be null");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace capi
}  // namespace kvharbor

using kvharbor::capi::CheckUpload;
using kvharbor::capi::SeqArgs;
using kvharbor::capi::UnpackSeq;

extern "C" {

int kvh_match_seq(kvh_client* c, const char* ns, const kvh_sequence* seq,
                  int lock, int64_t lease_ttl_ms, uint64_t* handles,
                  int32_t* page_tiers, size_t handles_capacity,
                  kvh_match_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    SeqArgs a;
    KVH_TRY(UnpackSeq(c, ns, out, "out", seq, nullptr, timeout_ms, &a));
    if (handles_capacity > 0) KVH_TRY(NotNull(handles, "handles"));
    if (lease_ttl_ms < 0) {
      return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
    }
    auto lease = c->client->Match(ns, *a.sequence, lock != 0,
                                  absl::Milliseconds(lease_ttl_ms), a.call);
    if (!lease.ok()) return lease.status();
    if (lease->pages.size() > handles_capacity) {
      // The caller cannot learn the handles: give the lease back.
      if (lease->locked()) (void)c->client->Release(lease->id, a.call);
      return absl::OutOfRangeError(
          absl::StrCat("handles_capacity: ", handles_capacity, " is less than ",
                       lease->pages.size(), " matched pages"));
    }
    for (size_t i = 0; i < lease->pages.size(); ++i) {
      handles[i] = lease->pages[i];
      if (page_tiers != nullptr) {
        page_tiers[i] = i < lease->page_tiers.size()
                            ? static_cast<int32_t>(lease->page_tiers[i])
                            : KVH_TIER_RAW;
      }
    }
    kvharbor::capi::SetMatchResult(*lease, out);
    return absl::OkStatus();
  });
}

int kvh_insert_seq(kvh_client* c, const char* ns, const kvh_sequence* seq,
                   const kvh_insert_options* options, const void* pages,
                   size_t pages_len, uint64_t page_bytes,
                   kvh_insert_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    SeqArgs a;
    KVH_TRY(UnpackSeq(c, ns, pages, "pages", seq, options, timeout_ms, &a));
    auto r = c->client->Insert(
        ns, *a.sequence,
        absl::MakeConstSpan(static_cast<const uint8_t*>(pages), pages_len),
        page_bytes, a.options, a.call);
    return ReturnInsert(r, out);
  });
}

int kvh_insert_seq_pages(kvh_client* c, const char* ns, const kvh_sequence* seq,
                         const kvh_insert_options* options,
                         const void* const* pages, size_t num_pages,
                         uint64_t page_bytes, kvh_insert_result* out,
                         int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    SeqArgs a;
    KVH_TRY(UnpackSeq(c, ns, pages, "pages", seq, options, timeout_ms, &a));
    if (page_bytes == 0) {
      return absl::InvalidArgumentError("page_bytes: must be > 0");
    }
    std::vector<absl::Span<const uint8_t>> views;
    for (size_t i = 0; i < num_pages; ++i) {
      if (pages[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("pages[", i, "]: null"));
      }
      views.push_back(absl::MakeConstSpan(static_cast<const uint8_t*>(pages[i]),
                                          page_bytes));
    }
    auto r = c->client->Insert(ns, *a.sequence, views, a.options, a.call);
    return ReturnInsert(r, out);
  });
}

int kvh_fetch_layers(kvh_client* c, const char* ns,
                     const kvh_fetch_source* source, uint32_t layer_begin,
                     uint32_t layer_end, void* dst, size_t dst_capacity,
                     kvh_fetch_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    kvharbor::capi::FetchCall f;
    KVH_TRY(kvharbor::capi::MakeFetchCall(c, ns, dst, "dst", source, timeout_ms,
                                          &f));
    auto r = c->client->FetchInto(
        ns, f.source.Layers(layer_begin, layer_end),
        absl::MakeSpan(static_cast<uint8_t*>(dst), dst_capacity), f.call);
    return ReturnFetch(r, out);
  });
}

int kvh_fetch_pages_layers(kvh_client* c, const char* ns,
                           const kvh_fetch_source* source, uint32_t layer_begin,
                           uint32_t layer_end, void* const* page_dsts,
                           size_t num_dsts, uint64_t page_capacity,
                           kvh_fetch_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    kvharbor::capi::FetchCall f;
    KVH_TRY(kvharbor::capi::MakeFetchCall(c, ns, page_dsts, "page_dsts", source,
                                          timeout_ms, &f));
    auto r = c->client->FetchInto(
        ns, f.source.Layers(layer_begin, layer_end),
        absl::MakeConstSpan(reinterpret_cast<uint8_t* const*>(page_dsts),
                            num_dsts),
        page_capacity, f.call);
    return ReturnFetch(r, out);
  });
}

int kvh_begin_insert(kvh_client* c, const char* ns, const kvh_sequence* seq,
                     const kvh_insert_options* options, int64_t timeout_ms,
                     kvh_upload** out) {
  return Guard([&]() -> absl::Status {
    SeqArgs a;
    KVH_TRY(UnpackSeq(c, ns, out, "out", seq, options, timeout_ms, &a));
    auto up = c->client->BeginInsert(ns, *a.sequence, a.options, a.call);
    if (!up.ok()) return up.status();
    auto handle = std::make_unique<kvh_upload>();
    handle->upload = *std::move(up);
    *out = handle.release();
    return absl::OkStatus();
  });
}

int kvh_upload_info(const kvh_upload* up, uint32_t* num_layers,
                    uint32_t* sent_pages, uint64_t* layer_bytes,
                    uint32_t* next_layer) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckUpload(up));
    if (num_layers != nullptr) *num_layers = up->upload->num_layers();
    if (sent_pages != nullptr) *sent_pages = up->upload->sent_pages();
    if (layer_bytes != nullptr) *layer_bytes = up->upload->layer_bytes();
    if (next_layer != nullptr) *next_layer = up->upload->next_layer();
    return absl::OkStatus();
  });
}

int kvh_upload_send_layer(kvh_upload* up, uint32_t layer, const void* data,
                          size_t len) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckUpload(up));
    if (len > 0) KVH_TRY(NotNull(data, "data"));
    return up->upload->SendLayer(
        layer, absl::MakeConstSpan(static_cast<const uint8_t*>(data), len));
  });
}

int kvh_upload_send_layer_pieces(kvh_upload* up, uint32_t layer,
                                 const void* const* pieces, const size_t* lens,
                                 size_t num_pieces) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckUpload(up));
    if (num_pieces > 0) {
      KVH_TRY(NotNull(pieces, "pieces"));
      KVH_TRY(NotNull(lens, "lens"));
    }
    std::vector<absl::Span<const uint8_t>> views;
    for (size_t i = 0; i < num_pieces; ++i) {
      views.push_back(
          absl::MakeConstSpan(static_cast<const uint8_t*>(pieces[i]), lens[i]));
    }
    return up->upload->SendLayer(layer, views);
  });
}

int kvh_upload_send_layer_from_layout(kvh_upload* up, uint32_t layer,
                                      const kvh_kv_layout* layout,
                                      const int64_t* block_ids,
                                      size_t num_blocks) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckUpload(up));
    if (num_blocks > 0) KVH_TRY(NotNull(block_ids, "block_ids"));
    kvharbor::PagedKvLayout l;
    KVH_TRY(kvharbor::capi::MakeLayout(layout, &l));
    return up->upload->SendLayerFromLayout(
        layer, l, absl::MakeConstSpan(block_ids, num_blocks));
  });
}

int kvh_upload_commit(kvh_upload* up, kvh_insert_result* out) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckUpload(up));
    auto r = up->upload->Commit();
    return ReturnInsert(r, out);
  });
}

void kvh_upload_abort(kvh_upload* up) {
  if (up != nullptr && up->upload != nullptr) up->upload->Abort();
}

void kvh_upload_free(kvh_upload* up) { delete up; }

}  // extern "C"
