# Client SDK test extras, included from tests/CMakeLists.txt:
# - the CLI test runs the built `kvharbor` binary;
# - the consumer test installs this build tree into a scratch prefix and
#   builds tests/consumer against it with find_package(kvharbor).
if(TARGET kvharbor_client_tests AND TARGET kvharbor)
  add_dependencies(kvharbor_client_tests kvharbor)
  target_compile_definitions(kvharbor_client_tests PRIVATE
    KVHARBOR_CLI_PATH="$<TARGET_FILE:kvharbor>")
endif()

if(TARGET kvharbor_client)
  # Static libraries built with a sanitizer need it on the consumer's link.
  set(consumer_flags "")
  if(KVHARBOR_SANITIZE STREQUAL "address")
    set(consumer_flags "-fsanitize=address,undefined")
  elseif(KVHARBOR_SANITIZE STREQUAL "thread")
    set(consumer_flags "-fsanitize=thread")
  endif()
  add_test(NAME client:consumer_find_package
    COMMAND ${CMAKE_COMMAND}
      -DBUILD_DIR=${PROJECT_BINARY_DIR}
      -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/consumer
      -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_work
      -DGENERATOR=${CMAKE_GENERATOR}
      -DCXX=${CMAKE_CXX_COMPILER}
      -DFLAGS=${consumer_flags}
      -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_consumer_test.cmake)
  set_tests_properties(client:consumer_find_package PROPERTIES TIMEOUT 900)
endif()
