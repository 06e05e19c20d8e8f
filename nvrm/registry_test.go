package nvrm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/trace"
)

// Event builders for registry tests.
func evAlloc(pid uint32, fd int32, client, parent, obj uint32, cls Class, engine EngineType, value uint64) trace.Event {
	return trace.Event{Kind: trace.KindRMAlloc, PID: pid, RM: trace.RM{FD: fd, Client: client, Parent: parent, Object: obj, Class: uint32(cls), EngineType: uint32(engine), Value: value}}
}

func evFree(pid, client, parent, obj uint32) trace.Event {
	return trace.Event{Kind: trace.KindRMFree, PID: pid, RM: trace.RM{Client: client, Parent: parent, Object: obj}}
}

func evControl(pid, client, obj uint32, cmd Control, value uint64) trace.Event {
	return trace.Event{Kind: trace.KindRMControl, PID: pid, RM: trace.RM{Client: client, Object: obj, Cmd: uint32(cmd), Value: value}}
}

// cudaContext is the allocation sequence of one CUDA context on GPU gpu:
// client C, device D, subdevice, VA space (not kept), a compute group G
// with two channels and a copy group.
func cudaContext(pid uint32, fd int32, c, gpu uint32) []trace.Event {
	d, g := c+0x10, c+0x20
	return []trace.Event{
		evAlloc(pid, fd, c, 0, c, ClassRootClient, 0, 0),
		evAlloc(pid, fd, c, c, d, ClassDevice, 0, uint64(gpu)),
		evAlloc(pid, fd, c, d, d+1, ClassSubdevice, 0, 0),
		evAlloc(pid, fd, c, d, d+2, ClassVASpace, 0, 0),
		evAlloc(pid, fd, c, d, g, ClassChannelGroup, EngineGraphics, 0),
		evAlloc(pid, fd, c, g, g+1, ClassContextShare, 0, 0),
		evAlloc(pid, fd, c, g, g+2, ClassHopperGPFIFO, 0, 0),
		evAlloc(pid, fd, c, g, g+3, ClassHopperGPFIFO, 0, 0),
		evAlloc(pid, fd, c, g+2, g+4, ClassHopperCompute, 0, 0),
		evAlloc(pid, fd, c, d, g+8, ClassChannelGroup, EngineCopy0, 0),
		evControl(pid, c, g, CtrlSetTimeslice, 1024),
		evControl(pid, c, g, CtrlGPFIFOSchedule, 1),
	}
}

// liveStart pretends every pid in alive runs, started at its value.
func liveStart(alive map[uint32]uint64) func(uint32) uint64 {
	return func(pid uint32) uint64 { return alive[pid] }
}

