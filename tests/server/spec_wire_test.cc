// The one NamespaceSpec (types/namespace_spec.h) through both conversions of
// kvharbor.v1.NamespaceSpec: the daemon's (server/rpc/convert.h) and the SDK's
// (client/proto_convert.h). A request field that one of them drops, or that
// the test does not set, fails here.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "client/proto_convert.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/rpc/convert.h"

namespace kvharbor {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::util::MessageDifferencer;

// A request with every field of the spec and its messages set to a value
// other than its default (valid for the daemon's conversion).
v1::NamespaceSpec FullSpec() {
  v1::NamespaceSpec s;
  s.set_name("ns-1");
  v1::Geometry* g = s.mutable_geometry();
  g->set_num_layers(4);
  g->set_num_kv_heads(2);
  g->set_head_dim(64);
  g->set_page_size(16);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_layout(v1::PAGE_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM);
  g->set_rope_theta(10000.0f);
  s.set_capacity_bytes(1 << 20);
  s.set_codec("kvtc");
  s.set_calibration_path("/cal/kvtc.bin");
  s.set_calibration("inline calibration bytes");
  s.set_host_compressed_bytes(7 << 20);
  s.set_disk_dir("/var/lib/kvharbor/ns-1");
  s.set_disk_bytes(9 << 20);
  s.set_kvcm_path("/kvcm/ns-1.bin");
  s.set_key_kind(v1::KEY_KIND_PAGE_HASHES);
  v1::Topology* t = s.mutable_topology();
  t->set_model("org/model@rev");
  t->set_total_layers(8);
  t->set_layer_begin(4);
  t->set_layer_end(8);
  t->set_total_kv_heads(4);
  t->set_kv_head_begin(2);
  t->set_kv_head_end(4);
  v1::OnlineCalibration* o = s.mutable_online_calibration();
  o->set_enabled(true);
  o->set_min_tokens(100);
  o->set_max_sample_tokens(200);
  o->set_target_ratio(3.5);
  o->set_row_kind(v1::KVTC_ROW_KIND_PER_PAGE);
  o->set_sink_tokens(2);
  o->set_rope_style(v1::ROPE_STYLE_HALF_SPLIT);
  return s;
}

// Fields of `m` (and of the messages it holds) left at their default, as
// "prefix.field".
void UnsetFields(const Message& m, const std::string& prefix,
                 std::vector<std::string>* out) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> set;
  r->ListFields(m, &set);
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string name = prefix + f->name();
    bool is_set = false;
    for (const FieldDescriptor* s : set) is_set |= s == f;
    if (!is_set) {
      out->push_back(name);
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE &&
               !f->is_repeated()) {
      UnsetFields(r->GetMessage(m, f), name + ".", out);
    }
  }
}

TEST_CASE("The wire test spec sets every request field", "[server][convert]") {
  std::vector<std::string> unset;
  UnsetFields(FullSpec(), "", &unset);
  // Output only: the daemon fills it in.
  CHECK(unset == std::vector<std::string>{"calibration_fingerprint"});
}

TEST_CASE("A spec crosses the daemon's and the SDK's conversions whole",
          "[server][convert]") {
  const v1::NamespaceSpec wire = FullSpec();
  // The daemon reads it into the spec type the SDK also holds, and the SDK's
  // conversion of that value gives the same message back.
  absl::StatusOr<NamespaceSpec> daemon = NamespaceSpecFromProto(wire, "spec");
  REQUIRE(daemon.ok());
  v1::NamespaceSpec sent;
  client::ToProto(*daemon, &sent);
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  const bool same = d.Compare(sent, wire);
  INFO(diff);
  CHECK(same);

  // The SDK's reading, minus what the daemon never returns (the inline
  // calibration), gives the same message back too.
  const NamespaceSpec sdk = client::FromProto(wire);
  v1::NamespaceSpec again;
  client::ToProto(sdk, &again);
  v1::NamespaceSpec want = wire;
  want.clear_calibration();
  diff.clear();
  const bool same_again = d.Compare(again, want);
  INFO(diff);
  CHECK(same_again);
}

TEST_CASE("Online calibration defaults are the daemon's on both ends",
          "[server][convert]") {
  // A zero message asks for the defaults: the daemon's conversion leaves
  // the type's initializers, which the SDK sends when left alone.
  v1::OnlineCalibration zero;
  zero.set_enabled(true);
  absl::StatusOr<OnlineCalibrationOptions> daemon =
      OnlineCalibrationFromProto(zero, "spec.online_calibration");
  REQUIRE(daemon.ok());
  client::OnlineCalibration sdk;
  sdk.enabled = true;
  v1::OnlineCalibration a, b;
  client::ToProto(*daemon, &a);
  client::ToProto(sdk, &b);
  CHECK(MessageDifferencer::Equals(a, b));
  CHECK(a.min_tokens() == 65536);
  CHECK(a.target_ratio() == 16.0);
  CHECK(a.sink_tokens() == 4);
}

}  // namespace
}  // namespace kvharbor
