package arbiter.lib_test

import data.arbiter.lib

node := {"hostname": "n1", "time": "2026-01-10T23:30:00Z", "gpus": [
	{"index": 0, "uuid": "GPU-0", "numa_node": 0, "nvlink_peers": [1]},
	{"index": 1, "uuid": "GPU-1", "numa_node": 0, "nvlink_peers": [0]},
	{"index": 2, "uuid": "GPU-2", "numa_node": 1, "nvlink_peers": [3]},
	{"index": 3, "uuid": "GPU-3", "numa_node": 1, "nvlink_peers": [2]},
]}

state := {
	"processes": [
		{"pid": 10, "class": "latency-critical", "priority": 900, "mode": "timeslice", "gpus": [0]},
		{"pid": 20, "class": "best-effort", "mode": "suspend", "gpus": [0, 1]},
		{"pid": 30, "class": "best-effort", "mode": "suspend", "gpus": [2]},
		{"pid": 40, "class": "analytics", "priority": 100, "mode": "timeslice", "gpus": [0]},
	],
	"requests": [{"pid": 10, "gpu": 0}],
	"slo": {"latency-critical": {"attainment": 0.9, "target": 0.99}},
}

test_classes_fit_the_schema_shape if {
	lib.classes["latency-critical"].slo.percentile == 99
	lib.classes["best-effort"].preemption.mode == "suspend"
}

test_with_reason if lib.with_reason({"class": "x"}, "why") == {"class": "x", "reason": "why"}

test_label_and_env if {
	p := {"pod": {"uid": "u", "labels": {"a": "b"}}, "env": {"ARBITER_CLASS": "c"}}
	lib.label("a") == "b" with input.process as p
	lib.env("ARBITER_CLASS") == "c" with input.process as p
	not lib.label("a") with input.process as {"pid": 1, "comm": "x"}
}

test_local_hour if {
	lib.local_hour(node, "UTC") == 23
	lib.local_hour(node, "Asia/Tokyo") == 8
}

test_in_hours if {
	lib.in_hours(23, 22, 6)
	lib.in_hours(3, 22, 6)
	not lib.in_hours(12, 22, 6)
	lib.in_hours(9, 8, 18)
	not lib.in_hours(18, 8, 18)
}

test_busy_and_missing if {
	lib.busy_gpus == {0} with input.state as state
	lib.missing_slo("latency-critical") with input.state as state
	not lib.missing_slo("best-effort") with input.state as state
}

test_suspend_on_busy if {
	lib.suspend_on_busy == [{"pid": 20, "gpus": [0], "reason": "latency-critical request on a shared GPU"}] with input.state as state
}

test_throttle_missing if {
	lib.throttle_missing(0.2) == [{"pid": 40, "max_gpu_share": 0.2, "reason": "shares a GPU with a class below its SLO target"}] with input.state as state
}

test_default_victims if {
	v := lib.default_victims with input.state as state
	count(v.suspend) == 1
	count(v.throttle) == 1
}

test_islands_of_pairs if {
	lib.island(node, 0) == {0, 1}
	lib.island(node, 3) == {2, 3}
}

test_island_all_to_all if {
	nvswitch := {"gpus": [{"index": i, "uuid": "g", "nvlink_peers": [p | some p in numbers.range(0, 3); p != i]} | some i in numbers.range(0, 3)]}
	lib.island(nvswitch, 2) == {0, 1, 2, 3}
}

test_nvlink_set_picks_least_loaded if {
	# GPU 0 is pinned by latency-critical pid 10, so the pair 0-1 is out.
	lib.nvlink_set(2) == [2, 3] with input as {"node": node, "state": state}
	lib.nvlink_set(1) == [3] with input as {"node": node, "state": state}
	not lib.nvlink_set(3) with input as {"node": node, "state": state}
}

test_pinned if lib.pinned == {0} with input.state as state
