#include "server/rpc/convert.h"

#include <initializer_list>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/index/page_key.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "types/stats_fields.h"

namespace kvharbor {

static_assert(std::is_same_v<Token, int32_t>,
              "token ids are passed to the core without a copy");
static_assert(std::is_same_v<PageHandle, uint64_t>,
              "page handles are passed to the core without a copy");

namespace {

// Whether each core enum value of `pairs` has the number of its proto twin:
// the core enums below are converted to and from proto by a cast.
template <typename E, typename P>
constexpr bool SameNumbers(std::initializer_list<std::pair<E, P>> pairs) {
  for (const std::pair<E, P>& p : pairs) {
    if (static_cast<int>(p.first) != static_cast<int>(p.second)) return false;
  }
  return true;
}

static_assert(SameNumbers<KeyKind, v1::KeyKind>(
    {{KeyKind::kTokens, v1::KEY_KIND_TOKENS},
     {KeyKind::kPageKeys, v1::KEY_KIND_PAGE_KEYS},
     {KeyKind::kPageHashes, v1::KEY_KIND_PAGE_HASHES}}));
static_assert(SameNumbers<DType, v1::DType>({{DType::kBF16, v1::DTYPE_BF16},
                                             {DType::kFP16, v1::DTYPE_FP16},
                                             {DType::kFP32, v1::DTYPE_FP32},
                                             {DType::kFP8E4M3,
                                              v1::DTYPE_FP8_E4M3}}));
static_assert(SameNumbers<PageLayout, v1::PageLayout>(
    {{PageLayout::kKvLayerTokenHeadDim,
      v1::PAGE_LAYOUT_KV_LAYER_TOKEN_HEAD_DIM},
     {PageLayout::kLayerKvTokenHeadDim,
      v1::PAGE_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM}}));
static_assert(SameNumbers<RopeStyle, v1::RopeStyle>(
    {{RopeStyle::kNone, v1::ROPE_STYLE_NONE},
     {RopeStyle::kInterleaved, v1::ROPE_STYLE_INTERLEAVED},
     {RopeStyle::kHalfSplit, v1::ROPE_STYLE_HALF_SPLIT}}));
static_assert(kNumTiers == 3 &&
              SameNumbers<Tier, v1::Tier>({{Tier::kRaw, v1::TIER_RAW},
                                           {Tier::kHostCompressed,
                                            v1::TIER_HOST_COMPRESSED},
                                           {Tier::kDisk, v1::TIER_DISK}}));
static_assert(SameNumbers<FetchFormat, v1::FetchFormat>(
    {{FetchFormat::kRaw, v1::FETCH_FORMAT_RAW},
     {FetchFormat::kCompressed, v1::FETCH_FORMAT_COMPRESSED}}));
static_assert(SameNumbers<FetchTransform, v1::FetchTransform>(
    {{FetchTransform::kNone, v1::FETCH_TRANSFORM_NONE},
     {FetchTransform::kKvcm, v1::FETCH_TRANSFORM_KVCM}}));

// `value` as the core enum E numbered like its proto enum (the asserts
// above): INVALID_ARGUMENT naming `field` when the proto does not define it
// (`is_valid`: the generated <Enum>_IsValid), with `hint` after the value.
template <typename E>
absl::StatusOr<E> SameNumberedEnum(int value, bool (*is_valid)(int),
                                   absl::string_view field,
                                   absl::string_view hint = "") {
  if (!is_valid(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown value ", value, hint));
  }
  return static_cast<E>(value);
}

}  // namespace

absl::StatusOr<DType> DTypeFromProto(int value, absl::string_view field) {
  switch (value) {
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP16:
      return DType::kFP16;
    case v1::DTYPE_FP32:
      return DType::kFP32;
    case v1::DTYPE_FP8_E4M3:
      return DType::kFP8E4M3;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": DTYPE_UNSPECIFIED is not allowed; set the element type"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown value ", value));
  }
}

v1::DType DTypeToProto(DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype));
}

absl::StatusOr<PageLayout> PageLayoutFromProto(int value,
                                               absl::string_view field) {
  switch (value) {
    case v1::PAGE_LAYOUT_UNSPECIFIED:
    case v1::PAGE_LAYOUT_KV_LAYER_TOKEN_HEAD_DIM:
      return PageLayout::kKvLayerTokenHeadDim;
    case v1::PAGE_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM:
      return PageLayout::kLayerKvTokenHeadDim;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown value ", value));
  }
}

