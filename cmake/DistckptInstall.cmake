# cmake --install: headers, libdistckpt, distckpt-gen, the CLI tools and a
# package config so outside projects can find_package(distckpt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Imported as distckpt::gen, distckpt::cli, distckpt::launch.
set_target_properties(distckpt_gen PROPERTIES EXPORT_NAME gen)
set_target_properties(distckpt_cli PROPERTIES EXPORT_NAME cli)
set_target_properties(distckpt_launch PROPERTIES EXPORT_NAME launch)
# The installed CLI must find the installed libdistckpt.so wherever the
# prefix is (the build-tree RPATH is dropped on install).
file(RELATIVE_PATH _distckpt_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set_target_properties(distckpt_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_distckpt_bin_to_lib}")
# distckpt's include directory is already part of its INSTALL_INTERFACE.
set(_distckpt_installed distckpt distckpt_gen distckpt_cli distckpt_launch)
# Imported as distckpt::nccl where it was built (find_package(distckpt COMPONENTS nccl)).
if(TARGET distckpt_nccl)
  set_target_properties(distckpt_nccl PROPERTIES EXPORT_NAME nccl)
  target_include_directories(distckpt_nccl PUBLIC $<INSTALL_INTERFACE:include>)
  list(APPEND _distckpt_installed distckpt_nccl)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/nccl/include/distckpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(TARGETS ${_distckpt_installed}
  EXPORT distckptTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The user API: each layer's public headers, the umbrella and the version.
get_property(_distckpt_layers GLOBAL PROPERTY DISTCKPT_LAYERS)
foreach(layer IN LISTS _distckpt_layers)
  if(EXISTS ${PROJECT_SOURCE_DIR}/runtime/${layer}/include/distckpt)
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/${layer}/include/distckpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/runtime/include/distckpt/distckpt.h ${PROJECT_BINARY_DIR}/runtime/include/distckpt/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/distckpt)

set(DISTCKPT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/distckpt)
install(EXPORT distckptTargets NAMESPACE distckpt:: DESTINATION ${DISTCKPT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/distckptConfig.cmake.in
  ${PROJECT_BINARY_DIR}/distckptConfig.cmake INSTALL_DESTINATION ${DISTCKPT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/distckptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/distckptConfig.cmake ${PROJECT_BINARY_DIR}/distckptConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/DistckptGenerate.cmake ${PROJECT_SOURCE_DIR}/cmake/DistckptCxxRuntime.cmake
  DESTINATION ${DISTCKPT_CMAKE_DIR})
