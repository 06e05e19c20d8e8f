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
			"timeslice_us": 50,
			"interleave": "low",
			"pre_preemption_hint": false,
		},
		"observe": ["launch"],
	},
}

# with_reason returns decision d with its reason set.
with_reason(d, reason) := object.union(d, {"reason": reason})

# label is the pod label key of the process being classified; undefined
# outside a pod. (Helpers read input themselves: passing input.process as an
# argument would make OPA hash the whole process on every call.)
label(key) := input.process.pod.labels[key]

# env is the allowlisted ARBITER_* variable key of the process.
env(key) := input.process.env[key]

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

# The control-loop helpers read input.state and input.node themselves and
# are rules, not functions of the state: OPA evaluates a rule once per
# query, and a 1,000-process state passed as an argument would be hashed on
# every call.

# busy_gpus are the GPUs with a latency-critical request in flight.
busy_gpus := {r.gpu | some r in input.state.requests}

# missing_slo holds when class is below its SLO attainment target.
missing_slo(class) if {
	s := input.state.slo[class]
	s.attainment < s.target
}

# preemptible are the processes the control loop may suspend: those whose
# class asked for suspend or gate.
preemptible := [p |
	some p in input.state.processes
	p.mode in {"suspend", "gate"}
]

# suspend_on_busy suspends every preemptible process on the GPUs where a
# latency-critical request is in flight, on those GPUs only.
suspend_on_busy := [s |
	some p in preemptible
	shared := sort([g | some g in p.gpus; busy_gpus[g]])
	shared != []
	s := {"pid": p.pid, "gpus": shared, "reason": "latency-critical request on a shared GPU"}
]

# missing_classes are the classes below their SLO attainment target.
missing_classes := {c | some c, s in input.state.slo; s.attainment < s.target}

# missing_priority is, per GPU, the highest priority of a class below its
# SLO target running there.
missing_priority[g] := max({x[1] | some x in missing_pairs; x[0] == g}) if some [g, _] in missing_pairs

missing_pairs := {[g, object.get(p, "priority", 0)] |
	some p in input.state.processes
	p.class in missing_classes
	some g in p.gpus
}

# throttled are the timeslice-mode processes sharing a GPU with a
# higher-priority class below its SLO target.
throttled := {p.pid |
	some p in input.state.processes
	p.mode == "timeslice"
	some g in p.gpus
	object.get(p, "priority", 0) < missing_priority[g]
}

# throttle_missing caps the throttled processes at share, each once.
throttle_missing(share) := [t |
	some pid in throttled
	t := {"pid": pid, "max_gpu_share": share, "reason": "shares a GPU with a class below its SLO target"}
]

# default_victims is the control loop most policies want.
default_victims := {
	"suspend": suspend_on_busy,
	"throttle": throttle_missing(0.1),
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

# pinned are the GPUs used by processes the control loop may not suspend.
pinned := {g |
	some p in input.state.processes
	not p.mode in {"suspend", "gate"}
	some g in p.gpus
}

# load is how many preemptible processes use each GPU.
load := {g: count([p | some p in preemptible; g in p.gpus]) | some x in input.node.gpus; g := x.index}

# nvlink_set is the NVLink-connected set of n GPUs, none pinned, whose
# freeing suspends the fewest processes (ties: lowest GPU indexes);
# undefined when the node has no such set.
nvlink_set(n) := best[1] if {
	candidates := {[cost, set] |
		some x in input.node.gpus
		usable := island(input.node, x.index) - pinned
		ordered := sort([[load[g], g] | some g in usable])
		count(ordered) >= n
		set := sort([pair[1] | some pair in array.slice(ordered, 0, n)])
		cost := count({p.pid | some p in preemptible; some g in p.gpus; g in set})
	}
	count(candidates) > 0
	best := min(candidates)
}
