# `cmake --install BUILD [--prefix DIR]`: the libraries registered with memplan_library() as the
# CMake package memplan (find_package(memplan), targets memplan::NAME), their headers under
# include/memplan/FOLDER/, and the memplan CLI under bin/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(MEMPLAN_LIBRARIES GLOBAL PROPERTY MEMPLAN_LIBRARIES)
get_property(MEMPLAN_HEADER_FOLDERS GLOBAL PROPERTY MEMPLAN_HEADER_FOLDERS)
list(REMOVE_DUPLICATES MEMPLAN_HEADER_FOLDERS)
# Builds every installed library and nothing else (scripts/test.sh's file-by-file check).
add_custom_target(memplan_libraries)
add_dependencies(memplan_libraries ${MEMPLAN_LIBRARIES})

install(TARGETS ${MEMPLAN_LIBRARIES} EXPORT memplanTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers only; without the CUDA backend, not the CUDA ones (nothing behind them was built).
# NAME_internal.h headers are shared by a library's own sources and are not API.
set(memplan_cuda_headers)
if(NOT MEMPLAN_HAVE_CUDA)
  set(memplan_cuda_headers PATTERN cuda EXCLUDE PATTERN cuda_device.h EXCLUDE)
endif()
foreach(folder IN LISTS MEMPLAN_HEADER_FOLDERS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/memplan/${folder}
    FILES_MATCHING PATTERN *.h PATTERN *.cuh ${memplan_cuda_headers} PATTERN *_internal.h EXCLUDE)
endforeach()

# The CLI finds the CUDA libraries it links where they were at build time.
set_target_properties(memplan PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS memplan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(MEMPLAN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/memplan)
install(EXPORT memplanTargets NAMESPACE memplan:: DESTINATION ${MEMPLAN_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/memplanConfig.cmake.in
  ${PROJECT_BINARY_DIR}/memplanConfig.cmake INSTALL_DESTINATION ${MEMPLAN_CMAKE_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/memplanConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/memplanConfig.cmake ${PROJECT_BINARY_DIR}/memplanConfigVersion.cmake
  DESTINATION ${MEMPLAN_CMAKE_DIR})
