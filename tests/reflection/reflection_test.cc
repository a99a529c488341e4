// Server reflection as grpcurl uses it (`grpcurl -plaintext HOST:PORT list`,
// `describe kvharbor.v1.KvHarbor.Match`, `grpc.health.v1.Health/Check`),
// against the built kvharbord.
//
// This binary has its own copy of the v1alpha reflection messages, so it must
// not link libgrpc++_reflection (or kvharbor_server, which does): the two
// would register the same descriptors twice.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/server/subprocess.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

namespace refl = grpc::reflection::v1alpha;

// One request/response exchange on the reflection stream, as grpcurl does.
refl::ServerReflectionResponse Ask(refl::ServerReflection::Stub* stub,
                                   const refl::ServerReflectionRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->ServerReflectionInfo(&ctx);
  REQUIRE(stream->Write(req));
  stream->WritesDone();
  refl::ServerReflectionResponse resp;
  REQUIRE(stream->Read(&resp));
  refl::ServerReflectionResponse extra;
  CHECK_FALSE(stream->Read(&extra));
  grpc::Status s = stream->Finish();
  INFO(s.error_message());
  REQUIRE(s.ok());
  return resp;
}

TEST_CASE("Reflection lists the services and describes Match", "[reflection]") {
  Kvharbord proc(KVHARBORD_PATH, {"--pool_bytes=16MiB"});
  REQUIRE(proc.started());
  auto ch = proc.Connect();
  REQUIRE(ch != nullptr);
  auto stub = refl::ServerReflection::NewStub(ch);

  // list
  refl::ServerReflectionRequest list;
  list.set_host("");
  list.set_list_services("*");
  refl::ServerReflectionResponse listed = Ask(stub.get(), list);
  REQUIRE(listed.has_list_services_response());
  std::set<std::string> names;
  for (const auto& s : listed.list_services_response().service()) {
    names.insert(s.name());
  }
  CHECK(names.count("kvharbor.v1.KvHarbor") == 1);
  CHECK(names.count("grpc.health.v1.Health") == 1);
  CHECK(names.count("grpc.reflection.v1alpha.ServerReflection") == 1);

  // describe: the file that defines the service, then the method in it.
  for (const char* symbol :
       {"kvharbor.v1.KvHarbor", "kvharbor.v1.KvHarbor.Match"}) {
    INFO(symbol);
    refl::ServerReflectionRequest req;
    req.set_file_containing_symbol(symbol);
    refl::ServerReflectionResponse resp = Ask(stub.get(), req);
    REQUIRE(resp.has_file_descriptor_response());
    const auto& files = resp.file_descriptor_response().file_descriptor_proto();
    REQUIRE(files.size() >= 1);
    google::protobuf::FileDescriptorProto file;
    REQUIRE(file.ParseFromString(files.Get(0)));
    CHECK(file.name() == "kvharbor/v1/kvharbor.proto");
    CHECK(file.package() == "kvharbor.v1");
    const google::protobuf::ServiceDescriptorProto* svc = nullptr;
    for (const auto& s : file.service()) {
      if (s.name() == "KvHarbor") svc = &s;
    }
    REQUIRE(svc != nullptr);
    const google::protobuf::MethodDescriptorProto* match = nullptr;
    for (const auto& m : svc->method()) {
      if (m.name() == "Match") match = &m;
    }
    REQUIRE(match != nullptr);
    CHECK(match->input_type() == ".kvharbor.v1.MatchRequest");
    CHECK(match->output_type() == ".kvharbor.v1.MatchResponse");
    CHECK_FALSE(match->client_streaming());
    CHECK_FALSE(match->server_streaming());
    // The request type is described too (grpcurl describes it next).
    const auto& msgs = file.message_type();
    CHECK(std::any_of(msgs.begin(), msgs.end(), [](const auto& m) {
      return m.name() == "MatchRequest";
    }));
    // 12 methods, plus GetCalibration and Demote for the page tiers and
    // Upload/List/PinCalibration for the calibration API, and
    // GetDeviceHandles and DeviceInsert for same-host zero copy and
    // GetHostHandles for the same-host Fetch through shared memory.
    CHECK(svc->method_size() == 20);
    for (const char* name :
         {"GetCalibration", "Demote", "UploadCalibration", "ListCalibrations",
          "PinCalibration", "GetDeviceHandles", "GetHostHandles",
          "DeviceInsert"}) {
      CHECK(std::any_of(svc->method().begin(), svc->method().end(),
                        [&](const auto& m) { return m.name() == name; }));
    }
  }

  // An unknown symbol is NOT_FOUND in the reflection response.
  refl::ServerReflectionRequest unknown;
  unknown.set_file_containing_symbol("kvharbor.v1.NoSuchThing");
  refl::ServerReflectionResponse err = Ask(stub.get(), unknown);
  REQUIRE(err.has_error_response());
  CHECK(err.error_response().error_code() ==
        static_cast<int>(grpc::StatusCode::NOT_FOUND));
}