v1::PageLayout PageLayoutToProto(PageLayout layout) {
  return static_cast<v1::PageLayout>(static_cast<int>(layout));
}

absl::StatusOr<Geometry> GeometryFromProto(const v1::Geometry& proto,
                                           absl::string_view field) {
  Geometry g;
  g.num_layers = proto.num_layers();
  g.num_kv_heads = proto.num_kv_heads();
  g.head_dim = proto.head_dim();
  g.page_size = proto.page_size();
  KVH_ASSIGN_OR_RETURN(
      g.dtype, DTypeFromProto(proto.dtype(), absl::StrCat(field, ".dtype")));
  KVH_ASSIGN_OR_RETURN(
      g.layout,
      PageLayoutFromProto(proto.layout(), absl::StrCat(field, ".layout")));
  g.rope_theta = proto.rope_theta();
  KVH_RETURN_IF_ERROR(g.Validate(field));
  return g;
}

void GeometryToProto(const Geometry& geometry, v1::Geometry* proto) {
  proto->set_num_layers(geometry.num_layers);
  proto->set_num_kv_heads(geometry.num_kv_heads);
  proto->set_head_dim(geometry.head_dim);
  proto->set_page_size(geometry.page_size);
  proto->set_dtype(DTypeToProto(geometry.dtype));
  proto->set_layout(PageLayoutToProto(geometry.layout));
  proto->set_rope_theta(geometry.rope_theta);
}

absl::StatusOr<NamespaceSpec> NamespaceSpecFromProto(
    const v1::NamespaceSpec& proto, absl::string_view field) {
  NamespaceSpec spec;
  KVH_RETURN_IF_ERROR(
      ValidateNamespaceName(proto.name(), absl::StrCat(field, ".name")));
  spec.name = proto.name();
  if (!proto.has_geometry()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".geometry: required"));
  }
  KVH_ASSIGN_OR_RETURN(
      spec.geometry,
      GeometryFromProto(proto.geometry(), absl::StrCat(field, ".geometry")));
  spec.capacity_bytes = proto.capacity_bytes();
  spec.codec = proto.codec();
  spec.calibration_path = proto.calibration_path();
  spec.calibration = proto.calibration();
  spec.host_compressed_bytes = proto.host_compressed_bytes();
  spec.disk_dir = proto.disk_dir();
  spec.disk_bytes = proto.disk_bytes();
  spec.kvcm_path = proto.kvcm_path();
  KVH_ASSIGN_OR_RETURN(
      spec.key_kind,
      KeyKindFromProto(proto.key_kind(), absl::StrCat(field, ".key_kind")));
  if (proto.has_topology()) {
    const v1::Topology& t = proto.topology();
    spec.topology.model = t.model();
    spec.topology.total_layers = t.total_layers();
    spec.topology.layer_begin = t.layer_begin();
    spec.topology.layer_end = t.layer_end();
    spec.topology.total_kv_heads = t.total_kv_heads();
    spec.topology.kv_head_begin = t.kv_head_begin();
    spec.topology.kv_head_end = t.kv_head_end();
  }
  if (proto.has_online_calibration()) {
    KVH_ASSIGN_OR_RETURN(
        spec.online_calibration,
        OnlineCalibrationFromProto(proto.online_calibration(),
                                   absl::StrCat(field, ".online_calibration")));
  }
  return spec;
}

absl::StatusOr<OnlineCalibrationOptions> OnlineCalibrationFromProto(
    const v1::OnlineCalibration& proto, absl::string_view field) {
  OnlineCalibrationOptions o;
  o.enabled = proto.enabled();
  if (proto.min_tokens() != 0) o.min_tokens = proto.min_tokens();
  if (proto.max_sample_tokens() != 0) {
    o.max_sample_tokens = proto.max_sample_tokens();
  }
  if (proto.target_ratio() != 0) o.target_ratio = proto.target_ratio();
  switch (proto.row_kind()) {
    case v1::KVTC_ROW_KIND_PER_TOKEN:
      o.row_kind = KvtcRowKind::kPerToken;
      break;
    case v1::KVTC_ROW_KIND_PER_PAGE:
      o.row_kind = KvtcRowKind::kPerPage;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".row_kind: unknown value ", proto.row_kind()));
  }
  if (proto.has_sink_tokens()) o.sink_tokens = proto.sink_tokens();
  KVH_ASSIGN_OR_RETURN(
      o.rope_style,
      SameNumberedEnum<RopeStyle>(proto.rope_style(), v1::RopeStyle_IsValid,
                                  absl::StrCat(field, ".rope_style")));
  return o;
}