func newTestRegistry(t testing.TB, state string, alive map[uint32]uint64) *Registry {
	t.Helper()
	r, err := NewRegistry(&RegistryOptions{StatePath: state, StartTime: liveStart(alive)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func applyAll(r *Registry, evs []trace.Event) {
	for i := range evs {
		r.Apply(&evs[i])
	}
}

func TestRegistryTree(t *testing.T) {
	r := newTestRegistry(t, "", map[uint32]uint64{100: 5})
	applyAll(r, cudaContext(100, 7, 0xC1D00001, 2))
	p, err := r.Process(100)
	if err != nil {
		t.Fatal(err)
	}
	if p.StartTime != 5 || len(p.Clients) != 1 {
		t.Fatalf("process: %+v", p)
	}
	c := p.Clients[0]
	if c.Handle != 0xC1D00001 || c.FD != 7 || len(c.Devices) != 1 {
		t.Fatalf("client: %+v", c)
	}
	d := c.Devices[0]
	if d.Handle != 0xC1D00011 || d.Instance != 2 || len(d.Subdevices) != 1 || d.Subdevices[0] != 0xC1D00012 || len(d.Groups) != 2 {
		t.Fatalf("device: %+v", d)
	}
	g := d.Groups[0]
	want := Group{Client: 0xC1D00001, Device: 0xC1D00011, Handle: 0xC1D00021, FD: 7, Instance: 2, Engine: EngineGraphics,
		Timeslice: 1024, TimesliceBy: "process", Interleave: -1,
		Channels: []Channel{{0xC1D00023, ClassHopperGPFIFO}, {0xC1D00024, ClassHopperGPFIFO}}}
	if g.Handle != want.Handle || g.Engine != want.Engine || g.Timeslice != want.Timeslice || g.TimesliceBy != want.TimesliceBy ||
		g.FD != want.FD || g.Instance != want.Instance || g.Disabled || len(g.Channels) != 2 || g.Channels[0] != want.Channels[0] || g.Channels[1] != want.Channels[1] {
		t.Fatalf("group:\n got %+v\nwant %+v", g, want)
	}
	if ce := d.Groups[1]; ce.Engine != EngineCopy0 || len(ce.Channels) != 0 || ce.Timeslice != 0 {
		t.Fatalf("copy group: %+v", ce)
	}
	if gs, _ := r.Groups(100, 2); len(gs) != 2 {
		t.Fatalf("groups on GPU 2: %d", len(gs))
	}
	if gs, _ := r.Groups(100, 0); len(gs) != 0 {
		t.Fatalf("groups on GPU 0: %d", len(gs))
	}
}

func TestRegistryIgnores(t *testing.T) {
	r := newTestRegistry(t, "", map[uint32]uint64{100: 5, 200: 6})
	// Objects of a client never seen: unknown, not guessed.
	ev := evAlloc(200, 3, 0xC1D00009, 0xC1D00009, 0x5C000001, ClassDevice, 0, 0)
	if ch := r.Apply(&ev); ch.Kind != ChangeNone {
		t.Fatalf("device of unseen client: %+v", ch)
	}
	if _, err := r.Process(200); !errors.Is(err, ErrUnknownProcess) {
		t.Fatalf("unseen process: %v", err)
	}
	applyAll(r, cudaContext(100, 7, 0xC1D00001, 0))
	// Refused calls, unknown objects, other controls.
	bad := []trace.Event{
		evAlloc(100, 7, 0xC1D00001, 0xC1D00011, 0x99, ClassChannelGroup, 1, 0),
		evControl(100, 0xC1D00001, 0x12345, CtrlSetTimeslice, 5),
		evControl(100, 0xC1D00001, 0xC1D00011, CtrlSetTimeslice, 5), // a device, not a group
		evFree(100, 0xC1D00001, 0, 0x777),
		evControl(999, 0xC1D00001, 0xC1D00021, CtrlSetTimeslice, 5), // another process (the daemon)
	}
	bad[0].RM.Status = uint32(StatusInvalidArgument)
	for i := range bad {
		if ch := r.Apply(&bad[i]); ch.Kind != ChangeNone {
			t.Errorf("event %d changed the registry: %+v", i, ch)
		}
	}
	if g, _ := r.Groups(100, 0); len(g) != 2 || g[0].Timeslice != 1024 {
		t.Fatalf("groups: %+v", g)
	}
}

func TestRegistryFreeAndExit(t *testing.T) {
	r := newTestRegistry(t, "", map[uint32]uint64{100: 5})
	applyAll(r, cudaContext(100, 7, 0xC1D00001, 0))
	applyAll(r, cudaContext(100, 8, 0xC1D00002, 1))
	// Freeing a channel group takes its channels.
	ev := evFree(100, 0xC1D00001, 0xC1D00011, 0xC1D00021)
	r.Apply(&ev)
	g, _ := r.Groups(100, 0)
	if len(g) != 1 || g[0].Handle != 0xC1D00029 {
		t.Fatalf("after group free: %+v", g)
	}
	r.mu.Lock()
	n := len(r.procs[100].objs)
	r.mu.Unlock()
	if n != 2*7-3 { // two contexts of 7 kept objects, less the group and its 2 channels
		t.Fatalf("%d objects kept after group free", n)
	}
	// Freeing a device takes everything under it.
	ev = evFree(100, 0xC1D00001, 0xC1D00001, 0xC1D00011)
	r.Apply(&ev)
	if p, _ := r.Process(100); len(p.Clients) != 2 || len(p.Clients[0].Devices) != 0 || len(p.Clients[1].Devices) != 1 {
		t.Fatalf("after device free: %+v", p)
	}
	// Freeing a client takes the whole client.
	ev = evFree(100, 0xC1D00002, 0, 0xC1D00002)
	r.Apply(&ev)
	if p, _ := r.Process(100); len(p.Clients) != 1 || p.Clients[0].Handle != 0xC1D00001 {
		t.Fatalf("after client free: %+v", p)
	}
	ex := trace.Event{Kind: trace.KindExit, PID: 100}
	if ch := r.Apply(&ex); ch.Kind != ChangeExit {
		t.Fatalf("exit: %+v", ch)
	}
	if r.Len() != 0 {
		t.Fatal("exited process kept")
	}
	if ch := r.Apply(&ex); ch.Kind != ChangeNone {
		t.Fatalf("second exit: %+v", ch)
	}
}

func TestRegistryStateFile(t *testing.T) {
	state := filepath.Join(t.TempDir(), "sub", "state.json")
	alive := map[uint32]uint64{100: 5, 200: 6, 300: 7}
	r := newTestRegistry(t, state, alive)
	applyAll(r, cudaContext(100, 7, 0xC1D00001, 0))
	applyAll(r, cudaContext(200, 4, 0xC1D00002, 1))
	applyAll(r, cudaContext(300, 4, 0xC1D00003, 0))
	r.setDesiredTimeslice(100, 0, 50)
	if err := r.Save(); err != nil {
		t.Fatal(err)
	}
	g, _ := r.Groups(100, 0)
	if err := r.markSuspended(r.suspensionRecords(100, g[:1])); err != nil {
		t.Fatal(err)
	}
	g3, _ := r.Groups(300, 0)
	if err := r.markSuspended(r.suspensionRecords(300, g3[:1])); err != nil {
		t.Fatal(err)
	}
	// 200 exits while the daemon is down; 300's pid is reused.
	delete(alive, 200)
	alive[300] = 99
	r2 := newTestRegistry(t, state, alive)
	ps := r2.Processes()
	if len(ps) != 1 || ps[0].PID != 100 {
		t.Fatalf("restored processes: %+v", ps)
	}
	orig, _ := r.Process(100)
	got := ps[0]
	got.Clients[0].Devices[0].Groups[0].Suspended = false
	if !equalProcess(orig, got) {
		t.Fatalf("restored tree differs:\n got %+v\nwant %+v", got, orig)
	}
	if us, ok := r2.desiredTimeslice(100, 0); !ok || us != 50 {
		t.Fatalf("desired timeslice: %d %v", us, ok)
	}
	sus := r2.Suspended()
	if len(sus) != 1 || sus[0].PID != 100 || sus[0].Group.Handle != 0xC1D00021 || sus[0].StartTime != 5 {
		t.Fatalf("suspended: %+v", sus)
	}
	if p, _ := r2.Process(100); !p.Clients[0].Devices[0].Groups[0].Suspended {
		t.Fatal("snapshot does not show the group suspended")
	}
	if err := r2.clearSuspended(100, g[:1]); err != nil {
		t.Fatal(err)
	}
	if sus := newTestRegistry(t, state, alive).Suspended(); len(sus) != 0 {
		t.Fatalf("suspended after clear: %+v", sus)
	}
}

func equalProcess(a, b Process) bool {
	if a.PID != b.PID || a.StartTime != b.StartTime || len(a.Clients) != len(b.Clients) {
		return false
	}
	for i := range a.Clients {
		ca, cb := a.Clients[i], b.Clients[i]
		if ca.Handle != cb.Handle || ca.FD != cb.FD || len(ca.Devices) != len(cb.Devices) {
			return false
		}
		for j := range ca.Devices {
			da, db := ca.Devices[j], cb.Devices[j]
			if da.Handle != db.Handle || da.Instance != db.Instance || len(da.Groups) != len(db.Groups) {
				return false
			}
			for k := range da.Groups {
				ga, gb := da.Groups[k], db.Groups[k]
				if ga.Handle != gb.Handle || ga.Engine != gb.Engine || ga.Timeslice != gb.Timeslice || len(ga.Channels) != len(gb.Channels) {
					return false
				}
			}
		}
	}
	return true
}

func TestRegistryStateErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, body, want string }{
		{"syntax", `{"version":1,"processes":[}`, "byte 27"},
		{"type", `{"version":1,"processes":[{"pid":"x"}]}`, "processes.pid"},
		{"timeslice key", `{"version":1,"processes":[{"pid":1,"objects":[],"desired_timeslice":{"gpu":5}}]}`, `desired timeslice key "gpu"`},
	}
	for _, tc := range tests {
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := NewRegistry(&RegistryOptions{StatePath: p, StartTime: func(uint32) uint64 { return 1 }})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming %s and %q", tc.name, err, p, tc.want)
		}
	}
	// A missing file is an empty registry.
	if r, err := NewRegistry(&RegistryOptions{StatePath: filepath.Join(dir, "none")}); err != nil || r.Len() != 0 {
		t.Fatalf("missing file: %v", err)
	}
}

