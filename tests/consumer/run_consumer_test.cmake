# cmake -P script behind the client:consumer_find_package test: installs the
# build tree BUILD_DIR into WORK_DIR/prefix, configures and builds the
# consumer project SOURCE_DIR against it, and runs the result.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: ${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "consumer test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run_step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR}
         --prefix ${prefix})
if(NOT EXISTS ${prefix}/lib/cmake/kvharbor/kvharborConfig.cmake)
  message(FATAL_ERROR "consumer test: no kvharborConfig.cmake under ${prefix}")
endif()
run_step("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
         -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_CXX_COMPILER=${CXX} "-DCMAKE_CXX_FLAGS=${FLAGS}"
         "-DCMAKE_EXE_LINKER_FLAGS=${FLAGS}")
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run" ${WORK_DIR}/build/kvharbor_consumer)
message(STATUS "${step_output}")
