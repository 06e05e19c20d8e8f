#!/bin/sh
# Runs before the package is removed or upgraded (deb: remove, upgrade,
# deconfigure, failed-upgrade; rpm: 0 on erase, 1 on upgrade). On removal it
# stops and disables the service (whose ExecStopPost runs `arbiter recover`)
# and runs `arbiter recover --detach` itself, for a daemon that ran without
# systemd, so that no process is left gated or suspended once the binary is
# gone, and no driver-call tracer left attached with nothing to read it.
# If recover fails the removal fails too, keeping the binary that can
# release them; ARBITER_FORCE_REMOVE=1 removes the package anyway. On
# upgrade it does nothing: the running daemon keeps running.
set -e

case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl stop arbiter.service || true
	systemctl disable arbiter.service >/dev/null 2>&1 || true
fi

if ! arbiter recover --detach; then
	echo "arbiter: 'arbiter recover' failed: processes may still be gated or suspended." >&2
	if [ "${ARBITER_FORCE_REMOVE:-}" = 1 ]; then
		echo "arbiter: removing anyway (ARBITER_FORCE_REMOVE=1)." >&2
		exit 0
	fi
	echo "arbiter: the package stays installed so that its binary can release them: run 'arbiter recover', fix what it reports, and remove the package again (or set ARBITER_FORCE_REMOVE=1 to remove it anyway)." >&2
	exit 1
fi
exit 0
