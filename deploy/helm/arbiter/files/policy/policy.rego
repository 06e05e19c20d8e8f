# METADATA
# title: Arbiter default policy
# description: |
#   Best-effort unless told otherwise. A process is latency-critical when
#   its pod has the label arbiter.io/class, its environment has
#   ARBITER_CLASS, or it runs in a systemd slice or cgroup named for
#   inference or latency-critical work. Latency-critical work gets a long
#   timeslice and an SLO of p99 <= 100 ms over 60 s (ARBITER_SLO_MS or the
#   pod label arbiter.io/slo-ms change the target); best-effort work is
#   suspended while a latency-critical request runs on its GPU.
package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "default: nothing asked for another class")

classify := object.union(lib.classes[class], extra(class, why)) if {
	[class, why] := requested
} else := default_decision

# requested is the class asked for and who asked, first match wins.
requested := [c, "pod label arbiter.io/class"] if {
	c := lib.label("arbiter.io/class")
	known(c, "pod label arbiter.io/class")
} else := [c, "env ARBITER_CLASS"] if {
	c := lib.env("ARBITER_CLASS")
	known(c, "env ARBITER_CLASS")
} else := ["latency-critical", sprintf("systemd slice %s", [s])] if {
	s := input.process.cgroup.slice
	regex.match(lc_unit_pattern, s)
} else := ["latency-critical", sprintf("cgroup %s", [p])] if {
	p := input.process.cgroup.path
	some part in split(p, "/")
	regex.match(lc_unit_pattern, part)
}

# Slices and cgroups named like inference.slice, lc-serving.slice,
# latency-critical/ or arbiter-lc.scope are latency-critical.
lc_unit_pattern := `^(arbiter-)?(lc|latency-critical|inference)([-_.].*)?$`

known(c, _) if lib.classes[c]

known(c, who) if {
	not lib.classes[c]
	print(sprintf("ignoring unknown class %q from %s for pid %d", [c, who, input.process.pid]))
	false
}

# extra is what a decision adds to its class template: the reason, and a
# latency target from the pod label arbiter.io/slo-ms or the env
# ARBITER_SLO_MS (milliseconds) for classes with an SLO. One object.union
# per classification keeps evaluation cheap.
extra(class, why) := {"reason": why, "slo": {"latency_target_ms": slo_ms, "percentile": s.percentile, "window_s": s.window_s}} if {
	s := lib.classes[class].slo
	slo_ms > 0
	slo_ms <= 3600000 # the schema's bound: beyond it the decision would be rejected
} else := {"reason": why}

slo_ms := to_number(lib.label("arbiter.io/slo-ms")) if {
	regex.match(`^[0-9]+(\.[0-9]+)?$`, lib.label("arbiter.io/slo-ms"))
} else := to_number(lib.env("ARBITER_SLO_MS")) if {
	regex.match(`^[0-9]+(\.[0-9]+)?$`, lib.env("ARBITER_SLO_MS"))
}

victims := lib.default_victims
