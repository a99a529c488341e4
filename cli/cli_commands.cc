#include "cli/cli_commands.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/cli_format.h"
#include "cli/cli_handlers.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace cli {

namespace {

using client::NamespaceInfo;
using client::NamespaceStats;

std::string Str(uint64_t v) { return absl::StrCat(v); }

void AddGeometry(const client::Geometry& g, KeyValues* kv) {
  kv->Add("num_layers", Str(g.num_layers));
  kv->Add("num_kv_heads", Str(g.num_kv_heads));
  kv->Add("head_dim", Str(g.head_dim));
  kv->Add("page_size", absl::StrCat(g.page_size, " tokens"));
  kv->Add("dtype", std::string(client::DTypeName(g.dtype)));
  kv->Add("layout", std::string(client::PageLayoutName(g.layout)));
  if (g.rope_theta != 0.0f) kv->Add("rope_theta", absl::StrCat(g.rope_theta));
}

// "N pages, BYTES" and, while the tier holds pages, its stored ratio: the
// raw bytes the pages represent over the bytes they take there.
std::string TierSummary(const client::TierStats& t, uint64_t page_bytes) {
  std::string out = absl::StrCat(t.pages, " pages, ", BytesWithHuman(t.bytes));
  if (t.pages > 0 && t.bytes > 0) {
    absl::StrAppend(&out, absl::StrFormat(", stored ratio %.2f",
                                          static_cast<double>(t.pages) *
                                              page_bytes / t.bytes));
  }
  return out;
}

// "N cold pages, BYTES, stored ratio R" of one codec over the cold tiers.
std::string CodecSummary(const client::CodecStats& c, uint64_t page_bytes) {
  std::string out =
      absl::StrCat(c.pages, " cold pages, ", BytesWithHuman(c.bytes));
  if (c.bytes > 0) {
    absl::StrAppend(&out, absl::StrFormat(", stored ratio %.2f",
                                          static_cast<double>(c.pages) *
                                              page_bytes / c.bytes));
  }
  return out;
}

// What the active calibration expected: "ratio R (asked T), relative error
// keys K, values V".
std::string CalibrationExpected(const NamespaceStats& s) {
  return absl::StrFormat(
      "ratio %.2f (asked %.2f), relative error keys %.4f, values %.4f",
      s.calibration.expected.expected_ratio,
      s.calibration.expected.target_ratio,
      s.calibration.expected.keys_rel_error,
      s.calibration.expected.values_rel_error);
}

void AddStats(const NamespaceStats& s, KeyValues* kv) {
  kv->Add("page_bytes", BytesWithHuman(s.page_bytes));
  kv->Add("capacity_pages", Str(s.capacity_pages));
  kv->Add("free_pages", Str(s.free_pages));
  kv->Add("cached_pages", Str(s.cached_pages));
  kv->Add("evictable_pages", Str(s.evictable_pages));
  kv->Add("protected_pages", Str(s.protected_pages));
  kv->Add("hit_tokens", Str(s.hit_tokens));
  kv->Add("miss_tokens", Str(s.miss_tokens));
  kv->Add("inserted_pages", Str(s.inserted_pages));
  kv->Add("dedup_pages", Str(s.dedup_pages));
  kv->Add("evicted_pages", Str(s.evicted_pages));
  kv->Add("bytes_in", BytesWithHuman(s.bytes_in));
  kv->Add("bytes_out", BytesWithHuman(s.bytes_out));
  if (s.host_ipc_bytes > 0) {
    kv->Add("host_ipc_bytes", BytesWithHuman(s.host_ipc_bytes));
  }
  kv->Add("memory", BytesWithHuman(s.memory_bytes));
  kv->Add("active_leases", Str(s.active_leases));
  kv->Add("uploads_in_flight", Str(s.uploads_in_flight));
  kv->Add("index_nodes", Str(s.index_nodes));
  kv->Add("index_memory_bytes", BytesWithHuman(s.index_memory_bytes));
  for (const client::TierStats& t : s.tiers) {
    kv->Add(absl::StrCat("tier ", client::TierName(t.tier)),
            TierSummary(t, s.page_bytes));
  }
  kv->Add("demoted_pages", Str(s.demoted_pages));
  kv->Add("promoted_pages", Str(s.promoted_pages));
  kv->Add("disk_write_errors", Str(s.disk_write_errors));
  kv->Add("corrupt_dropped", Str(s.corrupt_dropped));
  const client::CalibrationStats& cal = s.calibration;
  if (cal.state != client::CalibrationState::kNone) {
    kv->Add("calibration_state",
            absl::StrFormat("%s (%u tokens seen, %u sampled)",
                            client::CalibrationStateName(cal.state),
                            cal.tokens_seen, cal.tokens_sampled));
  }
  if (!cal.codec.empty()) {
    kv->Add("active_codec",
            absl::StrFormat("%s (calibration 0x%016x%s)", cal.codec,
                            cal.fingerprint, cal.pinned ? ", pinned" : ""));
  }
  if (s.calibration.expected.expected_ratio > 0) {
    kv->Add("calibration_expected", CalibrationExpected(s));
  }
  for (const client::CodecStats& c : s.codecs) {
    kv->Add(absl::StrCat("codec ", c.codec), CodecSummary(c, s.page_bytes));
  }
}

// --fingerprint (decimal or 0x-hex; 0 = the active calibration).
absl::StatusOr<uint64_t> FingerprintFrom(const Args& args) {
  auto text = args.Get("fingerprint");
  if (!text) return 0;
  KVH_ASSIGN_OR_RETURN(auto v, ParseHandles(*text, "--fingerprint"));
  if (v.size() != 1) {
    return absl::InvalidArgumentError("--fingerprint: give one fingerprint");
  }
  return v[0];
}

// "raw", "host_compressed" or "disk" for --tier; INVALID_ARGUMENT otherwise.
absl::StatusOr<client::Tier> ParseTier(absl::string_view name) {
  for (client::Tier t : {client::Tier::kRaw, client::Tier::kHostCompressed,
                         client::Tier::kDisk}) {
    if (name == client::TierName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--tier: unknown value '", name, "' (want host_compressed or disk)"));
}

// ---- ns ----

absl::Status NsCreate(const Context& ctx, const Args& args,
                      const std::vector<std::string>& pos) {
  client::NamespaceSpec spec;
  spec.name = pos[0];
  client::Geometry& g = spec.geometry;
  KVH_ASSIGN_OR_RETURN(auto layers, args.RequiredUint("layers", UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(auto heads, args.RequiredUint("kv_heads", UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(auto head_dim,
                       args.RequiredUint("head_dim", UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(auto page_size,
                       args.RequiredUint("page_size", UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(auto dtype_name, args.Required("dtype"));
  KVH_ASSIGN_OR_RETURN(auto dtype, client::ParseDType(dtype_name));
  g.num_layers = static_cast<uint32_t>(layers);
  g.num_kv_heads = static_cast<uint32_t>(heads);
  g.head_dim = static_cast<uint32_t>(head_dim);
  g.page_size = static_cast<uint32_t>(page_size);
  g.dtype = dtype;
  if (auto layout = args.Get("layout")) {
    if (*layout ==
        client::PageLayoutName(client::PageLayout::kKvLayerTokenHeadDim)) {
      g.layout = client::PageLayout::kKvLayerTokenHeadDim;
    } else if (*layout == client::PageLayoutName(
                              client::PageLayout::kLayerKvTokenHeadDim)) {
      g.layout = client::PageLayout::kLayerKvTokenHeadDim;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layout: unknown value '", *layout,
          "' (want kv_layer_token_head_dim or layer_kv_token_head_dim)"));
    }
  }
  if (auto theta = args.Get("rope_theta")) {
    if (!absl::SimpleAtof(*theta, &g.rope_theta) || g.rope_theta < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rope_theta: '", *theta, "' is not a number >= 0"));
    }
  }
  KVH_ASSIGN_OR_RETURN(auto capacity, args.Uint("capacity_bytes", 0));
  spec.capacity_bytes = capacity;
  spec.codec = args.Get("codec").value_or("");
  spec.calibration_path = args.Get("calibration").value_or("");
  KVH_ASSIGN_OR_RETURN(spec.host_compressed_bytes,
                       args.Uint("host_compressed_bytes", 0));
  spec.disk_dir = args.Get("disk_dir").value_or("");
  KVH_ASSIGN_OR_RETURN(spec.disk_bytes, args.Uint("disk_bytes", 0));
  spec.kvcm_path = args.Get("kvcm_path").value_or("");
  KVH_ASSIGN_OR_RETURN(spec.key_kind, KeyKindFrom(args));
  KVH_ASSIGN_OR_RETURN(spec.online_calibration.enabled,
                       args.Bool("online_calibration"));
  KVH_ASSIGN_OR_RETURN(spec.online_calibration.min_tokens,
                       args.Uint("online_min_tokens", 0));
  KVH_ASSIGN_OR_RETURN(spec.online_calibration.max_sample_tokens,
                       args.Uint("online_max_sample_tokens", 0));
  if (auto ratio = args.Get("online_target_ratio")) {
    // The daemon checks the range (>= 1 and reachable for the geometry).
    if (!absl::SimpleAtod(*ratio, &spec.online_calibration.target_ratio)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--online_target_ratio: '", *ratio, "' is not a number"));
    }
  }
  KVH_ASSIGN_OR_RETURN(auto if_not_exists, args.Bool("if_not_exists"));
  KVH_ASSIGN_OR_RETURN(
      auto r, ctx.client->CreateNamespace(spec, if_not_exists, ctx.call));
  *ctx.out << (r.created ? "created" : "exists") << " namespace "
           << r.info.spec.name << ": page_bytes "
           << BytesWithHuman(r.info.stats.page_bytes) << ", capacity "
           << r.info.stats.capacity_pages << " pages ("
           << HumanBytes(r.info.spec.capacity_bytes) << ")\n";
  return absl::OkStatus();
}

absl::Status NsList(const Context& ctx, const Args& args,
                    const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto list, ctx.client->ListNamespaces(ctx.call));
  Table t({"NAME", "DTYPE", "LAYERS", "KV_HEADS", "HEAD_DIM", "PAGE_SIZE",
           "PAGE_BYTES", "CAPACITY", "CACHED", "FREE", "LEASES"});
  for (const NamespaceInfo& info : list) {
    const client::Geometry& g = info.spec.geometry;
    t.AddRow({info.spec.name, std::string(client::DTypeName(g.dtype)),
              Str(g.num_layers), Str(g.num_kv_heads), Str(g.head_dim),
              Str(g.page_size), Str(info.stats.page_bytes),
              Str(info.stats.capacity_pages), Str(info.stats.cached_pages),
              Str(info.stats.free_pages), Str(info.stats.active_leases)});
  }
  t.Print(*ctx.out);
  return absl::OkStatus();
}

absl::Status NsDescribe(const Context& ctx, const Args& args,
                        const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto info,
                       ctx.client->DescribeNamespace(pos[0], ctx.call));
  KeyValues kv;
  kv.Add("name", info.spec.name);
  AddGeometry(info.spec.geometry, &kv);
  kv.Add("capacity_bytes", BytesWithHuman(info.spec.capacity_bytes));
  kv.Add("codec", info.spec.codec.empty() ? "(default)" : info.spec.codec);
  if (info.spec.calibration_fingerprint != 0) {
    kv.Add("calibration_fingerprint",
           absl::StrFormat("%016x", info.spec.calibration_fingerprint));
  }
  kv.Add("host_compressed_bytes",
         BytesWithHuman(info.spec.host_compressed_bytes));
  kv.Add("disk_dir",
         info.spec.disk_dir.empty() ? "(none)" : info.spec.disk_dir);
  if (!info.spec.disk_dir.empty()) {
    kv.Add("disk_bytes", info.spec.disk_bytes == 0
                             ? std::string("unlimited")
                             : BytesWithHuman(info.spec.disk_bytes));
  }
  if (!info.spec.kvcm_path.empty()) kv.Add("kvcm_path", info.spec.kvcm_path);
  if (const client::OnlineCalibration& o = info.spec.online_calibration;
      o.enabled) {
    kv.Add("online_calibration",
           absl::StrFormat("target ratio %.2f, min_tokens %u, "
                           "max_sample_tokens %u, %s rows",
                           o.target_ratio, o.min_tokens, o.max_sample_tokens,
                           KvtcRowKindName(o.row_kind)));
  }
  kv.Add("key_kind", std::string(KeyKindName(info.spec.key_kind)));
  const client::Topology& t = info.spec.topology;
  kv.Add("topology",
         absl::StrFormat("model '%s', layers [%u, %u) of %u, KV heads [%u, "
                         "%u) of %u",
                         t.model, t.layer_begin, t.layer_end, t.total_layers,
                         t.kv_head_begin, t.kv_head_end, t.total_kv_heads));
  AddStats(info.stats, &kv);
  kv.Print(*ctx.out);
  return absl::OkStatus();
}

absl::Status NsDelete(const Context& ctx, const Args& args,
                      const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto force, args.Bool("force"));
  absl::Status s = ctx.client->DeleteNamespace(pos[0], force, ctx.call);
  if (!s.ok()) return s;
  *ctx.out << "deleted namespace " << pos[0] << "\n";
  return absl::OkStatus();
}

// ---- match / insert / fetch ----

// fetch --transform kvcm: one lossy, shorter KV sequence instead of pages.
absl::Status FetchTransformed(const Context& ctx, const Args& args,
                              const std::string& ns,
                              const client::FetchSource& source,
                              const std::string& out_path) {
  const std::string name = *args.Get("transform");
  if (name != "kvcm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transform: unknown value '", name, "' (want kvcm)"));
  }
  if (args.Get("format").value_or("raw") != "raw") {
    return absl::InvalidArgumentError(
        "--format: a transformed fetch is raw only");
  }
  KVH_ASSIGN_OR_RETURN(
      auto t, ctx.client->FetchTransformed(
                  ns, source, client::FetchTransform::kKvcm, ctx.call));
  const uint64_t bytes = t.bytes.size();
  std::vector<std::vector<uint8_t>> one;
  one.push_back(std::move(t.bytes));
  KVH_RETURN_IF_ERROR(WriteFile(out_path, "--out", one));
  *ctx.out << "fetched " << t.input_tokens << " tokens transformed by kvcm "
           << "(LOSSY) into " << t.output_tokens << " tokens ("
           << BytesWithHuman(bytes)
           << ", [K|V][layer][token][kv_head][head_dim]) to " << out_path
           << "\n";
  return absl::OkStatus();
}

absl::Status Fetch(const Context& ctx, const Args& args,
                   const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto out_path, args.Required("out"));
  const bool by_lease = args.Has("lease");
  if (by_lease == args.Has("pages")) {
    return absl::InvalidArgumentError(
        "--lease/--pages: give exactly one of them");
  }
  std::vector<uint64_t> handles;
  client::FetchSource source;
  if (by_lease) {
    KVH_ASSIGN_OR_RETURN(auto lease, args.RequiredUint("lease"));
    KVH_ASSIGN_OR_RETURN(auto start, args.Uint("start", 0, UINT32_MAX));
    KVH_ASSIGN_OR_RETURN(auto count, args.Uint("count", 0, UINT32_MAX));
    source = client::FetchSource::FromLease(lease, static_cast<uint32_t>(start),
                                            static_cast<uint32_t>(count));
  } else {
    if (args.Has("start") || args.Has("count")) {
      return absl::InvalidArgumentError("--start/--count: only with --lease");
    }
    KVH_ASSIGN_OR_RETURN(auto parsed,
                         ParseHandles(*args.Get("pages"), "--pages"));
    handles = std::move(parsed);
    source = client::FetchSource::FromPages(handles);
  }
  KVH_RETURN_IF_ERROR(LayersFrom(args, &source));
  if (args.Has("transform")) {
    return FetchTransformed(ctx, args, pos[0], source, out_path);
  }
  const std::string format_name = args.Get("format").value_or("raw");
  client::FetchFormat format = client::FetchFormat::kRaw;
  if (format_name == "compressed") {
    format = client::FetchFormat::kCompressed;
  } else if (format_name != "raw") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: unknown value '", format_name,
                     "' (want raw or compressed)"));
  }
  const uint64_t shm_before = ctx.client->host_fetch_stats().shm_fetches;
  KVH_ASSIGN_OR_RETURN(auto pages,
                       ctx.client->Fetch(pos[0], source, format, ctx.call));
  absl::Status s = WriteFile(out_path, "--out", pages);
  if (!s.ok()) return s;
  const uint64_t page_bytes = pages.empty() ? 0 : pages[0].size();
  // Same-host Fetch copies from the daemon's shared memory and always
  // verifies (docs/operations.md "Same-host Fetch").
  const bool shm = ctx.client->host_fetch_stats().shm_fetches > shm_before;
  *ctx.out << "fetched " << pages.size() << " pages ("
           << BytesWithHuman(page_bytes * pages.size()) << ", checksums "
           << (shm || ctx.client->options().verify_checksums ? "verified"
                                                             : "not checked")
           << ", " << format_name
           << (shm ? " through shared memory" : " over the wire") << ") to "
           << out_path << "\n";
  return absl::OkStatus();
}

