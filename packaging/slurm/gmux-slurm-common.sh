# Sourced by gmux's Slurm scripts: reads their configuration (gmux-slurm.conf).
gmux_conf=${GMUX_SLURM_CONF:-}
if [ -z "$gmux_conf" ]; then
  gmux_conf="$(dirname "$0")/gmux-slurm.conf"
  [ -r "$gmux_conf" ] || gmux_conf=/etc/gmux/slurm.conf
fi
# shellcheck disable=SC1090
[ -r "$gmux_conf" ] && . "$gmux_conf"
GMUX=${GMUX:-gmux}
GMUX_SOCKET=${GMUX_SOCKET:-/run/gmux/gmuxd.sock}
