// Issue 32 items 2 and 3 over gRPC, through the raw generated stub:
// page-hash namespaces (KEY_KIND_PAGE_HASHES: each page stored and found by
// its own key, so pages inserted in batches without their prefix match, a
// Match stops at the first missing key, and evicting a middle page shortens
// it), and a namespace's topology (model, layer range, KV-head range; with
// the geometry's dtype): a second CreateNamespace that claims a namespace
// with another identity is refused naming the differing field.
#include <string>
#include <vector>

#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using C = grpc::StatusCode;

v1::NamespaceSpec Spec(const std::string& name) {
  v1::NamespaceSpec spec;
  spec.set_name(name);
  *spec.mutable_geometry() = TestGeometryProto();
  spec.set_capacity_bytes(256 * kPageBytes);
  return spec;
}

grpc::Status Create(TestServer& s, const v1::NamespaceSpec& spec,
                    bool if_not_exists = true,
                    v1::CreateNamespaceResponse* out = nullptr) {
  grpc::ClientContext ctx;
  v1::CreateNamespaceRequest req;
  *req.mutable_spec() = spec;
  req.set_if_not_exists(if_not_exists);
  v1::CreateNamespaceResponse local;
  return s.stub->CreateNamespace(&ctx, req, out ? out : &local);
}

// Page keys "p<first>" .. "p<first + n - 1>" (chained hashes stand-ins).
std::vector<std::string> Keys(int first, int n) {
  std::vector<std::string> k;
  for (int i = 0; i < n; ++i) k.push_back("p" + std::to_string(first + i));
  return k;
}

grpc::Status InsertKeys(TestServer& s, const std::string& ns,
                        const std::vector<std::string>& keys,
                        const std::string& bytes,
                        v1::InsertResponse* resp = nullptr) {
  v1::InsertRequest header;
  header.mutable_header()->set_namespace_(ns);
  for (const std::string& k : keys) header.mutable_header()->add_page_keys(k);
  std::vector<v1::InsertRequest> msgs{header};
  for (size_t off = 0; off < bytes.size(); off += 64 << 10) {
    msgs.push_back(Chunk(off, bytes.substr(off, 64 << 10)));
  }
  return SendInsert(s.stub.get(), msgs, resp);
}

grpc::Status MatchKeys(TestServer& s, const std::string& ns,
                       const std::vector<std::string>& keys,
                       v1::MatchResponse* resp) {
  grpc::ClientContext ctx;
  v1::MatchRequest req;
  req.set_namespace_(ns);
  for (const std::string& k : keys) req.add_page_keys(k);
  return s.stub->Match(&ctx, req, resp);
}

size_t Matched(TestServer& s, const std::string& ns,
               const std::vector<std::string>& keys) {
  v1::MatchResponse resp;
  const grpc::Status st = MatchKeys(s, ns, keys, &resp);
  INFO(st.error_message());
  REQUIRE(st.ok());
  CHECK(resp.matched_tokens() == resp.page_handles_size() * kPageSize);
  return static_cast<size_t>(resp.page_handles_size());
}