absl::Status Demote(const Context& ctx, const Args& args,
                    const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto name, args.Required("tier"));
  KVH_ASSIGN_OR_RETURN(client::Tier tier, ParseTier(name));
  KVH_ASSIGN_OR_RETURN(auto moved, ctx.client->Demote(pos[0], tier, ctx.call));
  *ctx.out << "moved " << moved << " pages down to " << name << "\n";
  return absl::OkStatus();
}

// ---- calibrations ----

absl::Status CalibrationList(const Context& ctx, const Args& args,
                             const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto list,
                       ctx.client->ListCalibrations(pos[0], ctx.call));
  for (const client::CalibrationInfo& c : list) {
    *ctx.out << absl::StrFormat(
        "0x%016x %-8s %-8s %s pages=%u%s%s\n", c.fingerprint, c.codec, c.source,
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                         absl::FromUnixMillis(c.created_unix_ms),
                         absl::UTCTimeZone()),
        c.pages, c.active ? " active" : "", c.pinned ? " pinned" : "");
  }
  if (list.empty()) *ctx.out << "(no calibrations)\n";
  return absl::OkStatus();
}

absl::Status CalibrationGet(const Context& ctx, const Args& args,
                            const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto out_path, args.Required("out"));
  KVH_ASSIGN_OR_RETURN(uint64_t fp, FingerprintFrom(args));
  KVH_ASSIGN_OR_RETURN(auto cal,
                       ctx.client->GetCalibration(pos[0], fp, ctx.call));
  const std::vector<std::vector<uint8_t>> bytes = {
      std::vector<uint8_t>(cal.bytes.begin(), cal.bytes.end())};
  absl::Status s = WriteFile(out_path, "--out", bytes);
  if (!s.ok()) return s;
  *ctx.out << "wrote " << cal.codec << " calibration "
           << absl::StrFormat("0x%016x", cal.fingerprint) << " ("
           << BytesWithHuman(cal.bytes.size()) << ") to " << out_path << "\n";
  return absl::OkStatus();
}

