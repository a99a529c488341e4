// ToGrpcStatus and the proto <-> core conversions of server/rpc/convert.h.
#include "server/rpc/convert.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "server/rpc/service.h"
#include "server/rpc/status_map.h"
#include "types/stats_fields.h"

namespace kvharbor {
namespace {

TEST_CASE("ToGrpcStatus keeps every code and the message", "[server][status]") {
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code),
                          "field.x: message " + std::to_string(code));
    const grpc::Status out = ToGrpcStatus(in);
    CHECK(static_cast<int>(out.error_code()) == code);
    CHECK(out.error_message() == in.message());
  }
  // A code absl may add later is UNKNOWN, not something made up.
  const grpc::Status odd =
      ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "m"));
  CHECK(odd.error_code() == grpc::StatusCode::UNKNOWN);
  CHECK(odd.error_message() == "m");
}

TEST_CASE("Enums convert with validation", "[server][convert]") {
  CHECK(*DTypeFromProto(v1::DTYPE_BF16, "f") == DType::kBF16);
  CHECK(*DTypeFromProto(v1::DTYPE_FP16, "f") == DType::kFP16);
  CHECK(*DTypeFromProto(v1::DTYPE_FP32, "f") == DType::kFP32);
  CHECK(*DTypeFromProto(v1::DTYPE_FP8_E4M3, "f") == DType::kFP8E4M3);
  for (int bad : {0, 5, -1, 1000}) {
    absl::StatusOr<DType> d = DTypeFromProto(bad, "spec.geometry.dtype");
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("spec.geometry.dtype: "));
  }
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    CHECK(*DTypeFromProto(DTypeToProto(d), "f") == d);
  }
  CHECK(*PageLayoutFromProto(v1::PAGE_LAYOUT_UNSPECIFIED, "f") ==
        PageLayout::kKvLayerTokenHeadDim);
  CHECK(*PageLayoutFromProto(v1::PAGE_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM, "f") ==
        PageLayout::kLayerKvTokenHeadDim);
  absl::StatusOr<PageLayout> bad = PageLayoutFromProto(3, "g.layout");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Matchers::StartsWith("g.layout: "));
}

TEST_CASE("Geometry and spec round-trip", "[server][convert]") {
  v1::Geometry p;
  p.set_num_layers(32);
  p.set_num_kv_heads(8);
  p.set_head_dim(128);
  p.set_page_size(16);
  p.set_dtype(v1::DTYPE_FP8_E4M3);
  p.set_layout(v1::PAGE_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM);
  p.set_rope_theta(10000.5f);
  absl::StatusOr<Geometry> g = GeometryFromProto(p, "geometry");
  REQUIRE(g.ok());
  CHECK(g->PageBytes() == 2ull * 32 * 8 * 128 * 16);
  v1::Geometry back;
  GeometryToProto(*g, &back);
  CHECK(back.SerializeAsString() == p.SerializeAsString());

  v1::NamespaceSpec spec;
  spec.set_name("m-1.b_2");
  *spec.mutable_geometry() = p;
  spec.set_capacity_bytes(12345);
  spec.set_codec("identity");
  absl::StatusOr<NamespaceSpec> s = NamespaceSpecFromProto(spec, "spec");
  REQUIRE(s.ok());
  CHECK(s->name == "m-1.b_2");
  CHECK(s->geometry == *g);
  CHECK(s->capacity_bytes == 12345);
  CHECK(s->codec == "identity");

  p.set_head_dim(5000);
  absl::StatusOr<Geometry> bad = GeometryFromProto(p, "spec.geometry");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Matchers::StartsWith("spec.geometry.head_dim: "));
}

