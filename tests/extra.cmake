# Extra test wiring for server/ (included by tests/CMakeLists.txt).

if(TARGET kvharbord)
  # The server tests run the built daemon as a process (SIGTERM drain) and
  # check health through the generated grpc.health.v1 stubs.
  if(TARGET kvharbor_server_tests)
    target_compile_definitions(kvharbor_server_tests PRIVATE
      KVHARBORD_PATH="$<TARGET_FILE:kvharbord>"
      KVHARBOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    target_link_libraries(kvharbor_server_tests PRIVATE kvharbor_health_proto)
    add_dependencies(kvharbor_server_tests kvharbord)
    # tests/server/device_setup_test.cc loads the GPU tier plugin (no GPU
    # needed) to check that it is whole.
    if(TARGET kvharbor_gpu_tier)
      target_compile_definitions(kvharbor_server_tests PRIVATE
        KVHARBOR_GPU_TIER_PLUGIN_PATH="$<TARGET_FILE:kvharbor_gpu_tier>")
    endif()
  endif()

  # Reflection as grpcurl speaks it, against the kvharbord process. A binary of
  # its own: the v1alpha client stubs of kvharbor_reflection_proto must not
  # meet libgrpc++_reflection (which kvharbor_server links) in one process,
  # or the same descriptors are registered twice.
  if(TARGET kvharbor_reflection_proto)
    add_executable(kvharbor_reflection_tests
      ${CMAKE_CURRENT_SOURCE_DIR}/reflection/reflection_test.cc
      $<TARGET_OBJECTS:kvharbor_catch_main>)
    target_link_libraries(kvharbor_reflection_tests PRIVATE
      Catch2::Catch2 kvharbor_reflection_proto protobuf::libprotobuf
      gRPC::grpc++)
    target_include_directories(kvharbor_reflection_tests PRIVATE
      ${PROJECT_SOURCE_DIR})
    target_compile_definitions(kvharbor_reflection_tests PRIVATE
      KVHARBORD_PATH="$<TARGET_FILE:kvharbord>"
      KVHARBOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    add_dependencies(kvharbor_reflection_tests kvharbord)
    kvharbor_warnings(kvharbor_reflection_tests)
    catch_discover_tests(kvharbor_reflection_tests TEST_PREFIX "reflection:")
  endif()
endif()