absl::Status CalibrationUpload(const Context& ctx, const Args& args,
                               const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto path, args.Required("file"));
  KVH_ASSIGN_OR_RETURN(auto bytes, ReadFile(path, "--file"));
  KVH_ASSIGN_OR_RETURN(auto pin, args.Bool("pin"));
  KVH_ASSIGN_OR_RETURN(auto fp, ctx.client->UploadCalibration(
                                    pos[0], std::move(bytes), pin, ctx.call));
  *ctx.out << "calibration " << absl::StrFormat("0x%016x", fp)
           << " is now active" << (pin ? " (pinned)" : "") << "\n";
  return absl::OkStatus();
}

absl::Status CalibrationPin(const Context& ctx, const Args& args,
                            const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(uint64_t fp, FingerprintFrom(args));
  KVH_ASSIGN_OR_RETURN(auto unpin, args.Bool("unpin"));
  absl::Status s = ctx.client->PinCalibration(pos[0], fp, !unpin, ctx.call);
  if (!s.ok()) return s;
  *ctx.out << (unpin ? "unpinned" : "pinned") << " the active calibration of "
           << pos[0] << "\n";
  return absl::OkStatus();
}

// ---- leases, eviction, introspection ----

absl::Status Release(const Context& ctx, const Args& args,
                     const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto id, ParseUint(pos[0], "LEASE"));
  absl::Status s = ctx.client->Release(id, ctx.call);
  if (!s.ok()) return s;
  *ctx.out << "released lease " << id << "\n";
  return absl::OkStatus();
}