void CalibrationInfoToProto(const CalibrationInfo& info,
                            v1::CalibrationInfo* proto) {
  proto->set_codec(info.codec);
  proto->set_fingerprint(info.fingerprint);
  proto->set_source(
      static_cast<v1::CalibrationSource>(static_cast<int>(info.source)));
  proto->set_created_unix_ms(UnixMillisToProto(info.created));
  proto->set_active(info.active);
  proto->set_pinned(info.pinned);
  proto->set_pages(info.pages);
}

void NamespaceConfigToProto(const NamespaceConfig& config,
                            v1::NamespaceSpec* proto) {
  proto->set_name(config.name);
  GeometryToProto(config.geometry, proto->mutable_geometry());
  proto->set_capacity_bytes(config.capacity_bytes);
  proto->set_codec(config.codec);
  proto->set_host_compressed_bytes(config.host_compressed_bytes);
  proto->set_disk_dir(config.disk_dir);
  proto->set_disk_bytes(config.disk_bytes);
  proto->set_calibration_fingerprint(config.calibration_fingerprint);
  proto->set_kvcm_path(config.kvcm_path);
  proto->set_key_kind(static_cast<v1::KeyKind>(config.key_kind));
  v1::Topology* t = proto->mutable_topology();
  t->set_model(config.topology.model);
  t->set_total_layers(config.topology.total_layers);
  t->set_layer_begin(config.topology.layer_begin);
  t->set_layer_end(config.topology.layer_end);
  t->set_total_kv_heads(config.topology.total_kv_heads);
  t->set_kv_head_begin(config.topology.kv_head_begin);
  t->set_kv_head_end(config.topology.kv_head_end);
  const OnlineCalibrationOptions& o = config.online;
  if (o.enabled) {
    v1::OnlineCalibration* p = proto->mutable_online_calibration();
    p->set_enabled(true);
    p->set_min_tokens(o.min_tokens);
    p->set_max_sample_tokens(o.max_sample_tokens);
    p->set_target_ratio(o.target_ratio);
    p->set_row_kind(o.row_kind == KvtcRowKind::kPerPage
                        ? v1::KVTC_ROW_KIND_PER_PAGE
                        : v1::KVTC_ROW_KIND_PER_TOKEN);
    p->set_sink_tokens(o.sink_tokens);
    p->set_rope_style(
        static_cast<v1::RopeStyle>(static_cast<int>(o.rope_style)));
  }
}

namespace {

// Sets each counter of `table` in `proto` by name (types/stats_fields.h;
// tests/server/convert_test.cc checks the names against the descriptor).
template <typename Stats, size_t N>
void CountersToProto(const CounterField<Stats> (&table)[N], const Stats& c,
                     google::protobuf::Message* proto) {
  const google::protobuf::Descriptor* d = proto->GetDescriptor();
  const google::protobuf::Reflection* r = proto->GetReflection();
  for (const CounterField<Stats>& f : table) {
    r->SetUInt64(proto, d->FindFieldByName(std::string(f.name)), c.*(f.member));
  }
}

}  // namespace

void NamespaceStatsToProto(const NamespaceStats& c, v1::NamespaceStats* proto) {
  proto->set_name(c.name);
  CountersToProto(kNamespaceCounters, c, proto);
  for (const TierStats& t : c.tiers) {
    v1::TierStats* ts = proto->add_tiers();
    ts->set_tier(TierToProto(t.tier));
    ts->set_pages(t.pages);
    ts->set_bytes(t.bytes);
  }
  v1::CalibrationStats* cal = proto->mutable_calibration();
  cal->set_state(
      static_cast<v1::CalibrationState>(static_cast<int>(c.calibration.state)));
  cal->set_tokens_seen(c.calibration.tokens_seen);
  cal->set_tokens_sampled(c.calibration.tokens_sampled);
  cal->set_codec(c.calibration.codec);
  cal->set_fingerprint(c.calibration.fingerprint);
  cal->set_pinned(c.calibration.pinned);
  cal->set_target_ratio(c.calibration.expected.target_ratio);
  cal->set_expected_ratio(c.calibration.expected.expected_ratio);
  cal->set_expected_keys_rel_error(c.calibration.expected.keys_rel_error);
  cal->set_expected_values_rel_error(c.calibration.expected.values_rel_error);
  for (const CodecStats& s : c.codecs) {
    v1::CodecStats* cs = proto->add_codecs();
    cs->set_codec(s.codec);
    cs->set_pages(s.pages);
    cs->set_bytes(s.bytes);
  }
}

