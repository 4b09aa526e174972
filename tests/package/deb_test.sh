#!/usr/bin/env bash
# PackageTest.Deb: builds the Debian package from a built tree with cpack (nothing is compiled),
# checks its control fields and files, and runs what it installs from the unpacked tree: the
# daemon with the packaged configuration (its paths moved into the temp directory) and, as root,
# with only the unit's capabilities; the worker it names; the CLI; and an OpenCL program (clinfo,
# as another user when root) through the packaged ICD.
#
# usage: deb_test.sh CPACK CPACK_CONFIG VERSION WITH_FRAME(0|1)
# Everything is written under one temp directory, removed at exit.
set -euo pipefail
cpack="$1"
config="$2"
version="$3"
with_frame="$4"

work="$(mktemp -d /tmp/gmux-package-XXXXXX)"
chmod 755 "$work"  # the daemon's workers may run under another uid
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "PackageTest.Deb FAILED: $*" >&2
  exit 1
}
check() {  # check DESCRIPTION COMMAND...: fails the test with DESCRIPTION unless COMMAND succeeds
  local what="$1"
  shift
  "$@" || fail "$what"
  echo "ok: $what"
}

# --- the package -------------------------------------------------------------------------------
if ! "$cpack" -G DEB --config "$config" -B "$work/out" >"$work/cpack.log" 2>&1; then
  cat "$work/cpack.log"
  fail "cpack -G DEB"
fi
arch="$(dpkg --print-architecture)"
deb="$work/out/gmux_${version}_${arch}.deb"
check "cpack wrote $(basename "$deb")" test -f "$deb"

# --- control fields ----------------------------------------------------------------------------
field() { dpkg-deb --field "$deb" "$1"; }
check "Package: gmux" test "$(field Package)" = gmux
check "Version: $version" test "$(field Version)" = "$version"
check "Architecture: $arch" test "$(field Architecture)" = "$arch"
check "a Maintainer" test -n "$(field Maintainer)"
depends="$(field Depends)"
echo "Depends: $depends"
# The packages Depends names, one a line (the first of each set of alternatives).
depends_names="$(tr ',' '\n' <<<"$depends" | awk '{print $1}')"
for d in adduser ocl-icd-libopencl1 libc6 libstdc++6; do
  # libc6 and libstdc++6 come from dpkg-shlibdeps.
  check "Depends names $d" grep -qxF "$d" <<<"$depends_names"
done
conffiles="$(dpkg-deb --info "$deb" conffiles)"
check "conffile /etc/gmux/gmuxd.toml" grep -qx /etc/gmux/gmuxd.toml <<<"$conffiles"
check "conffile /etc/OpenCL/vendors/gmux.icd" \
  grep -qx /etc/OpenCL/vendors/gmux.icd <<<"$conffiles"
postinst="$(dpkg-deb --info "$deb" postinst)"
check "postinst adds the gmux system user" grep -q "adduser --system" <<<"$postinst"
check "postinst enables the unit" \
  grep -q "deb-systemd-helper enable gmuxd.service" <<<"$postinst"
check "prerm stops the unit" grep -q "stop gmuxd.service" <<<"$(dpkg-deb --info "$deb" prerm)"
check "postrm purges the unit" grep -q "purge gmuxd.service" <<<"$(dpkg-deb --info "$deb" postrm)"

# --- files -------------------------------------------------------------------------------------
# "MODE PATH" per line, from `dpkg-deb --contents` (its columns: mode, owner, size, date, time,
# path).
contents="$(dpkg-deb --contents "$deb" | awk '{print $1, $6}')"
expect() {  # expect MODE PATH
  check "$2 ($1)" grep -qxF -- "$1 .$2" <<<"$contents"
}
expect -rwxr-xr-x /usr/bin/gmuxd
expect -rwxr-xr-x /usr/bin/gmux
expect -rwxr-xr-x /usr/libexec/gmux/gmux-worker
expect -rw-r--r-- /usr/lib/gmux/libgmux-icd.so
if [ "$with_frame" = 1 ]; then
  expect -rw-r--r-- /usr/lib/gmux/libgmux-frame.so
fi
expect -rw-r--r-- /etc/OpenCL/vendors/gmux.icd
expect -rw-r----- /etc/gmux/gmuxd.toml
expect -rw-r--r-- /lib/systemd/system/gmuxd.service
expect -rw-r--r-- /usr/lib/sysusers.d/gmux.conf
expect -rwxr-xr-x /usr/lib/gmux/slurm/gmux-prolog
expect -rwxr-xr-x /usr/lib/gmux/slurm/gmux-taskepilog
expect -rw-r--r-- /usr/lib/gmux/slurm/gmux-slurm-common.sh
expect -rw-r--r-- /usr/share/doc/gmux/examples/slurm/slurm.conf.fragment
expect -rw-r--r-- /usr/share/doc/gmux/examples/gmuxd.example.toml
expect -rw-r--r-- /usr/share/doc/gmux/operations.md
no_usr_local() { ! grep -q " ./usr/local" <<<"$contents"; }
check "nothing under /usr/local" no_usr_local

root="$work/root"
dpkg-deb --extract "$deb" "$root"
check "gmux.icd names the installed ICD" \
  test "$(cat "$root/etc/OpenCL/vendors/gmux.icd")" = /usr/lib/gmux/libgmux-icd.so
unit="$root/lib/systemd/system/gmuxd.service"
check "the unit starts /usr/bin/gmuxd with /etc/gmux/gmuxd.toml" \
  grep -qx "ExecStart=/usr/bin/gmuxd --config /etc/gmux/gmuxd.toml" "$unit"
