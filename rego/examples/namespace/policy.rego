# METADATA
# title: Classes by Kubernetes namespace
# description: |
#   Each namespace listed in data.json gets a class and, optionally, its own
#   SLO target; pods elsewhere and processes outside Kubernetes are
#   best-effort. The pod label arbiter.io/class still overrides, so a team
#   can opt a single pod out.
package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "not in a listed namespace")

classify := lib.with_reason(lib.classes[c], "pod label arbiter.io/class") if {
	c := lib.label("arbiter.io/class")
	lib.classes[c]
} else := object.union(lib.with_reason(lib.classes[ns.class], sprintf("namespace %s", [name])), overrides(ns)) if {
	name := input.process.pod.namespace
	ns := data.namespaces[name]
} else := default_decision

# overrides applies a namespace's own latency target.
overrides(ns) := {"slo": object.union(lib.classes[ns.class].slo, {"latency_target_ms": ns.latency_target_ms})} if {
	lib.classes[ns.class].slo
	ns.latency_target_ms
} else := {}

victims := lib.default_victims
