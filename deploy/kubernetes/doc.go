// Package kubernetes holds the checks of Arbiter's Kubernetes deployment:
// the Helm chart in deploy/helm/arbiter, linted and rendered with Helm's
// own code, and the plain manifests beside this file (arbiter.yaml),
// rendered from the chart with its default values and kept current by
// `make manifests`. It has no code of its own.
package kubernetes
