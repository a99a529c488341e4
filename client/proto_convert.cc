#include "client/proto_convert.h"

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "types/stats_fields.h"

namespace kvharbor {
namespace client {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // Both enums use the canonical codes 1..16; anything else is UNKNOWN.
  const int code = static_cast<int>(status.error_code());
  const absl::StatusCode absl_code =
      (code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated))
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

void ToProto(const Geometry& g, v1::Geometry* out) {
  out->set_num_layers(g.num_layers);
  out->set_num_kv_heads(g.num_kv_heads);
  out->set_head_dim(g.head_dim);
  out->set_page_size(g.page_size);
  out->set_dtype(static_cast<v1::DType>(g.dtype));
  out->set_layout(static_cast<v1::PageLayout>(g.layout));
  out->set_rope_theta(g.rope_theta);
}

void ToProto(const NamespaceSpec& spec, v1::NamespaceSpec* out) {
  out->set_name(spec.name);
  ToProto(spec.geometry, out->mutable_geometry());
  out->set_capacity_bytes(spec.capacity_bytes);
  out->set_codec(spec.codec);
  out->set_calibration_path(spec.calibration_path);
  out->set_calibration(spec.calibration);
  out->set_host_compressed_bytes(spec.host_compressed_bytes);
  out->set_disk_dir(spec.disk_dir);
  out->set_disk_bytes(spec.disk_bytes);
  out->set_kvcm_path(spec.kvcm_path);
  out->set_key_kind(static_cast<v1::KeyKind>(spec.key_kind));
  if (!(spec.topology == Topology())) {
    v1::Topology* t = out->mutable_topology();
    t->set_model(spec.topology.model);
    t->set_total_layers(spec.topology.total_layers);
    t->set_layer_begin(spec.topology.layer_begin);
    t->set_layer_end(spec.topology.layer_end);
    t->set_total_kv_heads(spec.topology.total_kv_heads);
    t->set_kv_head_begin(spec.topology.kv_head_begin);
    t->set_kv_head_end(spec.topology.kv_head_end);
  }
  if (spec.online_calibration.enabled) {
    ToProto(spec.online_calibration, out->mutable_online_calibration());
  }
}

void ToProto(const OnlineCalibration& o, v1::OnlineCalibration* out) {
  out->set_enabled(o.enabled);
  out->set_min_tokens(o.min_tokens);
  out->set_max_sample_tokens(o.max_sample_tokens);
  out->set_target_ratio(o.target_ratio);
  out->set_row_kind(o.row_kind == KvtcRowKind::kPerPage
                        ? v1::KVTC_ROW_KIND_PER_PAGE
                        : v1::KVTC_ROW_KIND_PER_TOKEN);
  out->set_sink_tokens(o.sink_tokens);
  out->set_rope_style(static_cast<v1::RopeStyle>(o.rope_style));
}

Geometry FromProto(const v1::Geometry& g) {
  Geometry r;
  r.num_layers = g.num_layers();
  r.num_kv_heads = g.num_kv_heads();
  r.head_dim = g.head_dim();
  r.page_size = g.page_size();
  r.dtype = static_cast<DType>(g.dtype());
  r.layout = static_cast<PageLayout>(g.layout());
  r.rope_theta = g.rope_theta();
  return r;
}

NamespaceSpec FromProto(const v1::NamespaceSpec& spec) {
  NamespaceSpec r;
  r.name = spec.name();
  r.geometry = FromProto(spec.geometry());
  r.capacity_bytes = spec.capacity_bytes();
  r.codec = spec.codec();
  r.calibration_path = spec.calibration_path();
  r.host_compressed_bytes = spec.host_compressed_bytes();
  r.disk_dir = spec.disk_dir();
  r.disk_bytes = spec.disk_bytes();
  r.calibration_fingerprint = spec.calibration_fingerprint();
  r.kvcm_path = spec.kvcm_path();
  r.key_kind = static_cast<KeyKind>(spec.key_kind());
  const v1::Topology& t = spec.topology();
  r.topology.model = t.model();
  r.topology.total_layers = t.total_layers();
  r.topology.layer_begin = t.layer_begin();
  r.topology.layer_end = t.layer_end();
  r.topology.total_kv_heads = t.total_kv_heads();
  r.topology.kv_head_begin = t.kv_head_begin();
  r.topology.kv_head_end = t.kv_head_end();
  if (spec.has_online_calibration()) {
    r.online_calibration = FromProto(spec.online_calibration());
  }
  return r;
}

namespace {

// Reads each counter of `table` from `proto` by name (types/stats_fields.h;
// the server's conversion uses the same table, checked in
// tests/server/convert_test.cc).
template <typename Stats, size_t N>
void CountersFromProto(const CounterField<Stats> (&table)[N],
                       const google::protobuf::Message& proto, Stats* out) {
  const google::protobuf::Descriptor* d = proto.GetDescriptor();
  const google::protobuf::Reflection* r = proto.GetReflection();
  for (const CounterField<Stats>& f : table) {
    out->*(f.member) =
        r->GetUInt64(proto, d->FindFieldByName(std::string(f.name)));
  }
}

}  // namespace

OnlineCalibration FromProto(const v1::OnlineCalibration& o) {
  OnlineCalibration r;
  r.enabled = o.enabled();
  r.min_tokens = o.min_tokens();
  r.max_sample_tokens = o.max_sample_tokens();
  r.target_ratio = o.target_ratio();
  r.row_kind = o.row_kind() == v1::KVTC_ROW_KIND_PER_PAGE
                   ? KvtcRowKind::kPerPage
                   : KvtcRowKind::kPerToken;
  if (o.has_sink_tokens()) r.sink_tokens = o.sink_tokens();
  r.rope_style = static_cast<RopeStyle>(o.rope_style());
  return r;
}

NamespaceStats FromProto(const v1::NamespaceStats& s) {
  NamespaceStats r;
  r.name = s.name();
  CountersFromProto(kNamespaceCounters, s, &r);
  for (const v1::TierStats& t : s.tiers()) {
    r.tiers.push_back(
        TierStats{static_cast<Tier>(t.tier()), t.pages(), t.bytes()});
  }
  const v1::CalibrationStats& cal = s.calibration();
  r.calibration.state =
      static_cast<CalibrationState>(static_cast<int>(cal.state()));
  r.calibration.tokens_seen = cal.tokens_seen();
  r.calibration.tokens_sampled = cal.tokens_sampled();
  r.calibration.codec = cal.codec();
  r.calibration.fingerprint = cal.fingerprint();
  r.calibration.pinned = cal.pinned();
  r.calibration.expected.target_ratio = cal.target_ratio();
  r.calibration.expected.expected_ratio = cal.expected_ratio();
  r.calibration.expected.keys_rel_error = cal.expected_keys_rel_error();
  r.calibration.expected.values_rel_error = cal.expected_values_rel_error();
  for (const v1::CodecStats& c : s.codecs()) {
    r.codecs.push_back(CodecStats{c.codec(), c.pages(), c.bytes()});
  }
  return r;
}

NamespaceInfo FromProto(const v1::NamespaceInfo& info) {
  NamespaceInfo r;
  r.spec = FromProto(info.spec());
  r.stats = FromProto(info.stats());
  r.staging_socket = info.staging_socket();
  r.daemon_id = info.daemon_id();
  return r;
}

GlobalStats FromProto(const v1::GlobalStats& g) {
  GlobalStats r;
  CountersFromProto(kGlobalCounters, g, &r);
  r.uptime_seconds = g.uptime_seconds();
  return r;
}

absl::Time FromUnixMillis(int64_t ms) { return absl::FromUnixMillis(ms); }

void SequenceToProto(const Sequence& sequence,
                     google::protobuf::RepeatedField<int32_t>* token_ids,
                     google::protobuf::RepeatedPtrField<std::string>* keys) {
  if (!sequence.page_keys()) {
    token_ids->Add(sequence.tokens().begin(), sequence.tokens().end());
    return;
  }
  keys->Reserve(static_cast<int>(sequence.keys().size()));
  for (absl::string_view k : sequence.keys()) keys->Add(std::string(k));
}

void InsertHeaderToProto(absl::string_view ns, const Sequence& sequence,
                         uint32_t skip_pages, uint64_t prefix_lease_id,
                         v1::InsertHeader* out) {
  out->set_namespace_(std::string(ns));
  SequenceToProto(sequence, out->mutable_token_ids(), out->mutable_page_keys());
  out->set_skip_pages(skip_pages);
  out->set_prefix_lease_id(prefix_lease_id);
}

InsertResult FromProto(const v1::InsertResponse& r) {
  InsertResult out;
  out.already_present_tokens = r.already_present_tokens();
  out.pages_stored = r.pages_stored();
  out.pages_evicted = r.pages_evicted();
  return out;
}

TreeDump FromProto(const v1::DumpTreeResponse& r) {
  return TreeDump{r.text(), r.nodes()};
}

Calibration FromProto(const v1::GetCalibrationResponse& r) {
  return Calibration{r.codec(), r.calibration(), r.calibration_fingerprint()};
}

}  // namespace client
}  // namespace kvharbor