check "the unit reloads with SIGHUP" grep -qxF "ExecReload=/bin/kill -HUP \$MAINPID" "$unit"
check "the unit's socket directory is /run/gmux" grep -qx "RuntimeDirectory=gmux" "$unit"
check "the unit sets NoNewPrivileges" grep -qx "NoNewPrivileges=yes" "$unit"
check "the unit sets ProtectSystem" grep -qx "ProtectSystem=strict" "$unit"
worker="$(sed -n 's/^worker_path = "\(.*\)"$/\1/p' "$root/etc/gmux/gmuxd.toml")"
check "gmuxd.toml's worker_path is /usr/libexec/gmux/gmux-worker" \
  test "$worker" = /usr/libexec/gmux/gmux-worker
no_staging_path() { ! grep -rq _CPack_Packages "$root/etc" "$root/lib"; }
check "no file names cpack's staging directory" no_staging_path

# The unit as systemd reads it, where systemd is installed: its ExecStart must name an
# executable, so it is checked from a copy that names the unpacked gmuxd.
if command -v systemd-analyze >/dev/null; then
  mkdir "$work/units"
  sed "s|^ExecStart=/usr/bin/gmuxd|ExecStart=$root/usr/bin/gmuxd|" "$unit" \
    >"$work/units/gmuxd.service"
  if ! systemd-analyze verify --man=no "$work/units/gmuxd.service" >"$work/verify.log" 2>&1 ||
    [ -s "$work/verify.log" ]; then
    cat "$work/verify.log"
    fail "systemd-analyze verify gmuxd.service"
  fi
  echo "ok: systemd-analyze verify gmuxd.service"
else
  echo "skipped: systemd-analyze verify (systemd is not installed)"
fi

# --- the unpacked tree at work -----------------------------------------------------------------
# The packaged configuration with its host paths moved into the temp directory (worker_user:
# the gmux user exists only where the package was installed).
run="$work/run"
mkdir -m 755 "$run"
sock="$run/gmuxd.sock"
sed -e "s|^socket = \"[^\"]*\"|socket = \"$sock\"|" \
  -e "s|^worker_path = \"|worker_path = \"$root|" \
  -e "s|^state_dir = \"[^\"]*\"|state_dir = \"$run/state\"|" \
  -e "s|^worker_user = \"[^\"]*\"|worker_user = \"nobody\"|" \
  "$root/etc/gmux/gmuxd.toml" >"$run/gmuxd.toml"
# As root, gmuxd runs as the unit runs it: with no capabilities but its CapabilityBoundingSet=
# and with no new privileges; the client then runs as `nobody`, so that gmuxd must switch its
# worker to another uid and hand that uid a kernel cache, with only those capabilities.
as_daemon=()
as_client=()
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  caps="$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr '[:upper:]' '[:lower:]' |
    sed -e 's/cap_/+/g' -e 's/ /,/g')"
  as_daemon=(setpriv --bounding-set "-all,$caps" --no-new-privs)
  as_client=(setpriv --reuid "$(id -u nobody)" --regid "$(id -g nobody)" --clear-groups)
  echo "gmuxd's capabilities: $caps; the client's uid: nobody"
fi
"${as_daemon[@]}" "$root/usr/bin/gmuxd" --config "$run/gmuxd.toml" --exit-after 120 \
  2>"$run/gmuxd.log" &
daemon_pid=$!
for _ in $(seq 600); do
  [ -S "$sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
if [ ! -S "$sock" ]; then
  cat "$run/gmuxd.log"
  fail "the unpacked gmuxd did not come up with the packaged configuration"
fi
echo "ok: the unpacked gmuxd serves $sock"
status="$(GMUX_SOCKET="$sock" "$root/usr/bin/gmux" status --json)"
check "the unpacked gmux status reads it" grep -q '"devices"' <<<"$status"
if command -v clinfo >/dev/null; then
  mkdir "$run/vendors"
  echo "$root/usr/lib/gmux/libgmux-icd.so" >"$run/vendors/gmux.icd"
  listing="$("${as_client[@]}" env OCL_ICD_VENDORS="$run/vendors" GMUX_SOCKET="$sock" \
    clinfo --list)"
  echo "$listing"
  check "clinfo sees platform gmux through the unpacked ICD" grep -q "Platform #0: gmux" \
    <<<"$listing"
  check "and the daemon's devices (served by the unpacked worker)" grep -q "Device #0" \
    <<<"$listing"
else
  echo "skipped: clinfo through the unpacked ICD (clinfo is not installed)"
fi
if [ "$with_frame" = 1 ]; then
  check "the unpacked frame agent preloads" \
    env LD_PRELOAD="$root/usr/lib/gmux/libgmux-frame.so" GMUX_SOCKET="$sock" true
fi
# The unit's ExecReload: SIGHUP makes gmuxd read the packaged configuration again.
kill -HUP "$daemon_pid"
for _ in $(seq 100); do
  grep -q "reloaded" "$run/gmuxd.log" && break
  sleep 0.1
done
if ! grep -q "reloaded" "$run/gmuxd.log"; then
  cat "$run/gmuxd.log"
  fail "gmuxd did not reload its configuration on SIGHUP"
fi
echo "ok: gmuxd reloads the packaged configuration on SIGHUP"
kill -TERM "$daemon_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=""
if [ "$rc" -ne 0 ]; then
  cat "$run/gmuxd.log"
  fail "gmuxd exited with $rc on SIGTERM"
fi
echo "ok: gmuxd stopped on SIGTERM"
echo "PackageTest.Deb passed"
