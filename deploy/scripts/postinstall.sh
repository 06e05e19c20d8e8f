#!/bin/sh
# Runs after the package is installed or upgraded (deb: configure; rpm: 1
# on install, 2 on upgrade). It never enables, starts or restarts the
# service: installing Arbiter must not change how running applications are
# scheduled. systemd only learns of the new unit file.
set -e

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || true
	if systemctl is-active --quiet arbiter.service; then
		echo "arbiter: the service still runs the previous version; restart it when convenient: systemctl restart arbiter"
	elif ! systemctl is-enabled --quiet arbiter.service 2>/dev/null; then
		echo "arbiter: installed, not enabled; review /etc/arbiter/config.yaml and /etc/arbiter/policy.d, then: systemctl enable --now arbiter"
	fi
fi
exit 0
