// Package web is the daemon's HTTP face: the JSON API under /api/v1, the
// Server-Sent Events stream of live snapshots and decisions, the health
// and readiness probes, and the Prometheus /metrics endpoint.
//
// Everything it shows comes from the engine's latest immutable snapshot
// (engine.Snapshot), read without locks at request time: no handler ever
// blocks the engine. Policy changes go through the PolicyService the
// daemon supplies, which owns the policy directory and its watcher, so a
// policy posted here takes the same path as one written to disk: loaded,
// checked and tested before it replaces the one in force.
//
// Security: GET requests are open to whoever can reach the listener (the
// Unix socket is root-only; a TCP listener off loopback needs TLS);
// every POST needs the bearer token from the token file, a JSON body under
// the size limit with no unknown field, and passes a rate limit. Every
// response carries a strict Content-Security-Policy. The API returns JSON
// only; a client that renders its strings into HTML must escape them (the
// console does).
//
// The OpenAPI description is openapi.yaml beside this file (served at
// /api/v1/openapi.yaml); docs/api.md is the operator's guide.
package web
