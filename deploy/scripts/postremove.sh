#!/bin/sh
# Runs after the package is removed or upgraded (deb: remove, purge,
# upgrade, ...; rpm: 0 on erase, 1 on upgrade). systemd forgets the removed
# unit; a deb purge also deletes the daemon's state directory (its
# configuration files are purged by dpkg).
set -e

case "$1" in
remove | purge | 0)
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
		systemctl daemon-reload || true
	fi
	;;
esac
if [ "$1" = purge ]; then
	rm -rf /var/lib/arbiter
fi
exit 0
