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

classify := decision if {
	[class, why] := requested
	decision := object.union(lib.with_reason(lib.classes[class], why), slo_override(class))
} else := default_decision

# requested is the class asked for and who asked, first match wins.
requested := [c, "pod label arbiter.io/class"] if {
	c := lib.label(input.process, "arbiter.io/class")
	known(c, "pod label arbiter.io/class")
} else := [c, "env ARBITER_CLASS"] if {
	c := lib.env(input.process, "ARBITER_CLASS")
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

# slo_override changes a latency-critical target from the pod label
# arbiter.io/slo-ms or the env ARBITER_SLO_MS (milliseconds).
slo_override(class) := {"slo": object.union(lib.classes[class].slo, {"latency_target_ms": ms})} if {
	lib.classes[class].slo
	ms := slo_ms
	ms > 0
} else := {}

slo_ms := to_number(lib.label(input.process, "arbiter.io/slo-ms")) if {
	regex.match(`^[0-9]+(\.[0-9]+)?$`, lib.label(input.process, "arbiter.io/slo-ms"))
} else := to_number(lib.env(input.process, "ARBITER_SLO_MS")) if {
	regex.match(`^[0-9]+(\.[0-9]+)?$`, lib.env(input.process, "ARBITER_SLO_MS"))
}

victims := lib.default_victims(input.state)