// Same-host zero copy: where a lease's pages lie in the daemon's device
// arena (the offsets a CUDA client copies from after mapping the handle).
absl::Status DeviceHandles(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto id, ParseUint(pos[1], "LEASE"));
  KVH_ASSIGN_OR_RETURN(auto h,
                       ctx.client->GetDeviceHandles(pos[0], id, ctx.call));
  *ctx.out << "lease " << id << ": " << h.pages.size()
           << " pages in the device arena of GPU " << h.device << " (uuid "
           << absl::BytesToHexString(h.device_uuid) << ", "
           << HumanBytes(h.arena_bytes) << "), lease expires "
           << FormatExpiry(h.lease_expiry) << "\n"
           << "ipc_handle " << absl::BytesToHexString(h.ipc_handle) << "\n";
  for (size_t i = 0; i < h.pages.size(); ++i) {
    *ctx.out << absl::StrFormat("%u page=%016x offset=%u bytes=%u\n", i,
                                h.pages[i].handle, h.pages[i].offset,
                                h.pages[i].bytes);
  }
  return absl::OkStatus();
}

absl::Status Extend(const Context& ctx, const Args& args,
                    const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto id, ParseUint(pos[0], "LEASE"));
  KVH_ASSIGN_OR_RETURN(auto ttl_ms, args.Uint("ttl_ms", 0, UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(
      auto expiry,
      ctx.client->ExtendLease(id, absl::Milliseconds(ttl_ms), ctx.call));
  *ctx.out << "lease " << id << " expires " << FormatExpiry(expiry) << "\n";
  return absl::OkStatus();
}

absl::Status Evict(const Context& ctx, const Args& args,
                   const std::vector<std::string>& pos) {
  const int targets =
      int{args.Has("bytes")} + int{args.Has("pages")} + int{args.Has("all")};
  if (targets != 1) {
    return absl::InvalidArgumentError(
        "--bytes/--pages/--all: give exactly one of them");
  }
  absl::StatusOr<client::EvictResult> r;
  if (args.Has("bytes")) {
    KVH_ASSIGN_OR_RETURN(auto bytes, args.RequiredUint("bytes"));
    r = ctx.client->EvictBytes(pos[0], bytes, ctx.call);
  } else if (args.Has("pages")) {
    KVH_ASSIGN_OR_RETURN(auto handles,
                         ParseHandles(*args.Get("pages"), "--pages"));
    r = ctx.client->EvictPages(pos[0], handles, ctx.call);
  } else {
    KVH_ASSIGN_OR_RETURN(auto all, args.Bool("all"));
    if (!all) return absl::InvalidArgumentError("--all: false evicts nothing");
    r = ctx.client->EvictAll(pos[0], ctx.call);
  }
  if (!r.ok()) return r.status();
  *ctx.out << "evicted " << r->pages_evicted << " pages ("
           << BytesWithHuman(r->bytes_freed) << ")\n";
  return absl::OkStatus();
}

absl::Status Stats(const Context& ctx, const Args& args,
                   const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto stats,
                       ctx.client->Stats(pos.empty() ? "" : pos[0], ctx.call));
  const client::GlobalStats& g = stats.global;
  KeyValues kv;
  kv.Add("uptime", absl::FormatDuration(absl::Seconds(g.uptime_seconds)));
  kv.Add("namespaces", Str(g.namespaces));
  kv.Add("pool_budget", HumanBytes(g.pool_budget_bytes));
  kv.Add("pool_reserved", HumanBytes(g.pool_reserved_bytes));
  kv.Add("memory_used", HumanBytes(g.memory_used_bytes));
  kv.Add("cached_pages", Str(g.cached_pages));
  kv.Add("active_leases", Str(g.active_leases));
  kv.Add("hit_tokens", Str(g.hit_tokens));
  kv.Add("miss_tokens", Str(g.miss_tokens));
  kv.Add("bytes_in", BytesWithHuman(g.bytes_in));
  kv.Add("bytes_out", BytesWithHuman(g.bytes_out));
  kv.Print(*ctx.out);
  *ctx.out << "\n";
  Table t({"NAMESPACE", "PAGE_BYTES", "CAPACITY", "FREE", "CACHED", "EVICTABLE",
           "PROTECTED", "LEASES", "HIT_TOK", "MISS_TOK", "INSERTED", "DEDUP",
           "EVICTED", "BYTES_IN", "BYTES_OUT"});
  for (const NamespaceStats& s : stats.namespaces) {
    t.AddRow({s.name, Str(s.page_bytes), Str(s.capacity_pages),
              Str(s.free_pages), Str(s.cached_pages), Str(s.evictable_pages),
              Str(s.protected_pages), Str(s.active_leases), Str(s.hit_tokens),
              Str(s.miss_tokens), Str(s.inserted_pages), Str(s.dedup_pages),
              Str(s.evicted_pages), HumanBytes(s.bytes_in),
              HumanBytes(s.bytes_out)});
  }
  t.Print(*ctx.out);
  for (const NamespaceStats& s : stats.namespaces) {
    for (const client::TierStats& tier : s.tiers) {
      *ctx.out << s.name << " tier " << client::TierName(tier.tier) << ": "
               << TierSummary(tier, s.page_bytes) << "\n";
    }
    *ctx.out << s.name << " demoted " << s.demoted_pages << ", promoted "
             << s.promoted_pages << ", disk_write_errors "
             << s.disk_write_errors << ", corrupt_dropped " << s.corrupt_dropped
             << "\n";
    for (const client::CodecStats& c : s.codecs) {
      *ctx.out << s.name << " codec " << c.codec << ": "
               << CodecSummary(c, s.page_bytes) << "\n";
    }
    if (s.calibration.expected.expected_ratio > 0) {
      *ctx.out << s.name << " calibration " << s.calibration.codec
               << " expected " << CalibrationExpected(s) << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Tree(const Context& ctx, const Args& args,
                  const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(auto max_nodes, args.Uint("max_nodes", 0, UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(
      auto dump,
      ctx.client->DumpTree(pos[0], static_cast<uint32_t>(max_nodes), ctx.call));
  *ctx.out << dump.text;
  if (!dump.text.empty() && dump.text.back() != '\n') *ctx.out << "\n";
  *ctx.out << "(" << dump.nodes << " nodes)\n";
  return absl::OkStatus();
}

// The subcommands by area, in the order the help lists them.
std::vector<Command> NamespaceCommands() {
  return std::vector<Command>{
      {{"ns", "create"},
       "NAME --layers N --kv_heads N --head_dim N --page_size N --dtype "
       "bf16|fp16|fp32|fp8_e4m3 [--layout L] [--capacity_bytes N] "
       "[--codec identity|kvtc|int8_c8|commvq] [--calibration PATH] "
       "[--host_compressed_bytes N] [--disk_dir DIR] [--disk_bytes N] "
       "[--kvcm_path PATH] [--rope_theta F] [--if_not_exists] "
       "[--online_calibration [--online_min_tokens N] "
       "[--online_max_sample_tokens N] [--online_target_ratio R]] "
       "[--key_kind tokens|page_keys|page_hashes]",
       "create a namespace (paths are on the daemon's machine; --key_kind "
       "page_keys: keyed by one opaque key per page instead of token ids; "
       "page_hashes: each page found by its own chained-hash key alone)",
       {"layers",
        "kv_heads",
        "head_dim",
        "page_size",
        "dtype",
        "layout",
        "capacity_bytes",
        "codec",
        "calibration",
        "host_compressed_bytes",
        "disk_dir",
        "disk_bytes",
        "kvcm_path",
        "rope_theta",
        "if_not_exists",
        "online_calibration",
        "online_min_tokens",
        "online_max_sample_tokens",
        "online_target_ratio",
        "key_kind"},
       1,
       1,
       NsCreate},
      {{"ns", "list"}, "", "list namespaces", {}, 0, 0, NsList},
      {{"ns", "describe"},
       "NAME",
       "spec and counters of a namespace",
       {},
       1,
       1,
       NsDescribe},
      {{"ns", "delete"},
       "NAME [--force]",
       "delete a namespace (--force: even with leases or uploads)",
       {"force"},
       1,
       1,
       NsDelete},
  };
}

std::vector<Command> PageCommands() {
  return std::vector<Command>{
      {{"match"},
       "NAME (--tokens 1,2,3 | --tokens_file F | --keys HEX,HEX | --keys_file "
       "F) [--lock [--ttl_ms N]]",
       "longest cached prefix, optionally leased (--keys: a page-key "
       "namespace, one hex key per page)",
       {"tokens", "tokens_file", "keys", "keys_file", "lock", "ttl_ms"},
       1,
       1,
       MatchCommand},
      {{"insert"},
       "NAME (--tokens ... | --tokens_file F | --keys ... | --keys_file F) "
       "--file PAGES.bin [--skip_pages N]",
       "store the pages of a sequence (file: pages back to back; with "
       "--skip_pages, an append: the first N pages are cached and not sent, "
       "and the file holds every page or only the new ones)",
       {"tokens", "tokens_file", "keys", "keys_file", "file", "skip_pages"},
       1,
       1,
       InsertCommand},
      {{"fetch"},
       "NAME (--lease ID [--start N] [--count N] | --pages H1,H2) --out FILE "
       "[--format raw|compressed] [--transform kvcm] [--layers B:E]",
       "write raw pages back to back to FILE (checksums verified; "
       "compressed: codec buffers on the wire, decoded here; transform kvcm: "
       "LOSSY, one shorter KV sequence merged by the namespace's KVCM "
       "compressor instead of the pages)",
       {"lease", "start", "count", "pages", "out", "format", "transform",
        "layers"},
       1,
       1,
       Fetch},
      {{"demote"},
       "NAME --tier host_compressed|disk",
       "move unlocked pages down to a colder tier",
       {"tier"},
       1,
       1,
       Demote},
  };
}

std::vector<Command> CalibrationAndLeaseCommands() {
  return std::vector<Command>{
      {{"calibration", "list"},
       "NAME",
       "calibrations a namespace keeps (active, uploaded, online, and those "
       "stored pages still use)",
       {},
       1,
       1,
       CalibrationList},
      {{"calibration", "get"},
       "NAME --out FILE [--fingerprint F]",
       "write a calibration's bytes (default: the active one) to FILE",
       {"out", "fingerprint"},
       1,
       1,
       CalibrationGet},
      {{"calibration", "upload"},
       "NAME --file FILE [--pin]",
       "make FILE (canonical calibration bytes) the active calibration",
       {"file", "pin"},
       1,
       1,
       CalibrationUpload},
      {{"calibration", "pin"},
       "NAME [--fingerprint F] [--unpin]",
       "pin (or unpin) the active calibration against online recalibration",
       {"fingerprint", "unpin"},
       1,
       1,
       CalibrationPin},
      {{"release"}, "LEASE", "release a lease", {}, 1, 1, Release},
      {{"device-handles"},
       "NAME LEASE",
       "CUDA IPC handle of the device arena and the lease's page offsets "
       "(same-host zero copy; needs store.allow_ipc)",
       {},
       2,
       2,
       DeviceHandles},
      {{"extend"},
       "LEASE [--ttl_ms N]",
       "extend a lease",
       {"ttl_ms"},
       1,
       1,
       Extend},
      {{"evict"},
       "NAME (--bytes N | --pages H1,H2 | --all)",
       "evict unlocked pages",
       {"bytes", "pages", "all"},
       1,
       1,
       Evict},
  };
}

std::vector<Command> InspectionCommands() {
  return std::vector<Command>{
      {{"stats"}, "[NAME]", "daemon and namespace counters", {}, 0, 1, Stats},
      {{"cluster", "status"},
       "(--etcd URL[,URL] [--etcd_prefix P] | --members H:P[,H:P] | --dns "
       "NAME:PORT)",
       "members of a kvharbor cluster with their pages, bytes and load",
       {"etcd", "etcd_prefix", "members", "dns"},
       0,
       0,
       ClusterStatus},
      {{"samples", "capture"},
       "NAME --tokens_file FILE --out OUT.safetensors [--max_tokens N] "
       "[--dtype bf16|fp16|f32] [--rope_style none|interleaved|half_split] "
       "[--rope_theta X]",
       "KV rows of cached prompts (FILE: one prompt of token ids per line) "
       "to a KV samples file for kvharbor-calibrate",
       {"tokens_file", "out", "max_tokens", "dtype", "rope_style",
        "rope_theta"},
       1,
       1,
       SamplesCapture},
      {{"tree"},
       "NAME [--max_nodes N]",
       "dump a namespace's radix tree",
       {"max_nodes"},
       1,
       1,
       Tree},
  };
}

}  // namespace

const std::vector<Command>& Commands() {
  static const std::vector<Command>* const kCommands = [] {
    auto* all = new std::vector<Command>();
    for (auto group : {NamespaceCommands, PageCommands,
                       CalibrationAndLeaseCommands, InspectionCommands}) {
      for (Command& c : group()) all->push_back(std::move(c));
    }
    return all;
  }();
  return *kCommands;
}

std::vector<FlagSpec> AllFlags() {
  return {
      {"addr", true},
      {"timeout_ms", true},
      {"tls", false},
      {"tls_ca", true},
      {"tls_cert", true},
      {"tls_key", true},
      {"tls_server_name", true},
      {"token", true},
      {"help", false},
      {"no_verify", false},
      {"layers", true},
      {"kv_heads", true},
      {"head_dim", true},
      {"page_size", true},
      {"dtype", true},
      {"layout", true},
      {"capacity_bytes", true},
      {"codec", true},
      {"rope_theta", true},
      {"if_not_exists", false},
      {"force", false},
      {"tokens", true},
      {"tokens_file", true},
      {"keys", true},
      {"keys_file", true},
      {"skip_pages", true},
      {"key_kind", true},
      {"lock", false},
      {"ttl_ms", true},
      {"file", true},
      {"lease", true},
      {"start", true},
      {"count", true},
      {"pages", true},
      {"out", true},
      {"bytes", true},
      {"all", false},
      {"max_nodes", true},
      {"calibration", true},
      {"disk_dir", true},
      {"host_compressed_bytes", true},
      {"disk_bytes", true},
      {"format", true},
      {"tier", true},
      {"transform", true},
      {"kvcm_path", true},
      {"etcd", true},
      {"etcd_prefix", true},
      {"members", true},
      {"dns", true},
      {"online_calibration", false},
      {"online_min_tokens", true},
      {"online_max_sample_tokens", true},
      {"online_target_ratio", true},
      {"fingerprint", true},
      {"pin", false},
      {"unpin", false},
      {"max_tokens", true},
      {"rope_style", true},
  };
}

}  // namespace cli
}  // namespace kvharbor