// FuzzRegistryState loads arbitrary state files: an error or a registry,
// never a panic; what loads saves and loads again the same.
func FuzzRegistryState(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.json")
	r, _ := NewRegistry(&RegistryOptions{StatePath: seed, StartTime: func(uint32) uint64 { return 1 }})
	applyAll(r, cudaContext(1, 3, 0xC1D00001, 0))
	g, _ := r.Groups(1, 0)
	_ = r.markSuspended(r.suspensionRecords(1, g))
	b, _ := os.ReadFile(seed)
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"processes":[{"pid":1,"objects":[{"Handle":1,"Client":1,"Class":65}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "s.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		opts := &RegistryOptions{StatePath: p, StartTime: func(uint32) uint64 { return 1 }}
		r, err := NewRegistry(opts)
		if err != nil {
			return
		}
		procs, sus := r.Processes(), r.Suspended()
		if err := r.Save(); err != nil {
			t.Fatal(err)
		}
		r2, err := NewRegistry(opts)
		if err != nil {
			t.Fatalf("saved state does not load: %v", err)
		}
		if len(r2.Processes()) != len(procs) || len(r2.Suspended()) != len(sus) {
			t.Fatalf("round trip: %d/%d processes, %d/%d suspended", len(r2.Processes()), len(procs), len(r2.Suspended()), len(sus))
		}
	})
}

// BenchmarkRegistryApply applies a stream of traced events: contexts
// created and torn down across 64 processes, with their controls.
func BenchmarkRegistryApply(b *testing.B) {
	alive := map[uint32]uint64{}
	var evs []trace.Event
	for pid := uint32(1000); pid < 1064; pid++ {
		alive[pid] = uint64(pid)
		evs = append(evs, cudaContext(pid, 5, 0xC1D00000+pid<<4, pid%8)...)
	}
	for pid := uint32(1000); pid < 1064; pid++ {
		evs = append(evs, evControl(pid, 0xC1D00000+pid<<4, 0xC1D00020+pid<<4, CtrlSetTimeslice, 200))
		evs = append(evs, evFree(pid, 0xC1D00000+pid<<4, 0, 0xC1D00000+pid<<4))
	}
	r := newTestRegistry(b, "", alive)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		applyAll(r, evs)
		n += len(evs)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds()/1e6, "Mevents/s")
}

