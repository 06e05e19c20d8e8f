package web

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestProcessFieldsComplete: a delta can carry every JSON field of
// ProcessItem; a field added to it and not to processFields would never
// reach a delta client.
func TestProcessFieldsComplete(t *testing.T) {
	var want []string
	rt := reflect.TypeFor[ProcessItem]()
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name != "pid" {
			want = append(want, name)
		}
	}
	var have []string
	for _, f := range processFields {
		have = append(have, f.key)
	}
	slices.Sort(want)
	slices.Sort(have)
	if !slices.Equal(want, have) {
		t.Errorf("processFields has %v;\nProcessItem's JSON fields are %v", have, want)
	}
}

// TestProcessDeltaApplies: replacing the client's fields with a delta's,
// as the console does, gives exactly the new item, whichever fields
// changed, including to empty values and to null; an unchanged item has
// no delta.
func TestProcessDeltaApplies(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		old := randomItem(rng)
		cur := old
		cur.GPUs = slices.Clone(old.GPUs)
		if i%10 != 0 {
			mutate(rng, &cur)
		}
		b, changed, err := processDelta(&old, &cur)
		if err != nil {
			t.Fatal(err)
		}
		if changed != !reflect.DeepEqual(old, cur) {
			t.Fatalf("changed %v for\n%+v\n%+v", changed, old, cur)
		}
		if !changed {
			continue
		}
		got := applyJSON(t, mustJSON(t, old), b)
		if !reflect.DeepEqual(got, cur) {
			t.Fatalf("delta %s applied to\n%+v\ngives\n%+v\nwant\n%+v", b, old, got, cur)
		}
		if len(b) >= len(mustJSON(t, cur)) && i%10 != 0 && countChanged(old, cur) < 3 {
			t.Errorf("delta of %d fields is %d bytes, no smaller than the item: %s", countChanged(old, cur), len(b), b)
		}
	}
}

func randomItem(rng *rand.Rand) ProcessItem {
	p := ProcessItem{PID: rng.Uint32N(100000), Comm: "train", Class: "best-effort", Priority: 100, Level: sched.LevelSuspend,
		Planned: sched.LevelSuspend, State: "running", GPUs: []int{0}, Launches: rng.Uint64N(1e6)}
	for range 4 {
		mutate(rng, &p)
	}
	return p
}

// mutate changes one field of p at random, sometimes to its zero value.
func mutate(rng *rand.Rand, p *ProcessItem) {
	zero := rng.IntN(4) == 0
	str := func() string {
		if zero {
			return ""
		}
		return []string{"a", "<b>", "gate instead of suspend", "ü"}[rng.IntN(4)]
	}
	switch rng.IntN(20) {
	case 0:
		p.Comm = str()
	case 1:
		p.Class = str()
	case 2:
		p.Priority = rng.IntN(1000)
	case 3:
		p.Reason = str()
	case 4:
		p.Fallback = str()
	case 5:
		p.Level = sched.Level(rng.IntN(4))
	case 6:
		p.Planned = sched.Level(rng.IntN(4))
	case 7:
		p.Limit = str()
	case 8:
		p.State = []string{"running", "suspended", "gated"}[rng.IntN(3)]
	case 9:
		p.Unmanaged = !p.Unmanaged
	case 10:
		p.UnmanagedReason = str()
	case 11:
		p.GPUs = []int{}
		if !zero {
			p.GPUs = append(p.GPUs, rng.IntN(8), 8+rng.IntN(8))
		}
	case 12:
		p.LatencyCritical = !p.LatencyCritical
	case 13:
		p.Launches += rng.Uint64N(100) + 1
	case 14:
		p.LaunchRate = rng.Float64() * 1000
	case 15:
		p.Requests++
	case 16:
		p.P50Seconds = rng.Float64()
	case 17:
		p.P99Seconds = rng.Float64()
	case 18:
		if zero {
			p.Attainment = nil
		} else {
			a := rng.Float64()
			p.Attainment = &a
		}
	case 19:
		p.Latency = engine.LatencyView{Requests: rng.Uint64N(100), Active: !zero && rng.IntN(2) == 0, P99: time.Duration(rng.IntN(1e6)),
			HasSLO: !zero, WindowRequests: 3, Attainment: rng.Float64()}
	}
}

