package web

import (
	"bytes"
	"encoding/json"
	"slices"
	"sync"
)

// The delta form of the event stream (GET /events?form=delta) sends the
// whole state once and then only what changed: at 1,000 processes a full
// snapshot event is about 410 KB, while a steady-state delta carries the
// status and the few fields of the few processes that moved.
//
// Every delta client holds the same state: the one the broadcaster last
// published (deltaState). A client that joins is sent that state, not the
// engine's latest, and the next delta turns it into the latest; joining and
// publishing take the same lock, so no client misses a delta or gets one
// twice. Each event carries a sequence number; a delta names the state it
// makes, one past the state it applies to.

// DeltaEvent is the data of a "delta" event: what changed since the
// previous event of the stream (the state numbered Seq-1).
type DeltaEvent struct {
	// Seq numbers the state this delta makes.
	Seq uint64 `json:"seq"`
	// Status is GET /status, whole.
	Status StatusView `json:"status"`
	// Processes are the new processes, whole, and, for each process that
	// changed, its pid and the fields that changed (a field that became
	// empty is sent empty).
	Processes []json.RawMessage `json:"processes,omitempty"`
	// Removed are the pids of the processes that left.
	Removed []uint32 `json:"removed,omitempty"`
	// Classes and GPUs are GET /classes and GET /gpus, whole, when
	// anything in them changed; absent otherwise.
	Classes json.RawMessage `json:"classes,omitempty"`
	GPUs    json.RawMessage `json:"gpus,omitempty"`
}

// deltaStream is the state the delta clients hold, and its sequence.
type deltaStream struct {
	mu sync.Mutex
	// base is what every delta client holds; nil while none is
	// connected, so that the form costs nothing while unused.
	base *deltaState
	seq  uint64
}

// deltaState is one published state of the delta form.
type deltaState struct {
	seq     uint64
	status  StatusView
	procs   []ProcessItem
	byPID   map[uint32]*ProcessItem
	classes []ClassItem
	gpus    []GPUItem
	// classesJSON and gpusJSON are the lists encoded, to compare them.
	classesJSON, gpusJSON []byte
	// event is the state's "snapshot" event, encoded when a client joins.
	event []byte
}

// state builds the delta form's state of v, numbered seq.
func (s *Server) state(v view, seq uint64) (*deltaState, error) {
	st := &deltaState{seq: seq, status: s.status(v), procs: v.processes("", ""), classes: v.classes(), gpus: s.gpus(v)}
	st.byPID = make(map[uint32]*ProcessItem, len(st.procs))
	for i := range st.procs {
		st.byPID[st.procs[i].PID] = &st.procs[i]
	}
	var err error
	if st.classesJSON, err = json.Marshal(st.classes); err != nil {
		return nil, err
	}
	if st.gpusJSON, err = json.Marshal(st.gpus); err != nil {
		return nil, err
	}
	return st, nil
}

// snapshotEvent is the "snapshot" event that starts a delta client at
// this state.
func (st *deltaState) snapshotEvent() ([]byte, error) {
	if st.event != nil {
		return st.event, nil
	}
	b, err := json.Marshal(SnapshotEvent{Seq: st.seq, Status: st.status, Processes: st.procs, Classes: st.classes, GPUs: st.gpus})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	writeEvent(&buf, "snapshot", b)
	st.event = buf.Bytes()
	return st.event, nil
}