// What grpcurl does for a method it knows only by name: ask reflection for
// the file defining the symbol, build the descriptors from the answer, then
// call the method with a message built from them.
TEST_CASE("Reflection resolves grpc.health.v1.Health and Check runs from it",
          "[reflection]") {
  namespace pb = google::protobuf;
  Kvharbord proc(KVHARBORD_PATH, {"--pool_bytes=16MiB"});
  REQUIRE(proc.started());
  auto ch = proc.Connect();
  REQUIRE(ch != nullptr);
  auto stub = refl::ServerReflection::NewStub(ch);

  pb::DescriptorPool pool;
  for (const char* symbol :
       {"grpc.health.v1.Health", "grpc.health.v1.Health.Check"}) {
    INFO(symbol);
    refl::ServerReflectionRequest req;
    req.set_file_containing_symbol(symbol);
    refl::ServerReflectionResponse resp = Ask(stub.get(), req);
    INFO(resp.error_response().error_message());
    REQUIRE(resp.has_file_descriptor_response());
    // The file and the files it imports; each is built once its imports
    // are in the pool (health.proto imports none).
    std::vector<pb::FileDescriptorProto> files;
    for (const std::string& bytes :
         resp.file_descriptor_response().file_descriptor_proto()) {
      REQUIRE(files.emplace_back().ParseFromString(bytes));
    }
    for (size_t round = 0; round < files.size(); ++round) {
      for (const pb::FileDescriptorProto& f : files) {
        if (pool.FindFileByName(f.name()) == nullptr) pool.BuildFile(f);
      }
    }
    CHECK(pool.FindFileByName("grpc/health/v1/health.proto") != nullptr);
  }
  const pb::MethodDescriptor* check =
      pool.FindMethodByName("grpc.health.v1.Health.Check");
  REQUIRE(check != nullptr);
  CHECK(check->input_type()->full_name() ==
        "grpc.health.v1.HealthCheckRequest");

  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> request(
      factory.GetPrototype(check->input_type())->New());
  const pb::FieldDescriptor* service =
      check->input_type()->FindFieldByName("service");
  REQUIRE(service != nullptr);
  request->GetReflection()->SetString(request.get(), service,
                                      "kvharbor.v1.KvHarbor");
  const std::string request_bytes = request->SerializeAsString();
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::promise<grpc::Status> done;
  grpc::GenericStub generic(ch);
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                    &request_buffer, &response_buffer,
                    [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  INFO(status.error_message());
  REQUIRE(status.ok());
  grpc::Slice response_slice;
  REQUIRE(response_buffer.DumpToSingleSlice(&response_slice).ok());
  std::unique_ptr<pb::Message> response(
      factory.GetPrototype(check->output_type())->New());
  REQUIRE(response->ParseFromArray(response_slice.begin(),
                                   static_cast<int>(response_slice.size())));
  const pb::FieldDescriptor* serving =
      check->output_type()->FindFieldByName("status");
  REQUIRE(serving != nullptr);
  CHECK(response->GetReflection()->GetEnum(*response, serving)->name() ==
        "SERVING");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