// TestProcStartTime checks the start times that tell a traced process
// from a later one reusing its pid (the parsing is procfs's, tested there).
func TestProcStartTime(t *testing.T) {
	if procStartTime(0) != 0 || procStartTime(1<<31-1) != 0 {
		t.Error("a process that does not exist has a start time")
	}
	if procStartTime(uint32(os.Getpid())) == 0 {
		t.Error("own start time is 0")
	}
}

// TestSuspendedRecord checks the suspended-groups record across sizes:
// written in place and padded as it shrinks, through a rename past a page,
// and read back each time by a fresh registry.
func TestSuspendedRecord(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	alive := map[uint32]uint64{}
	for pid := uint32(1); pid <= 40; pid++ {
		alive[pid] = uint64(pid)
	}
	r := newTestRegistry(t, state, alive)
	defer r.Close()
	var all [][]Group
	for pid := uint32(1); pid <= 40; pid++ {
		applyAll(r, cudaContext(pid, 3, 0xC1D00000+pid<<8, 0))
		g, _ := r.Groups(pid, 0)
		all = append(all, g)
	}
	check := func(want int) {
		t.Helper()
		r2 := newTestRegistry(t, state, alive)
		defer r2.Close()
		if got := len(r2.Suspended()); got != want {
			t.Fatalf("reloaded %d suspended groups, want %d", got, want)
		}
	}
	susPath := filepath.Join(filepath.Dir(state), "suspended.json")
	for i, n := range []int{1, 2, 40, 3, 0} { // grow, pass a page, shrink
		r.mu.Lock()
		r.suspended = map[groupKey]SuspendedGroup{}
		r.mu.Unlock()
		for pid := 1; pid <= n; pid++ {
			if err := r.markSuspended(r.suspensionRecords(uint32(pid), all[pid-1][:1])); err != nil {
				t.Fatal(err)
			}
		}
		if n == 0 {
			if err := r.saveSuspended(); err != nil {
				t.Fatal(err)
			}
		}
		check(n)
		if fi, err := os.Stat(susPath); err != nil || (n == 40 && fi.Size() <= pageSize) {
			t.Fatalf("step %d: %v, size %d", i, err, fi.Size())
		}
	}
}

