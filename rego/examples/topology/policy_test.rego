package arbiter_test

import data.arbiter

# An 8-GPU node with two NVLink islands of four (0-3 and 4-7).
gpus := [{"index": i, "uuid": sprintf("GPU-%d", [i]), "numa_node": floor(i / 4), "nvlink_peers": [p | some p in island(i); p != i]} | some i in numbers.range(0, 7)]

island(i) := numbers.range(0, 3) if i < 4

else := numbers.range(4, 7)

node := {"hostname": "dgx", "time": "2026-01-10T12:00:00Z", "gpus": gpus}

be(pid, g) := {"pid": pid, "class": "best-effort", "priority": 100, "mode": "suspend", "gpus": g}

state(demands) := {
	"processes": [be(11, [0]), be(12, [1]), be(13, [2]), be(14, [5]), be(15, [6, 7])],
	"requests": [],
	"demands": demands,
}

input_for(demands) := {"apiVersion": "arbiter.io/v1", "node": node, "state": state(demands)}

test_frees_the_cheaper_island if {
	v := arbiter.victims with input as input_for([{"pid": 99, "class": "latency-critical", "gpus_needed": 4, "nvlink": true}])

	# island 4-7 costs 2 processes (14, 15); island 0-3 costs 3.
	v.suspend == [
		{"pid": 14, "gpus": [5], "reason": "free NVLink GPUs [4, 5, 6, 7] for pid 99"},
		{"pid": 15, "gpus": [6, 7], "reason": "free NVLink GPUs [4, 5, 6, 7] for pid 99"},
	]
}

test_two_gpus_prefer_idle_ones if {
	doc := input_for([{"pid": 99, "gpus_needed": 2, "nvlink": true}])

	# GPU 3 is idle and NVLinked to 0; 4 is idle and NVLinked to 5: equal
	# cost, lowest indexes win.
	arbiter.target == [0, 3] with input as doc
	v := arbiter.victims with input as doc
	v.suspend == [{"pid": 11, "gpus": [0], "reason": "free NVLink GPUs [0, 3] for pid 99"}]
}

test_no_set_large_enough_falls_back if {
	v := arbiter.victims with input as input_for([{"pid": 99, "gpus_needed": 5, "nvlink": true}])
	v == {"suspend": [], "throttle": []}
}

test_single_gpu_demand_is_default_loop if {
	v := arbiter.victims with input as input_for([{"pid": 99, "gpus_needed": 1}])
	v == {"suspend": [], "throttle": []}
}

test_classify_by_label if {
	d := arbiter.classify with input as {"apiVersion": "arbiter.io/v1", "node": node, "process": {"pid": 3, "comm": "x", "pod": {"uid": "u", "labels": {"arbiter.io/class": "latency-critical"}}}}
	d.class == "latency-critical"
}

test_unlabelled_process_is_best_effort if {
	d := arbiter.classify with input as {"apiVersion": "arbiter.io/v1", "node": node, "process": {"pid": 4, "comm": "train"}}
	d.class == "best-effort"
	d.reason == "default"
}