func countChanged(a, b ProcessItem) int {
	n := 0
	for _, f := range processFields {
		if !f.same(&a, &b) {
			n++
		}
	}
	return n
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applyJSON replaces item's top-level fields with delta's, as the console
// does (Object.assign), and decodes the result.
func applyJSON(t *testing.T, item, delta []byte) ProcessItem {
	t.Helper()
	var m, d map[string]json.RawMessage
	if err := json.Unmarshal(item, &m); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(delta, &d); err != nil {
		t.Fatalf("delta %s: %v", delta, err)
	}
	for k, v := range d {
		m[k] = v
	}
	var out ProcessItem
	if err := json.Unmarshal(mustJSON(t, m), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// deltaClient is the state a delta-form client holds, built from the
// stream's events as the console builds it.
type deltaClient struct {
	seq     uint64
	status  StatusView
	procs   map[uint32]json.RawMessage
	classes json.RawMessage
	gpus    json.RawMessage
}

func (c *deltaClient) snapshot(t *testing.T, data string) {
	t.Helper()
	var ev struct {
		Seq       uint64            `json:"seq"`
		Status    StatusView        `json:"status"`
		Processes []json.RawMessage `json:"processes"`
		Classes   json.RawMessage   `json:"classes"`
		GPUs      json.RawMessage   `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Seq == 0 || ev.Classes == nil || ev.GPUs == nil {
		t.Fatalf("delta form's snapshot without seq, classes or gpus: %.300s", data)
	}
	c.seq, c.status, c.classes, c.gpus = ev.Seq, ev.Status, ev.Classes, ev.GPUs
	c.procs = map[uint32]json.RawMessage{}
	for _, p := range ev.Processes {
		c.procs[pidOf(t, p)] = p
	}
}

func (c *deltaClient) delta(t *testing.T, data string) {
	t.Helper()
	var ev DeltaEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Seq != c.seq+1 {
		t.Fatalf("delta %d after state %d", ev.Seq, c.seq)
	}
	c.seq, c.status = ev.Seq, ev.Status
	for _, p := range ev.Processes {
		pid := pidOf(t, p)
		if old, ok := c.procs[pid]; ok {
			c.procs[pid] = mustJSON(t, applyJSON(t, old, p))
		} else {
			c.procs[pid] = p
		}
	}
	for _, pid := range ev.Removed {
		if _, ok := c.procs[pid]; !ok {
			t.Fatalf("delta %d removes pid %d, which the client does not hold", ev.Seq, pid)
		}
		delete(c.procs, pid)
	}
	if ev.Classes != nil {
		c.classes = ev.Classes
	}
	if ev.GPUs != nil {
		c.gpus = ev.GPUs
	}
}

// processes is the client's process list, in pid order.
func (c *deltaClient) processes(t *testing.T) []ProcessItem {
	t.Helper()
	var out []ProcessItem
	for _, b := range c.procs {
		var p ProcessItem
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b ProcessItem) int { return int(a.PID) - int(b.PID) })
	return out
}

func pidOf(t *testing.T, b json.RawMessage) uint32 {
	t.Helper()
	var p struct {
		PID *uint32 `json:"pid"`
	}
	if err := json.Unmarshal(b, &p); err != nil || p.PID == nil {
		t.Fatalf("process without pid: %s (%v)", b, err)
	}
	return *p.PID
}

// TestEventStreamDelta: a client of the delta form that applies every
// delta to the snapshot it started from holds, at each state, exactly
// what a full-form client is sent for the same engine snapshot, while
// processes change, arrive and leave; a second delta client that joins
// later converges too; steady-state deltas are a small fraction of a
// full snapshot.
func TestEventStreamDelta(t *testing.T) {
	f := newFixture(t, 300, Limits{SnapshotInterval: 30 * time.Millisecond, Heartbeat: time.Hour, StreamBuffer: 1024})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(query string) <-chan sseEvent {
		resp, ch := openStream(t, ctx, ts.URL, query)
		t.Cleanup(func() { resp.Body.Close() })
		return ch
	}
	fullCh := open("")
	deltaCh := open("?form=delta")

	// full keeps the processes of each full snapshot by engine time.
	full := map[uint64][]ProcessItem{}
	readFull := func(ev sseEvent) {
		var s SnapshotEvent
		if err := json.Unmarshal([]byte(ev.data), &s); err != nil {
			t.Fatal(err)
		}
		if s.Seq != 0 || s.Classes != nil {
			t.Errorf("the full form's snapshot carries delta fields: seq %d", s.Seq)
		}
		full[s.Status.EngineTime] = s.Processes
	}
	var c deltaClient
	c.snapshot(t, next(t, deltaCh, "snapshot").data)

	// The engine changes: launches everywhere, requests, new processes and
	// processes that leave.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			f.eng.src.push(launchEv(uint32(1000 + i%300)))
			switch {
			case i%15 == 0:
				f.eng.src.push(execEv(uint32(5000+i), "newcomer"), launchEv(uint32(5000+i)))
			case i%15 == 7:
				f.eng.src.push(trace.Event{Kind: trace.KindExit, PID: uint32(5000 + i - 7), TID: uint32(5000 + i - 7)})
			case i%25 == 3:
				f.eng.requests(300, 1)
			}
		}
	}()

	var sizes []int
	compared := 0
	var late *deltaClient
	var lateCh <-chan sseEvent
	for deadline := time.Now().Add(20 * time.Second); compared < 30; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d states compared in 20 s", compared)
		}
		select {
		case ev := <-fullCh:
			if ev.typ == "snapshot" {
				readFull(ev)
			}
			continue
		case ev := <-deltaCh:
			if ev.typ != "delta" {
				continue
			}
			c.delta(t, ev.data)
			sizes = append(sizes, len(ev.data))
		}
		if compared == 10 && late == nil {
			late, lateCh = &deltaClient{}, open("?form=delta")
			late.snapshot(t, next(t, lateCh, "snapshot").data)
		}
		// The full form is encoded first: its snapshot of the same state
		// is already on its way.
		want, ok := fullFor(t, fullCh, full, readFull, c.status.EngineTime)
		if !ok {
			continue
		}
		if got := c.processes(t); !reflect.DeepEqual(got, want) {
			t.Fatalf("state %d (engine time %d): the delta client holds %d processes, the full form sent %d; first difference: %s",
				c.seq, c.status.EngineTime, len(got), len(want), firstDiff(got, want))
		}
		checkLists(t, f, &c)
		compared++
	}
	close(stop)
	<-done
	// Both clients get the same deltas: the one behind catches up.
	for late.seq != c.seq {
		if late.seq < c.seq {
			late.delta(t, next(t, lateCh, "delta").data)
		} else {
			c.delta(t, next(t, deltaCh, "delta").data)
		}
	}
	if late.seq != c.seq || !reflect.DeepEqual(late.processes(t), c.processes(t)) {
		t.Errorf("the late client is at state %d with %d processes; the first at %d with %d", late.seq, len(late.procs), c.seq, len(c.procs))
	}
	fullSize := len(mustJSON(t, SnapshotEvent{Processes: c.processes(t), Status: c.status}))
	slices.Sort(sizes)
	if median := sizes[len(sizes)/2]; median*5 > fullSize {
		t.Errorf("median delta %d bytes against %d for a full snapshot", median, fullSize)
	}
	t.Logf("%d states compared; deltas %d–%d bytes (median %d), a full snapshot %d bytes", compared, sizes[0], sizes[len(sizes)-1], sizes[len(sizes)/2], fullSize)
}

// fullFor returns the full form's processes at engine time et, reading
// the full stream a little if they have not arrived yet.
func fullFor(t *testing.T, ch <-chan sseEvent, full map[uint64][]ProcessItem, read func(sseEvent), et uint64) ([]ProcessItem, bool) {
	t.Helper()
	timeout := time.After(2 * time.Second)
	for {
		if p, ok := full[et]; ok {
			return p, true
		}
		select {
		case ev := <-ch:
			if ev.typ == "snapshot" {
				read(ev)
			}
		case <-timeout:
			return nil, false // the client's first state: no full event was published for it
		}
	}
}

// checkLists: the classes and GPUs the delta client holds have the shape
// of GET /classes and GET /gpus.
func checkLists(t *testing.T, f *fixture, c *deltaClient) {
	t.Helper()
	var classes []ClassItem
	var gpus []GPUItem
	if err := json.Unmarshal(c.classes, &classes); err != nil || len(classes) == 0 {
		t.Fatalf("classes %s: %v", c.classes, err)
	}
	if err := json.Unmarshal(c.gpus, &gpus); err != nil || len(gpus) != 2 {
		t.Fatalf("gpus %s: %v", c.gpus, err)
	}
	members := 0
	for _, cl := range classes {
		members += cl.Members
	}
	if members != len(c.procs) {
		t.Errorf("state %d: classes count %d members, the client holds %d processes", c.seq, members, len(c.procs))
	}
}

func firstDiff(got, want []ProcessItem) string {
	for i := range min(len(got), len(want)) {
		if !reflect.DeepEqual(got[i], want[i]) {
			g, _ := json.Marshal(got[i])
			w, _ := json.Marshal(want[i])
			return string(g) + "\nwant " + string(w)
		}
	}
	return "lengths differ"
}

// TestEventStreamForm: an unknown form is refused with the forms there
// are.
func TestEventStreamForm(t *testing.T) {
	f := newFixture(t, 3, Limits{})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/api/v1/events?form=compact")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body apiError
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.Error, `"compact"`) || !strings.Contains(body.Error, "delta") {
		t.Errorf("form=compact: %d %q", resp.StatusCode, body.Error)
	}
}
