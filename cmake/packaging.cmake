# Install rules and the kvharbor CMake package (find_package(kvharbor)):
# the SDK, the CLI, their public headers and the libraries they link.
include(CMakePackageConfigHelpers)
set(KVHARBOR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvharbor)
set_target_properties(kvharbor_proto PROPERTIES EXPORT_NAME proto)

install(TARGETS kvharbor_client kvharbor_cluster kvharbor_proto kvharbor_core
  kvharbor_types
  EXPORT kvharborTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kvharbor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The SDK's public headers: include/kvharbor/ as it is, so consumers include
# <kvharbor/client.h> (LevelDB's include/leveldb). The C ABI's header
# (capi/kvharbor_c.h) is installed next to them by capi/CMakeLists.txt.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvharbor
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
# The SDK's types are the shared value types of types/.
install(FILES ${PROJECT_SOURCE_DIR}/types/enum_names.h
  ${PROJECT_SOURCE_DIR}/types/geometry.h
  ${PROJECT_SOURCE_DIR}/types/key_kind.h
  ${PROJECT_SOURCE_DIR}/types/layer_range.h
  ${PROJECT_SOURCE_DIR}/types/namespace_spec.h
  ${PROJECT_SOURCE_DIR}/types/online_calibration.h
  ${PROJECT_SOURCE_DIR}/types/stats.h
  ${PROJECT_SOURCE_DIR}/types/tier.h
  ${PROJECT_SOURCE_DIR}/types/topology.h
  ${PROJECT_SOURCE_DIR}/types/host_ipc_wire.h
  ${PROJECT_SOURCE_DIR}/types/kv_layout.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvharbor/types)
# ClusterClient's public header names the member sources.
install(FILES ${PROJECT_SOURCE_DIR}/cluster/etcd_client.h
  ${PROJECT_SOURCE_DIR}/cluster/member_source.h
  ${PROJECT_SOURCE_DIR}/cluster/registrar.h
  ${PROJECT_SOURCE_DIR}/cluster/rendezvous.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvharbor/cluster)
# Generated API headers, for applications that speak the proto directly.
install(FILES
  ${PROJECT_BINARY_DIR}/proto/kvharbor/v1/kvharbor.pb.h
  ${PROJECT_BINARY_DIR}/proto/kvharbor/v1/kvharbor.grpc.pb.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvharbor/kvharbor/v1)
install(EXPORT kvharborTargets
  NAMESPACE kvharbor::
  FILE kvharborTargets.cmake
  DESTINATION ${KVHARBOR_CMAKE_DIR})
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/kvharborConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/kvharborConfig.cmake
  INSTALL_DESTINATION ${KVHARBOR_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/kvharborConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/kvharborConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/kvharborConfigVersion.cmake
  DESTINATION ${KVHARBOR_CMAKE_DIR})
