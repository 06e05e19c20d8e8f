package arbiter_test

import data.arbiter

user(name, uid) := {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": {"pid": 9, "comm": "python3", "uid": uid, "user": name}}

test_serving_team_is_latency_critical if {
	d := arbiter.classify with input as user("alice", 1001)
	d.class == "latency-critical"
	d.reason == "user alice in team serving"
	not d.quota
}

test_research_quota if {
	d := arbiter.classify with input as user("carol", 1003)
	d.class == "best-effort"
	d.quota.max_gpu_share == 0.6
}

test_interns_quota if {
	d := arbiter.classify with input as user("dave", 1004)
	d.quota.max_gpu_share == 0.1
}

test_by_uid_without_name if {
	d := arbiter.classify with input as user("", 2001)
	d.reason == "user  in team research"
	d.quota.max_gpu_share == 0.6
}

test_unknown_user_gets_default_quota if {
	d := arbiter.classify with input as user("mallory", 4242)
	d.class == "best-effort"
	d.quota.max_gpu_share == 0.25
	d.reason == "user in no team"
}

test_default_decision_has_quota if arbiter.default_decision.quota.max_gpu_share == 0.25
