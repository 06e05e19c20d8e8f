# METADATA
# title: Topology-aware victim selection
# description: |
#   A latency-critical job that needs several GPUs wants them NVLink-connected.
#   When one is waiting (input.state.demands), free the NVLink-connected set
#   of GPUs whose freeing suspends the fewest best-effort processes, and
#   suspend those processes on exactly those GPUs. Otherwise, the default
#   control loop.
package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "default")

classify := lib.with_reason(lib.classes[c], "pod label arbiter.io/class") if {
	c := lib.label("arbiter.io/class")
	lib.classes[c]
} else := default_decision

# The first waiting multi-GPU demand, by pid, is served first.
demand := min({[d.pid, d] | some d in input.state.demands; d.gpus_needed > 1; d.nvlink})[1]

target := lib.nvlink_set(demand.gpus_needed)

victims := {"suspend": freeing, "throttle": []} if {
	target
} else := lib.default_victims

freeing := [s |
	some p in lib.preemptible
	on := {g | some g in p.gpus; g in target}
	count(on) > 0
	s := {"pid": p.pid, "gpus": sort(on), "reason": sprintf("free NVLink GPUs %v for pid %d", [target, demand.pid])}
]
