# Run by `cmake --install` (and by cpack, which installs the same way): the files whose place
# or content depends on the prefix the project is installed to, which is known only now
# (`--prefix`, CMAKE_INSTALL_PREFIX, or /usr for the .deb), not when the project was
# configured. file(INSTALL) puts them under $DESTDIR and in the install manifest.
#
# Set by packaging/CMakeLists.txt before this runs (directories relative to the prefix):
#   GMUX_PACKAGING_DIR  packaging/ in the source tree (the templates)
#   GMUX_WORK_DIR       where the filled-in templates are written
#   GMUX_REL_BINDIR, GMUX_REL_WORKERDIR, GMUX_REL_PLUGINDIR, GMUX_REL_DOCDIR
#
# As GNUInstallDirs does for SYSCONFDIR, prefix /usr puts the configuration in /etc, and the unit
# goes to /lib/systemd/system (Debian 12's place for packaged units); any other prefix P puts
# them in P/etc and P/lib/systemd/system (systemd reads /usr/local/lib/systemd/system too, but the
# OpenCL loader reads only /etc/OpenCL/vendors: docs/operations.md, "Running under systemd").

set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
  set(unitdir "/lib/systemd/system")
else()
  set(etc "${prefix}/etc")
  set(unitdir "${prefix}/lib/systemd/system")
endif()

# The templates' @VARIABLES@.
set(GMUX_GMUXD "${prefix}/${GMUX_REL_BINDIR}/gmuxd")
set(GMUX_WORKER "${prefix}/${GMUX_REL_WORKERDIR}/gmux-worker")
set(GMUX_CONFIG "${etc}/gmux/gmuxd.toml")
set(GMUX_DOCDIR "${prefix}/${GMUX_REL_DOCDIR}")

# gmux_fill(TEMPLATE OUTPUT): OUTPUT (under GMUX_WORK_DIR) is TEMPLATE with @VARIABLES@ set.
function(gmux_fill template output)
  file(READ "${GMUX_PACKAGING_DIR}/${template}" text)
  string(CONFIGURE "${text}" text @ONLY)
  file(WRITE "${GMUX_WORK_DIR}/${output}" "${text}")
endfunction()

file(MAKE_DIRECTORY "${GMUX_WORK_DIR}")
# The ICD names its library by absolute path, as the build tree's gmux.icd does.
file(WRITE "${GMUX_WORK_DIR}/gmux.icd" "${prefix}/${GMUX_REL_PLUGINDIR}/libgmux-icd.so\n")
gmux_fill(gmuxd.toml.in gmuxd.toml)
gmux_fill(gmuxd.service.in gmuxd.service)

file(INSTALL DESTINATION "${etc}/OpenCL/vendors" TYPE FILE FILES "${GMUX_WORK_DIR}/gmux.icd")
# An operator's configuration is kept, as dpkg keeps a changed conffile (the package's is
# installed into an empty staging directory, so always). 0640 root:root: tokens go in it.
set(config "$ENV{DESTDIR}${etc}/gmux/gmuxd.toml")
file(READ "${GMUX_WORK_DIR}/gmuxd.toml" packaged)
if(EXISTS "${config}")
  file(READ "${config}" present)
endif()
if(EXISTS "${config}" AND NOT present STREQUAL packaged)
  message(STATUS "Keeping: ${config} (changed since installed; "
    "the new one is ${GMUX_WORK_DIR}/gmuxd.toml)")
else()
  file(INSTALL DESTINATION "${etc}/gmux" TYPE FILE
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ FILES "${GMUX_WORK_DIR}/gmuxd.toml")
endif()
file(INSTALL DESTINATION "${unitdir}" TYPE FILE FILES "${GMUX_WORK_DIR}/gmuxd.service")
