package arbiter_test

import data.arbiter

pod(ns, labels) := {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": {
	"pid": 7, "comm": "python3",
	"pod": {"uid": "0f5e7c0a-1b2c-4d5e-8f90-123456789abc", "namespace": ns, "name": "p", "labels": labels},
}}

test_inference_namespace_with_own_target if {
	d := arbiter.classify with input as pod("inference", {})
	d.class == "latency-critical"
	d.slo.latency_target_ms == 50
	d.reason == "namespace inference"
}

test_listed_namespace_default_target if {
	d := arbiter.classify with input as pod("search-serving", {})
	d.slo.latency_target_ms == 100
}

test_research_is_best_effort if {
	d := arbiter.classify with input as pod("research", {})
	d.class == "best-effort"
	d.reason == "namespace research"
}

test_unlisted_namespace if {
	d := arbiter.classify with input as pod("default", {})
	d.class == "best-effort"
	d.reason == "not in a listed namespace"
}

test_label_overrides_namespace if {
	d := arbiter.classify with input as pod("inference", {"arbiter.io/class": "best-effort"})
	d.class == "best-effort"
}

test_outside_kubernetes if {
	d := arbiter.classify with input as {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": {"pid": 8, "comm": "train"}}
	d.class == "best-effort"
}

test_namespace_from_other_data if {
	d := arbiter.classify with input as pod("batch", {}) with data.namespaces as {"batch": {"class": "latency-critical"}}
	d.class == "latency-critical"
}
