# install_pkgconfig.cmake - run by `cmake --install` (install(CODE) in CMakeLists.txt): writes
# kvstrata.pc for the prefix being installed to (`--prefix P` included; the configured
# CMAKE_INSTALL_PREFIX otherwise) and installs it. Expects KVS_PC_TEMPLATE, KVS_PC_OUTPUT,
# CMAKE_INSTALL_LIBDIR, CMAKE_INSTALL_INCLUDEDIR and PROJECT_VERSION to be set by the caller.
get_filename_component(KVS_PC_PREFIX "${CMAKE_INSTALL_PREFIX}" ABSOLUTE)
configure_file("${KVS_PC_TEMPLATE}" "${KVS_PC_OUTPUT}" @ONLY)
# file(INSTALL) puts $DESTDIR in front; the .pc names the prefix without it.
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig" TYPE FILE
     FILES "${KVS_PC_OUTPUT}")
