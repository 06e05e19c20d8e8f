package policy

// Decoding runs only on values the schema accepted: every field has the
// type the schema gives it.

func decodeDecision[V any, D document[V]](d D, v V) Decision {
	get := func(v V, k string) (V, bool) { return d.field(v, k) }
	num := func(v V, k string) float64 {
		x, _ := get(v, k)
		f, _ := d.num(x)
		return f
	}
	out := Decision{Preemption: Preemption{Mode: ModeObserve}}
	if c, ok := get(v, "class"); ok {
		out.Class = d.str(c)
	}
	if _, ok := get(v, "priority"); ok {
		out.Priority = int(num(v, "priority"))
	}
	if s, ok := get(v, "slo"); ok {
		out.SLO = &SLO{LatencyTargetMS: num(s, "latency_target_ms"), Percentile: num(s, "percentile"), WindowS: num(s, "window_s")}
	}
	if pr, ok := get(v, "preemption"); ok {
		if m, ok := get(pr, "mode"); ok {
			out.Preemption.Mode = Mode(d.str(m))
		}
		if _, ok := get(pr, "timeslice_us"); ok {
			out.Preemption.TimesliceUS = int(num(pr, "timeslice_us"))
		}
		if x, ok := get(pr, "interleave"); ok {
			out.Preemption.Interleave = d.str(x)
		}
		if x, ok := get(pr, "pre_preemption_hint"); ok {
			out.Preemption.PrePreemptionHint = d.boolean(x)
		}
	}
	if q, ok := get(v, "quota"); ok {
		out.Quota = &Quota{MaxGPUShare: num(q, "max_gpu_share")}
	}
	if obs, ok := get(v, "observe"); ok {
		out.Observe = make([]string, d.size(obs))
		for i := range out.Observe {
			out.Observe[i] = d.str(d.item(obs, i))
		}
	}
	if r, ok := get(v, "reason"); ok {
		out.Reason = d.str(r)
	}
	return out
}

func decodeVictims[V any, D document[V]](d D, v V) VictimDecision {
	num := func(v V, k string) float64 {
		x, _ := d.field(v, k)
		f, _ := d.num(x)
		return f
	}
	str := func(v V, k string) string {
		x, ok := d.field(v, k)
		if !ok {
			return ""
		}
		return d.str(x)
	}
	var out VictimDecision
	if ss, ok := d.field(v, "suspend"); ok {
		out.Suspend = make([]Suspension, d.size(ss))
		for i := range out.Suspend {
			s := d.item(ss, i)
			out.Suspend[i] = Suspension{PID: int(num(s, "pid")), Reason: str(s, "reason")}
			if gs, ok := d.field(s, "gpus"); ok {
				out.Suspend[i].GPUs = make([]int, d.size(gs))
				for j := range out.Suspend[i].GPUs {
					f, _ := d.num(d.item(gs, j))
					out.Suspend[i].GPUs[j] = int(f)
				}
			}
		}
	}
	if ts, ok := d.field(v, "throttle"); ok {
		out.Throttle = make([]Throttle, d.size(ts))
		for i := range out.Throttle {
			t := d.item(ts, i)
			out.Throttle[i] = Throttle{PID: int(num(t, "pid")), MaxGPUShare: num(t, "max_gpu_share"), Reason: str(t, "reason")}
		}
	}
	return out
}