// FuzzSuspendedRecord loads arbitrary suspended-groups files: an error or
// a registry, never a panic; what loads saves and loads again the same.
func FuzzSuspendedRecord(f *testing.F) {
	f.Add([]byte(`{"version":1,"suspended":[{"pid":1,"start_time":1,"group":{"Client":1,"Handle":2,"FD":3}}]}   `))
	f.Add([]byte(`{"version":1,"suspended":[]}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "suspended.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		opts := &RegistryOptions{StatePath: filepath.Join(dir, "state.json"), StartTime: func(uint32) uint64 { return 1 }}
		r, err := NewRegistry(opts)
		if err != nil {
			if !strings.Contains(err.Error(), "suspended.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		n := len(r.Suspended())
		if err := r.saveSuspended(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		r2, err := NewRegistry(opts)
		if err != nil {
			t.Fatalf("saved record does not load: %v", err)
		}
		defer r2.Close()
		if len(r2.Suspended()) != n {
			t.Fatalf("round trip: %d, want %d", len(r2.Suspended()), n)
		}
	})
}

func TestRegistryPrune(t *testing.T) {
	alive := map[uint32]uint64{100: 5, 200: 6, 300: 7}
	r := newTestRegistry(t, "", alive)
	for _, pid := range []uint32{100, 200, 300} {
		applyAll(r, cudaContext(pid, 3, 0xC1D00000+pid, 0))
	}
	delete(alive, 200) // exited, exit not traced
	alive[300] = 70    // pid reused
	if n := r.Prune(); n != 2 {
		t.Fatalf("pruned %d, want 2", n)
	}
	if ps := r.Processes(); len(ps) != 1 || ps[0].PID != 100 {
		t.Fatalf("left: %+v", ps)
	}
}
