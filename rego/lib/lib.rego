# METADATA
# title: Arbiter helper library
# description: |
#   Helpers shared by every Arbiter policy. Import it with
#   `import data.arbiter.lib`; the policy loader adds this file to any
#   policy that does not bring its own package arbiter.lib.
package arbiter.lib

# classes are the decision templates of the built-in SLO classes. Policies
# start from one and override fields with object.union.
classes := {
	"latency-critical": {
		"class": "latency-critical",
		"priority": 900,
		"slo": {"latency_target_ms": 100, "percentile": 99, "window_s": 60},
		"preemption": {
			"mode": "timeslice",
			"timeslice_us": 16000,
			"interleave": "high",
			"pre_preemption_hint": true,
		},
		"observe": ["launch", "copy", "sync"],
	},
	"best-effort": {
		"class": "best-effort",
		"priority": 100,
		"preemption": {
			"mode": "suspend",
			"timeslice_us": 200,
			"interleave": "low",
			"pre_preemption_hint": false,
		},
		"observe": ["launch"],
	},
}

# with_reason returns decision d with its reason set.
with_reason(d, reason) := object.union(d, {"reason": reason})

# label is pod label key of process p; undefined outside a pod.
label(p, key) := p.pod.labels[key]

# env is the allowlisted ARBITER_* variable key of process p.
env(p, key) := p.env[key]

# local_hour is the hour (0..23) of the node's clock in time zone tz.
local_hour(node, tz) := time.clock([time.parse_rfc3339_ns(node.time), tz])[0]

# in_hours holds when hour h is in [start, end), wrapping past midnight.
in_hours(h, start, end) if {
	start <= end
	h >= start
	h < end
}

in_hours(h, start, end) if {
	start > end
	h >= start
}

in_hours(h, start, end) if {
	start > end
	h < end
}

# busy_gpus are the GPUs with a latency-critical request in flight.
busy_gpus(state) := {r.gpu | some r in state.requests}

# missing_slo holds when class is below its SLO attainment target.
missing_slo(state, class) if {
	s := state.slo[class]
	s.attainment < s.target
}

# preemptible are the processes the control loop may suspend: those whose
# class asked for suspend or gate.
preemptible(state) := [p |
	some p in state.processes
	p.mode in {"suspend", "gate"}
]

# suspend_on_busy suspends every preemptible process on the GPUs where a
# latency-critical request is in flight, on those GPUs only.
suspend_on_busy(state) := [s |
	some p in preemptible(state)
	shared := {g | some g in p.gpus; g in busy_gpus(state)}
	count(shared) > 0
	s := {"pid": p.pid, "gpus": sort(shared), "reason": sprintf("latency-critical request on GPU %v", [sort(shared)])}
]

# throttle_missing caps at share the timeslice-mode processes that share a
# GPU with a higher-priority class below its SLO target, each process once.
throttle_missing(state, share) := [t |
	some pid in throttled(state)
	t := {"pid": pid, "max_gpu_share": share, "reason": "shares a GPU with a class below its SLO target"}
]

throttled(state) := {p.pid |
	some p in state.processes
	p.mode == "timeslice"
	some q in state.processes
	object.get(p, "priority", 0) < object.get(q, "priority", 0)
	missing_slo(state, q.class)
	some g in p.gpus
	g in q.gpus
}

# default_victims is the control loop most policies want.
default_victims(state) := {
	"suspend": suspend_on_busy(state),
	"throttle": throttle_missing(state, 0.1),
}

# peers is GPU g's set of NVLink peers.
peers(node, g) := {p | some x in node.gpus; x.index == g; some p in x.nvlink_peers}

# island is GPU g with those of its NVLink peers that are also peers of
# each other: a set of GPUs where every pair is NVLink-connected.
island(node, g) := {g} | {p |
	some p in peers(node, g)
	every q in peers(node, g) {
		nvlinked(node, p, q)
	}
}

nvlinked(_, p, p)

nvlinked(node, p, q) if q in peers(node, p)

# load is how many preemptible processes use GPU g.
load(state, g) := count([p | some p in preemptible(state); g in p.gpus])

# pinned are the GPUs used by processes the control loop may not suspend.
pinned(state) := {g |
	some p in state.processes
	not p.mode in {"suspend", "gate"}
	some g in p.gpus
}

# nvlink_set is the NVLink-connected set of n GPUs, none pinned, whose
# freeing suspends the fewest processes (ties: lowest GPU indexes);
# undefined when the node has no such set.
nvlink_set(node, state, n) := best[1] if {
	candidates := {[cost, set] |
		some x in node.gpus
		usable := island(node, x.index) - pinned(state)
		ordered := sort([[load(state, g), g] | some g in usable])
		count(ordered) >= n
		set := sort([pair[1] | some pair in array.slice(ordered, 0, n)])
		cost := count({p.pid | some p in preemptible(state); some g in p.gpus; g in set})
	}
	count(candidates) > 0
	best := min(candidates)
}
