# kvharbor_add_library(<name> SOURCES <src>... [PUBLIC <dep>...] [PRIVATE <dep>...])
#
# The library kvharbor_<name> as every folder of the project declares it: the
# alias kvharbor::<name> (and export name <name>), the source root as its
# include directory (sources and installed headers include "folder/x.h";
# installed headers also resolve as <kvharbor/folder/x.h>), its links, and the
# project's warnings (kvharbor_warnings).
function(kvharbor_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  set(target kvharbor_${name})
  add_library(${target} ${ARG_SOURCES})
  add_library(kvharbor::${name} ALIAS ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kvharbor>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  kvharbor_warnings(${target})
endfunction()
