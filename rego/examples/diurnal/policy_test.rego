package arbiter_test

import data.arbiter

at(t, labels) := {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": t, "gpus": []}, "process": {"pid": 5, "comm": "train", "pod": {"uid": "u", "labels": labels}}}

test_day_quota if {
	# 15:00 UTC is 10:00 in New York
	d := arbiter.classify with input as at("2026-01-10T15:00:00Z", {})
	d.quota.max_gpu_share == 0.2
	d.reason == "best-effort, day quota"
}

test_night_quota if {
	# 04:00 UTC is 23:00 in New York
	d := arbiter.classify with input as at("2026-01-11T04:00:00Z", {})
	d.quota.max_gpu_share == 0.8
}

test_night_after_midnight if {
	d := arbiter.classify with input as at("2026-01-11T07:30:00Z", {})
	d.quota.max_gpu_share == 0.8
}

test_morning_is_day if {
	d := arbiter.classify with input as at("2026-01-11T11:00:00Z", {})
	d.quota.max_gpu_share == 0.2
}

test_latency_critical_any_time if {
	d := arbiter.classify with input as at("2026-01-11T04:00:00Z", {"arbiter.io/class": "latency-critical"})
	d.class == "latency-critical"
	not d.quota
}

test_throttle_share_follows_the_clock if {
	st := {
		"processes": [
			{"pid": 1, "class": "latency-critical", "priority": 900, "mode": "timeslice", "gpus": [0]},
			{"pid": 2, "class": "best-effort", "priority": 100, "mode": "timeslice", "gpus": [0]},
		],
		"slo": {"latency-critical": {"attainment": 0.5, "target": 0.99}},
	}
	day := arbiter.victims with input as {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T15:00:00Z", "gpus": []}, "state": st}
	night := arbiter.victims with input as {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-11T04:00:00Z", "gpus": []}, "state": st}
	day.throttle[0].max_gpu_share == 0.05
	night.throttle[0].max_gpu_share == 0.3
	count(day.throttle) == 1
}