TEST_CASE("Stats convert field by field", "[server][convert]") {
  NamespaceStats c;
  uint64_t v = 1;
  for (uint64_t* f :
       {&c.capacity_pages, &c.free_pages, &c.cached_pages, &c.evictable_pages,
        &c.protected_pages, &c.hit_tokens, &c.miss_tokens, &c.inserted_pages,
        &c.dedup_pages, &c.evicted_pages, &c.bytes_in, &c.bytes_out,
        &c.active_leases, &c.index_nodes, &c.index_memory_bytes, &c.page_bytes,
        &c.uploads_in_flight}) {
    *f = v++;
  }
  v1::NamespaceStats p;
  c.name = "n";
  NamespaceStatsToProto(c, &p);
  CHECK(p.name() == "n");
  // Fields 2..18 of NamespaceStats hold 1..17 in declaration order.
  const auto* desc = p.GetDescriptor();
  const auto* refl = p.GetReflection();
  for (int number = 2; number <= 18; ++number) {
    INFO("field " << number);
    const auto* field = desc->FindFieldByNumber(number);
    REQUIRE(field != nullptr);
    CHECK(refl->GetUInt64(p, field) == static_cast<uint64_t>(number - 1));
  }
  c.tiers = {{Tier::kRaw, 3, 300}, {Tier::kDisk, 2, 20}};
  c.calibration = {
      CalibrationState::kCalibrating,          64, 32, "fp8", 0x1234, true,
      CalibrationEstimate{16, 16.5, 0.25, 0.5}};
  c.codecs = {{"fp8", 3, 1000}, {"kvtc", 2, 200}};
  c.memory_bytes = 77;
  p.Clear();
  NamespaceStatsToProto(c, &p);
  REQUIRE(p.tiers_size() == 2);
  CHECK(p.tiers(1).tier() == v1::TIER_DISK);
  CHECK(p.tiers(1).pages() == 2);
  CHECK(p.tiers(1).bytes() == 20);
  CHECK(p.calibration().state() == v1::CALIBRATION_STATE_CALIBRATING);
  CHECK(p.calibration().tokens_seen() == 64);
  CHECK(p.calibration().tokens_sampled() == 32);
  CHECK(p.calibration().codec() == "fp8");
  CHECK(p.calibration().fingerprint() == 0x1234);
  CHECK(p.calibration().pinned());
  CHECK(p.calibration().target_ratio() == 16);
  CHECK(p.calibration().expected_ratio() == 16.5);
  CHECK(p.calibration().expected_keys_rel_error() == 0.25);
  CHECK(p.calibration().expected_values_rel_error() == 0.5);
  REQUIRE(p.codecs_size() == 2);
  CHECK(p.codecs(1).codec() == "kvtc");
  CHECK(p.codecs(1).pages() == 2);
  CHECK(p.codecs(1).bytes() == 200);
  CHECK(p.memory_bytes() == 77);

  GlobalStats s{10, 9, 11, 8, 7, 6, 5, 4, 3, 2, 42};
  v1::GlobalStats g;
  GlobalStatsToProto(s, &g);
  CHECK(g.pool_budget_bytes() == 10);
  CHECK(g.pool_reserved_bytes() == 9);
  CHECK(g.memory_used_bytes() == 11);
  CHECK(g.namespaces() == 8);
  CHECK(g.hit_tokens() == 7);
  CHECK(g.miss_tokens() == 6);
  CHECK(g.bytes_in() == 5);
  CHECK(g.bytes_out() == 4);
  CHECK(g.cached_pages() == 3);
  CHECK(g.active_leases() == 2);
  CHECK(g.uptime_seconds() == 42);
}

// Every uint64 field of the stats messages is in its counter table, by the
// same name, and every table name is such a field: the conversions on both
// ends and the C ABI's JSON walk these tables (types/stats_fields.h).
template <typename Stats, size_t N>
void CheckCounterTable(const CounterField<Stats> (&table)[N],
                       const google::protobuf::Descriptor* desc,
                       size_t not_counters) {
  std::set<std::string> names;
  for (const CounterField<Stats>& f : table) {
    INFO("table name " << f.name);
    const auto* field = desc->FindFieldByName(std::string(f.name));
    REQUIRE(field != nullptr);
    CHECK(field->cpp_type() ==
          google::protobuf::FieldDescriptor::CPPTYPE_UINT64);
    CHECK(!field->is_repeated());
    CHECK(names.insert(std::string(f.name)).second);
  }
  size_t uint64_fields = 0;
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* field = desc->field(i);
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64)
      continue;
    INFO("proto field " << field->name());
    CHECK(names.count(field->name()) == 1);
    ++uint64_fields;
  }
  CHECK(uint64_fields == N);
  CHECK(static_cast<size_t>(desc->field_count()) == N + not_counters);
}

TEST_CASE("Counter tables cover the stats messages", "[server][convert]") {
  // name, tiers, calibration, codecs; uptime_seconds.
  CheckCounterTable(kNamespaceCounters, v1::NamespaceStats::descriptor(), 4);
  CheckCounterTable(kGlobalCounters, v1::GlobalStats::descriptor(), 1);
  // Every counter survives server -> proto -> SDK-style reads by name.
  NamespaceStats c;
  uint64_t v = 100;
  for (const auto& f : kNamespaceCounters) c.*(f.member) = v++;
  v1::NamespaceStats p;
  NamespaceStatsToProto(c, &p);
  const auto* refl = p.GetReflection();
  for (const auto& f : kNamespaceCounters) {
    INFO(f.name);
    CHECK(refl->GetUInt64(p, p.GetDescriptor()->FindFieldByName(
                                 std::string(f.name))) == c.*(f.member));
  }
}

TEST_CASE("Field names in core messages are rebased", "[server][status]") {
  const absl::Status nf = absl::NotFoundError("namespace: 'x' does not exist");
  CHECK(NameField(nf, "namespace").message() == nf.message());
  CHECK(NameField(nf, "header.namespace").message() ==
        "header.namespace: 'x' does not exist");
  CHECK(NameField(absl::NotFoundError("no such thing"), "lease_id").message() ==
        "lease_id: no such thing");
  CHECK(NameField(nf, "header.namespace").code() ==
        absl::StatusCode::kNotFound);
  CHECK(UnderPrefix(absl::DataLossError("page_checksums[2]: bad"), "header")
            .message() == "header.page_checksums[2]: bad");
  CHECK(UnderPrefix(absl::ResourceExhaustedError("namespace 'a' is full"),
                    "header")
            .message() == "namespace 'a' is full");
  CHECK(UnderPrefix(absl::OkStatus(), "header").ok());
}

}  // namespace
}  // namespace kvharbor