std::vector<std::string> Join(std::vector<std::string> a,
                              const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("Page hashes: batches without a prefix match; eviction shortens",
          "[server][page_hashes]") {
  TestServer s;
  v1::NamespaceSpec spec = Spec("hashes");
  spec.set_key_kind(v1::KEY_KIND_PAGE_HASHES);
  v1::CreateNamespaceResponse created;
  REQUIRE(Create(s, spec, false, &created).ok());
  CHECK(created.info().spec().key_kind() == v1::KEY_KIND_PAGE_HASHES);

  // Pages 1..200 in two calls, the second naming no prefix (SGLang's
  // backup batches of 128).
  const std::string bytes = RandomBytes(200 * kPageBytes, 32);
  v1::InsertResponse r;
  REQUIRE(InsertKeys(s, "hashes", Keys(1, 128),
                     bytes.substr(0, 128 * kPageBytes), &r)
              .ok());
  REQUIRE(
      InsertKeys(s, "hashes", Keys(129, 72), bytes.substr(128 * kPageBytes), &r)
          .ok());
  CHECK(r.pages_stored() == 72);
  CHECK(Matched(s, "hashes", Keys(1, 200)) == 200);
  // A list whose earlier pages another call stored, without them.
  CHECK(Matched(s, "hashes", Keys(129, 72)) == 72);
  CHECK(Matched(s, "hashes", Keys(190, 20)) == 11);
  // Stops at the first missing key.
  CHECK(Matched(s, "hashes", Join(Join(Keys(1, 5), {"missing"}), Keys(6, 9))) ==
        5);
  // A lease on a run from the middle, then fetched whole.
  grpc::ClientContext lctx;
  v1::MatchRequest lreq;
  lreq.set_namespace_("hashes");
  for (const std::string& k : Keys(150, 10)) lreq.add_page_keys(k);
  lreq.set_lock(true);
  v1::MatchResponse leased;
  REQUIRE(s.stub->Match(&lctx, lreq, &leased).ok());
  REQUIRE(leased.lease_id() != 0);
  v1::FetchRequest freq;
  freq.set_namespace_("hashes");
  freq.set_lease_id(leased.lease_id());
  const FetchResult fetched = FetchAll(s.stub.get(), freq);
  REQUIRE(fetched.status.ok());
  CHECK(Reassemble(fetched, 1 << 20) ==
        bytes.substr(149 * kPageBytes, 10 * kPageBytes));

  // Evicting page 100 shortens the match from page 1 to 99 pages, and
  // leaves pages 101.. matching.
  v1::MatchResponse m;
  REQUIRE(MatchKeys(s, "hashes", Keys(100, 1), &m).ok());
  grpc::ClientContext ectx;
  v1::EvictRequest ereq;
  ereq.set_namespace_("hashes");
  ereq.mutable_pages()->add_page_handles(m.page_handles(0));
  v1::EvictResponse evicted;
  REQUIRE(s.stub->Evict(&ectx, ereq, &evicted).ok());
  CHECK(evicted.pages_evicted() == 1);
  CHECK(Matched(s, "hashes", Keys(1, 200)) == 99);
  CHECK(Matched(s, "hashes", Keys(101, 100)) == 100);

  // Inserting the whole list again stores only the evicted page.
  REQUIRE(InsertKeys(s, "hashes", Keys(1, 200), bytes, &r).ok());
  CHECK(r.pages_stored() == 1);
  CHECK(r.already_present_tokens() == 199 * kPageSize);
  CHECK(Matched(s, "hashes", Keys(1, 200)) == 200);
  REQUIRE(s.ns("hashes")->CheckInvariants().ok());
}

TEST_CASE("Page hashes: bad input names the field", "[server][page_hashes]") {
  TestServer s;
  v1::NamespaceSpec spec = Spec("hashes");
  spec.set_key_kind(v1::KEY_KIND_PAGE_HASHES);
  REQUIRE(Create(s, spec).ok());
  v1::MatchResponse m;
  CheckError(MatchKeys(s, "hashes", {"ok", std::string(33, 'x')}, &m),
             C::INVALID_ARGUMENT, "page_keys[1]");
  grpc::ClientContext ctx;
  v1::MatchRequest tokens;
  tokens.set_namespace_("hashes");
  for (int32_t t : Tokens(kPageSize, 0)) tokens.add_token_ids(t);
  CheckError(s.stub->Match(&ctx, tokens, &m), C::INVALID_ARGUMENT, "token_ids");
  CheckError(InsertKeys(s, "hashes", {"a", ""}, RandomBytes(2 * kPageBytes, 1)),
             C::INVALID_ARGUMENT, "header.page_keys[1]");
  v1::NamespaceSpec bad = Spec("bad");
  bad.set_key_kind(static_cast<v1::KeyKind>(7));
  CheckError(Create(s, bad), C::INVALID_ARGUMENT, "spec.key_kind");
  // The same name with another key kind names key_kind.
  spec.set_key_kind(v1::KEY_KIND_PAGE_KEYS);
  CheckError(Create(s, spec), C::ALREADY_EXISTS, "spec.key_kind");
}

v1::NamespaceSpec Stage(int layer_begin, int kv_head_begin) {
  v1::NamespaceSpec spec = Spec("llama");
  v1::Topology* t = spec.mutable_topology();
  t->set_model("meta-llama/Llama-3.1-8B");
  t->set_total_layers(4);
  t->set_layer_begin(layer_begin);
  t->set_total_kv_heads(4);
  t->set_kv_head_begin(kv_head_begin);
  return spec;
}

TEST_CASE("Topology: another stage, rank, model or dtype is refused",
          "[server][topology]") {
  TestServer s;
  v1::CreateNamespaceResponse created;
  REQUIRE(Create(s, Stage(0, 2), false, &created).ok());
  const v1::Topology& t = created.info().spec().topology();
  CHECK(t.model() == "meta-llama/Llama-3.1-8B");
  CHECK(t.layer_begin() == 0);
  CHECK(t.layer_end() == 2);  // filled in: begin + geometry.num_layers
  CHECK(t.total_layers() == 4);
  CHECK(t.kv_head_begin() == 2);
  CHECK(t.kv_head_end() == 4);
  CHECK(t.total_kv_heads() == 4);

  // The same claim again (with the ends spelled out) is the namespace.
  v1::NamespaceSpec same = Stage(0, 2);
  same.mutable_topology()->set_layer_end(2);
  same.mutable_topology()->set_kv_head_end(4);
  v1::CreateNamespaceResponse again;
  REQUIRE(Create(s, same, true, &again).ok());
  CHECK_FALSE(again.created());

  // Pipeline stage 1, another TP rank, another model, another dtype.
  CheckError(Create(s, Stage(2, 2)), C::ALREADY_EXISTS,
             "spec.topology.layer_begin");
  CheckError(Create(s, Stage(0, 0)), C::ALREADY_EXISTS,
             "spec.topology.kv_head_begin");
  v1::NamespaceSpec model = Stage(0, 2);
  model.mutable_topology()->set_model("Qwen/Qwen3-8B");
  CheckError(Create(s, model), C::ALREADY_EXISTS, "spec.topology.model");
  v1::NamespaceSpec dtype = Stage(0, 2);
  dtype.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
  CheckError(Create(s, dtype), C::ALREADY_EXISTS, "spec.geometry.dtype");
  v1::NamespaceSpec total = Stage(0, 2);
  total.mutable_topology()->set_total_layers(8);
  CheckError(Create(s, total), C::ALREADY_EXISTS, "spec.topology.total_layers");
  // An unsharded claim (no topology) is another identity too.
  CheckError(Create(s, Spec("llama")), C::ALREADY_EXISTS,
             "spec.topology.model");
  // Without if_not_exists an existing name is refused as before.
  CheckError(Create(s, Stage(0, 2), false), C::ALREADY_EXISTS, "spec.name");

  // A namespace per stage is the way.
  v1::NamespaceSpec stage1 = Stage(2, 2);
  stage1.set_name("llama-pp1");
  REQUIRE(Create(s, stage1).ok());
}

TEST_CASE("Topology: ranges must fit the geometry", "[server][topology]") {
  TestServer s;
  v1::NamespaceSpec wide = Stage(0, 0);
  wide.mutable_topology()->set_layer_end(3);  // 3 layers, geometry has 2
  CheckError(Create(s, wide), C::INVALID_ARGUMENT, "spec.topology.layer_end");
  v1::NamespaceSpec heads = Stage(0, 0);
  heads.mutable_topology()->set_kv_head_end(1);
  CheckError(Create(s, heads), C::INVALID_ARGUMENT,
             "spec.topology.kv_head_end");
  v1::NamespaceSpec past = Stage(3, 0);  // layers [3, 5) of 4
  CheckError(Create(s, past), C::INVALID_ARGUMENT,
             "spec.topology.total_layers");
  v1::NamespaceSpec long_model = Stage(0, 0);
  long_model.mutable_topology()->set_model(std::string(300, 'm'));
  CheckError(Create(s, long_model), C::INVALID_ARGUMENT, "spec.topology.model");
  // Unset: the whole model.
  v1::CreateNamespaceResponse created;
  REQUIRE(Create(s, Spec("whole"), false, &created).ok());
  const v1::Topology& t = created.info().spec().topology();
  CHECK(t.model().empty());
  CHECK(t.layer_begin() == 0);
  CHECK(t.layer_end() == 2);
  CHECK(t.total_layers() == 2);
  CHECK(t.kv_head_end() == 2);
  CHECK(t.total_kv_heads() == 2);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