void GlobalStatsToProto(const GlobalStats& c, v1::GlobalStats* proto) {
  CountersToProto(kGlobalCounters, c, proto);
  proto->set_uptime_seconds(c.uptime_seconds);
}

void NamespaceInfoToProto(const Namespace& ns, v1::NamespaceInfo* proto) {
  NamespaceConfigToProto(ns.config(), proto->mutable_spec());
  // The fingerprint evictions use now (it changes with the calibration).
  const NamespaceStats stats = ns.Counters();
  proto->mutable_spec()->set_calibration_fingerprint(
      stats.calibration.fingerprint);
  NamespaceStatsToProto(stats, proto->mutable_stats());
}

v1::Tier TierToProto(Tier tier) {
  return static_cast<v1::Tier>(static_cast<int>(tier));
}

absl::StatusOr<Tier> TierFromProto(int value, absl::string_view field) {
  return SameNumberedEnum<Tier>(value, v1::Tier_IsValid, field);
}

absl::StatusOr<FetchFormat> FetchFormatFromProto(int value,
                                                 absl::string_view field) {
  return SameNumberedEnum<FetchFormat>(value, v1::FetchFormat_IsValid, field);
}

absl::StatusOr<FetchTransform> FetchTransformFromProto(
    int value, absl::string_view field) {
  return SameNumberedEnum<FetchTransform>(value, v1::FetchTransform_IsValid,
                                          field);
}

absl::StatusOr<KeyKind> KeyKindFromProto(int value, absl::string_view field) {
  return SameNumberedEnum<KeyKind>(
      value, v1::KeyKind_IsValid, field,
      " (KEY_KIND_TOKENS = 0, KEY_KIND_PAGE_KEYS = 1 or "
      "KEY_KIND_PAGE_HASHES = 2)");
}

absl::StatusOr<Elements> SequenceFromProto(
    const Namespace& ns, const google::protobuf::RepeatedField<int32_t>& ids,
    const google::protobuf::RepeatedPtrField<std::string>& keys,
    absl::string_view prefix) {
  Elements out;
  if (ns.key_kind() == KeyKind::kTokens) {
    if (!keys.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "page_keys: namespace '", ns.name(),
          "' is keyed by token ids (KEY_KIND_TOKENS): send token_ids"));
    }
    out.elements = TokensFromProto(ids);
    return out;
  }
  if (!ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "token_ids: namespace '", ns.name(),
                     "' is keyed by ", KeyKindName(ns.key_kind()), " (",
                     v1::KeyKind_Name(static_cast<v1::KeyKind>(ns.key_kind())),
                     "): send page_keys"));
  }
  KVH_RETURN_IF_ERROR(
      EncodePageKeys(keys, absl::StrCat(prefix, "page_keys"), &out.storage));
  out.elements = out.storage;
  return out;
}

absl::Span<const Token> TokensFromProto(
    const google::protobuf::RepeatedField<int32_t>& ids) {
  return absl::MakeConstSpan(ids.data(), static_cast<size_t>(ids.size()));
}

absl::Span<const PageHandle> HandlesFromProto(
    const google::protobuf::RepeatedField<uint64_t>& handles) {
  return absl::MakeConstSpan(handles.data(),
                             static_cast<size_t>(handles.size()));
}

absl::Span<const uint64_t> ChecksumsFromProto(
    const google::protobuf::RepeatedField<uint64_t>& checksums) {
  return absl::MakeConstSpan(checksums.data(),
                             static_cast<size_t>(checksums.size()));
}

absl::Duration TtlFromProto(uint32_t ttl_ms) {
  return absl::Milliseconds(ttl_ms);
}

int64_t UnixMillisToProto(absl::Time t) {
  if (t == absl::InfinitePast()) return 0;
  return absl::ToUnixMillis(t);
}

}  // namespace kvharbor
