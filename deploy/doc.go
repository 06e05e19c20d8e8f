// Package deploy holds the files that install Arbiter on a node: the
// systemd unit (systemd/arbiter.service), the default configuration
// (config.yaml), the package scripts (scripts/) and the package description
// (nfpm.yaml). It has no code; its tests check that the unit passes
// systemd's own checks and agrees with the daemon's configuration defaults.
// The packages themselves are built and tested by internal/dist.
package deploy