// deltaTo writes the "delta" event that turns st into next.
func (st *deltaState) deltaTo(buf *bytes.Buffer, next *deltaState) error {
	ev := DeltaEvent{Seq: next.seq, Status: next.status}
	for i := range next.procs {
		cur := &next.procs[i]
		old := st.byPID[cur.PID]
		if old == nil {
			b, err := json.Marshal(cur)
			if err != nil {
				return err
			}
			ev.Processes = append(ev.Processes, b)
			continue
		}
		if b, changed, err := processDelta(old, cur); err != nil {
			return err
		} else if changed {
			ev.Processes = append(ev.Processes, b)
		}
	}
	for i := range st.procs {
		if pid := st.procs[i].PID; next.byPID[pid] == nil {
			ev.Removed = append(ev.Removed, pid)
		}
	}
	if !bytes.Equal(st.classesJSON, next.classesJSON) {
		ev.Classes = next.classesJSON
	}
	if !bytes.Equal(st.gpusJSON, next.gpusJSON) {
		ev.GPUs = next.gpusJSON
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	writeEvent(buf, "delta", b)
	return nil
}

// processField is one field of ProcessItem as a delta sends it.
type processField struct {
	key   string
	same  func(a, b *ProcessItem) bool
	value func(p *ProcessItem) any
}

// processFields are every JSON field of ProcessItem but the pid, which
// every delta carries; a test keeps the list complete.
var processFields = []processField{
	{"comm", func(a, b *ProcessItem) bool { return a.Comm == b.Comm }, func(p *ProcessItem) any { return p.Comm }},
	{"class", func(a, b *ProcessItem) bool { return a.Class == b.Class }, func(p *ProcessItem) any { return p.Class }},
	{"priority", func(a, b *ProcessItem) bool { return a.Priority == b.Priority }, func(p *ProcessItem) any { return p.Priority }},
	{"reason", func(a, b *ProcessItem) bool { return a.Reason == b.Reason }, func(p *ProcessItem) any { return p.Reason }},
	{"fallback", func(a, b *ProcessItem) bool { return a.Fallback == b.Fallback }, func(p *ProcessItem) any { return p.Fallback }},
	{"level", func(a, b *ProcessItem) bool { return a.Level == b.Level }, func(p *ProcessItem) any { return p.Level }},
	{"planned", func(a, b *ProcessItem) bool { return a.Planned == b.Planned }, func(p *ProcessItem) any { return p.Planned }},
	{"limit", func(a, b *ProcessItem) bool { return a.Limit == b.Limit }, func(p *ProcessItem) any { return p.Limit }},
	{"state", func(a, b *ProcessItem) bool { return a.State == b.State }, func(p *ProcessItem) any { return p.State }},
	{"unmanaged", func(a, b *ProcessItem) bool { return a.Unmanaged == b.Unmanaged }, func(p *ProcessItem) any { return p.Unmanaged }},
	{"unmanaged_reason", func(a, b *ProcessItem) bool { return a.UnmanagedReason == b.UnmanagedReason }, func(p *ProcessItem) any { return p.UnmanagedReason }},
	{"gpus", func(a, b *ProcessItem) bool { return slices.Equal(a.GPUs, b.GPUs) }, func(p *ProcessItem) any { return p.GPUs }},
	{"latency_critical", func(a, b *ProcessItem) bool { return a.LatencyCritical == b.LatencyCritical }, func(p *ProcessItem) any { return p.LatencyCritical }},
	{"launches", func(a, b *ProcessItem) bool { return a.Launches == b.Launches }, func(p *ProcessItem) any { return p.Launches }},
	{"launch_rate", func(a, b *ProcessItem) bool { return a.LaunchRate == b.LaunchRate }, func(p *ProcessItem) any { return p.LaunchRate }},
	{"requests", func(a, b *ProcessItem) bool { return a.Requests == b.Requests }, func(p *ProcessItem) any { return p.Requests }},
	{"p50_seconds", func(a, b *ProcessItem) bool { return a.P50Seconds == b.P50Seconds }, func(p *ProcessItem) any { return p.P50Seconds }},
	{"p99_seconds", func(a, b *ProcessItem) bool { return a.P99Seconds == b.P99Seconds }, func(p *ProcessItem) any { return p.P99Seconds }},
	{"slo_attainment", func(a, b *ProcessItem) bool {
		return (a.Attainment == nil) == (b.Attainment == nil) && (a.Attainment == nil || *a.Attainment == *b.Attainment)
	}, func(p *ProcessItem) any { return p.Attainment }},
	{"latency", func(a, b *ProcessItem) bool { return a.Latency == b.Latency }, func(p *ProcessItem) any { return p.Latency }},
}

// processDelta encodes cur's pid and the fields in which it differs from
// old; changed is false when none does.
func processDelta(old, cur *ProcessItem) (b []byte, changed bool, err error) {
	var buf bytes.Buffer
	for _, f := range processFields {
		if f.same(old, cur) {
			continue
		}
		if !changed {
			buf.WriteString(`{"pid":`)
			pid, _ := json.Marshal(cur.PID)
			buf.Write(pid)
			changed = true
		}
		v, err := json.Marshal(f.value(cur))
		if err != nil {
			return nil, false, err
		}
		buf.WriteString(`,"`)
		buf.WriteString(f.key)
		buf.WriteString(`":`)
		buf.Write(v)
	}
	if !changed {
		return nil, false, nil
	}
	buf.WriteByte('}')
	return buf.Bytes(), true, nil
}
