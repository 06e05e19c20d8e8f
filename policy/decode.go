package policy

import "github.com/gpu-arbiter/arbiter/policy/schema"

// Decoding runs only on values the schema accepted: every field has the
// type the schema gives it.

func decodeDecision[V any, D schema.Document[V]](d D, v V) Decision {
	get := func(v V, k string) (V, bool) { return d.Field(v, k) }
	num := func(v V, k string) float64 {
		x, _ := get(v, k)
		f, _ := d.Num(x)
		return f
	}
	out := Decision{Preemption: Preemption{Mode: ModeObserve}}
	if c, ok := get(v, "class"); ok {
		out.Class = d.Str(c)
	}
	if _, ok := get(v, "priority"); ok {
		out.Priority = int(num(v, "priority"))
	}
	if s, ok := get(v, "slo"); ok {
		out.SLO = &SLO{LatencyTargetMS: num(s, "latency_target_ms"), Percentile: num(s, "percentile"), WindowS: num(s, "window_s")}
	}
	if pr, ok := get(v, "preemption"); ok {
		if m, ok := get(pr, "mode"); ok {
			out.Preemption.Mode = Mode(d.Str(m))
		}
		if _, ok := get(pr, "timeslice_us"); ok {
			out.Preemption.TimesliceUS = int(num(pr, "timeslice_us"))
		}
		if x, ok := get(pr, "interleave"); ok {
			out.Preemption.Interleave = d.Str(x)
		}
		if x, ok := get(pr, "pre_preemption_hint"); ok {
			out.Preemption.PrePreemptionHint = d.Bool(x)
		}
	}
	if q, ok := get(v, "quota"); ok {
		out.Quota = &Quota{MaxGPUShare: num(q, "max_gpu_share")}
	}
	if obs, ok := get(v, "observe"); ok {
		out.Observe = make([]string, d.Size(obs))
		for i := range out.Observe {
			out.Observe[i] = d.Str(d.Item(obs, i))
		}
	}
	if r, ok := get(v, "reason"); ok {
		out.Reason = d.Str(r)
	}
	return out
}

func decodeVictims[V any, D schema.Document[V]](d D, v V) VictimDecision {
	num := func(v V, k string) float64 {
		x, _ := d.Field(v, k)
		f, _ := d.Num(x)
		return f
	}
	str := func(v V, k string) string {
		x, ok := d.Field(v, k)
		if !ok {
			return ""
		}
		return d.Str(x)
	}
	var out VictimDecision
	if ss, ok := d.Field(v, "suspend"); ok {
		out.Suspend = make([]Suspension, d.Size(ss))
		for i := range out.Suspend {
			s := d.Item(ss, i)
			out.Suspend[i] = Suspension{PID: int(num(s, "pid")), Reason: str(s, "reason")}
			if gs, ok := d.Field(s, "gpus"); ok {
				out.Suspend[i].GPUs = make([]int, d.Size(gs))
				for j := range out.Suspend[i].GPUs {
					f, _ := d.Num(d.Item(gs, j))
					out.Suspend[i].GPUs[j] = int(f)
				}
			}
		}
	}
	if ts, ok := d.Field(v, "throttle"); ok {
		out.Throttle = make([]Throttle, d.Size(ts))
		for i := range out.Throttle {
			t := d.Item(ts, i)
			out.Throttle[i] = Throttle{PID: int(num(t, "pid")), MaxGPUShare: num(t, "max_gpu_share"), Reason: str(t, "reason")}
		}
	}
	return out
}
