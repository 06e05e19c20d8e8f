package arbiter_test

import data.arbiter

proc(extra) := object.union({"pid": 100, "comm": "python3", "uid": 1000, "cgroup": {"path": "/user.slice/user-1000.slice/session-1.scope", "slice": "user-1000.slice"}}, extra)

doc(extra) := {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n1", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": proc(extra)}

test_best_effort_by_default if {
	d := arbiter.classify with input as doc({})
	d.class == "best-effort"
	d.preemption.mode == "suspend"
	d.reason == "default: nothing asked for another class"
}

test_pod_label_wins if {
	d := arbiter.classify with input as doc({"pod": {"uid": "u1", "labels": {"arbiter.io/class": "latency-critical"}}, "env": {"ARBITER_CLASS": "best-effort"}})
	d.class == "latency-critical"
	d.reason == "pod label arbiter.io/class"
	d.slo == {"latency_target_ms": 100, "percentile": 99, "window_s": 60}
}

test_env_class if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_CLASS": "latency-critical"}})
	d.class == "latency-critical"
	d.reason == "env ARBITER_CLASS"
}

test_unknown_class_is_ignored if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_CLASS": "gold"}})
	d.class == "best-effort"
}

test_unknown_label_falls_through_to_env if {
	d := arbiter.classify with input as doc({"pod": {"uid": "u", "labels": {"arbiter.io/class": "gold"}}, "env": {"ARBITER_CLASS": "latency-critical"}})
	d.reason == "env ARBITER_CLASS"
}

test_systemd_slice if {
	d := arbiter.classify with input as doc({"cgroup": {"path": "/inference.slice/vllm.service", "slice": "inference.slice"}})
	d.class == "latency-critical"
	d.reason == "systemd slice inference.slice"
}

test_cgroup_naming if {
	d := arbiter.classify with input as doc({"cgroup": {"path": "/latency-critical/triton"}})
	d.class == "latency-critical"
	d.reason == "cgroup /latency-critical/triton"
}

test_similar_names_are_not_lc if {
	d := arbiter.classify with input as doc({"cgroup": {"path": "/lcd/x", "slice": "inferences-batch"}})
	d.class == "best-effort"
}

test_slo_override_env if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_CLASS": "latency-critical", "ARBITER_SLO_MS": "25"}})
	d.slo.latency_target_ms == 25
	d.slo.percentile == 99
}

test_slo_override_label_beats_env if {
	d := arbiter.classify with input as doc({"pod": {"uid": "u", "labels": {"arbiter.io/class": "latency-critical", "arbiter.io/slo-ms": "40"}}, "env": {"ARBITER_SLO_MS": "25"}})
	d.slo.latency_target_ms == 40
}

test_bad_slo_override_ignored if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_CLASS": "latency-critical", "ARBITER_SLO_MS": "fast"}})
	d.slo.latency_target_ms == 100
}

test_out_of_range_slo_override_ignored if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_CLASS": "latency-critical", "ARBITER_SLO_MS": "99999999"}})
	d.class == "latency-critical"
	d.slo.latency_target_ms == 100
}

test_best_effort_gets_no_slo if {
	d := arbiter.classify with input as doc({"env": {"ARBITER_SLO_MS": "25"}})
	not d.slo
}

test_default_decision_is_best_effort if arbiter.default_decision.class == "best-effort"

test_victims_suspend_on_busy_gpu if {
	st := {
		"processes": [
			{"pid": 1, "class": "latency-critical", "priority": 900, "mode": "timeslice", "gpus": [0]},
			{"pid": 2, "class": "best-effort", "priority": 100, "mode": "suspend", "gpus": [0]},
			{"pid": 3, "class": "best-effort", "priority": 100, "mode": "suspend", "gpus": [1]},
		],
		"requests": [{"pid": 1, "gpu": 0}],
	}
	v := arbiter.victims with input as {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "state": st}
	v.suspend == [{"pid": 2, "gpus": [0], "reason": "latency-critical request on a shared GPU"}]
	v.throttle == []
}

test_victims_idle_node if {
	v := arbiter.victims with input as {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "state": {"processes": []}}
	v == {"suspend": [], "throttle": []}
}
