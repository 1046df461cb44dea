# cmake --install: headers, libdistckpt, distckpt-gen, the CLI tools and a
# package config so outside projects can find_package(distckpt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(distckpt_gen PROPERTIES EXPORT_NAME gen)
install(TARGETS distckpt distckpt_gen distckpt_cli distckpt_launch
  EXPORT distckptTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/distckpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(DISTCKPT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/distckpt)
install(EXPORT distckptTargets NAMESPACE distckpt:: DESTINATION ${DISTCKPT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/distckptConfig.cmake.in
  ${PROJECT_BINARY_DIR}/distckptConfig.cmake INSTALL_DESTINATION ${DISTCKPT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/distckptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/distckptConfig.cmake ${PROJECT_BINARY_DIR}/distckptConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/DistckptGenerate.cmake DESTINATION ${DISTCKPT_CMAKE_DIR})
