# METADATA
# title: Diurnal GPU sharing
# description: |
#   Latency-critical serving keeps its SLO around the clock, but at night
#   (data.yaml: night hours in the node's time zone) traffic is low, so
#   best-effort work gets a bigger GPU-time quota and is throttled less.
#   The clock is input.node.time, so tests choose the hour.
package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "default")

night if lib.in_hours(lib.local_hour(input.node, data.diurnal.timezone), data.diurnal.night_start, data.diurnal.night_end)

period := "night" if night

else := "day"

classify := lib.with_reason(lib.classes[c], "pod label arbiter.io/class") if {
	c := lib.label("arbiter.io/class")
	lib.classes[c]
	c == "latency-critical"
} else := object.union(
	lib.with_reason(lib.classes["best-effort"], sprintf("best-effort, %s quota", [period])),
	{"quota": {"max_gpu_share": data.diurnal.best_effort_share[period]}},
)

victims := {
	"suspend": lib.suspend_on_busy,
	"throttle": lib.throttle_missing(data.diurnal.throttle_share[period]),
}
