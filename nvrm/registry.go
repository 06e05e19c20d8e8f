package nvrm

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/trace"
)

// ErrUnknownProcess is returned for a process whose RM allocations were
// not seen by any tracer: Arbiter never guesses its handles.
var ErrUnknownProcess = errors.New("handles unknown: the process's RM allocations were not traced")

// Registry is the per-process tree of RM handles learnt from traced
// allocations: client → device → subdevice and channel groups → channels,
// each client tied to the descriptor it was allocated on. It also keeps
// what Arbiter itself changed (desired timeslices, suspended channel
// groups) so that a restart can finish or undo it. A Registry is safe for
// concurrent use.
type Registry struct {
	mu    sync.Mutex
	opts  RegistryOptions
	procs map[uint32]*proc
	// suspended are the channel groups Arbiter disabled, until resumed.
	suspended map[groupKey]SuspendedGroup

	// susMu orders writes of the suspended-groups file, kept open in
	// susFD (-1 until first written) with susLen bytes.
	susMu  sync.Mutex
	susFD  int
	susLen int

	// bootID is the kernel's boot id, written into the state files.
	bootID string
	// refused are the state files not read for their format version.
	refused []*FormatError
}

// RegistryOptions configures a Registry. The zero value keeps no state
// file and reads process start times from /proc.
type RegistryOptions struct {
	// StatePath, where set, is the state file: NewRegistry loads it and
	// Save writes it (atomically, by rename). It lets handles learnt
	// before a daemon restart, and channel groups left suspended by a
	// crash, survive.
	StatePath string
	// StartTime returns a process's start time (clock ticks since boot,
	// /proc/PID/stat field 22), which tells a process from a later one
	// reusing its pid; nil reads /proc. It returns 0 for a process that
	// does not exist.
	StartTime func(pid uint32) uint64
	// BootID is the kernel's boot id, which the state files record so
	// that a later boot drops them; empty reads it from /proc.
	BootID string
}

// groupKey names one channel group of one process.
type groupKey struct {
	PID    uint32
	Client uint32
	Group  uint32
}

// objKey names an object inside one process: handles are per client.
type objKey struct {
	client, handle uint32
}

type proc struct {
	pid   uint32
	start uint64
	objs  map[objKey]*object
	// desiredTimeslice is the timeslice Arbiter set, per device instance,
	// re-applied after the process sets its own; -1 is every device.
	desiredTimeslice map[int]uint64
}

// object is one tracked RM object. Objects of classes Arbiter does not
// control (memory, VA spaces, engine objects) are not kept.
type object struct {
	Handle, Parent, Client uint32
	Class                  Class
	FD                     int32      // clients: the descriptor it was allocated on
	Engine                 EngineType // channel groups
	Instance               uint32     // devices and subdevices
	Timeslice              uint64     // channel groups: last value set, 0 if none seen
	TimesliceBy            string     // "process" or "arbiter"
	Interleave             int32      // channel groups: last level set, -1 if none seen
	Disabled               bool       // channel groups: GPFIFO_SCHEDULE{0} last seen
}

// NewRegistry returns an empty registry, or the one saved at
// opts.StatePath, keeping only processes that still run (same pid and
// start time). opts may be nil.
func NewRegistry(opts *RegistryOptions) (*Registry, error) {
	r := &Registry{procs: map[uint32]*proc{}, suspended: map[groupKey]SuspendedGroup{}, susFD: -1}
	if opts != nil {
		r.opts = *opts
	}
	if r.opts.StartTime == nil {
		r.opts.StartTime = procStartTime
	}
	r.bootID = r.opts.BootID
	if r.bootID == "" {
		r.bootID = readBootID()
	}
	if r.opts.StatePath != "" {
		if err := r.load(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ChangeKind says what an applied event changed.
type ChangeKind uint8

// Changes reported by Apply.
const (
	ChangeNone ChangeKind = iota
	// ChangeNewGroup: a channel group was allocated.
	ChangeNewGroup
	// ChangeTimeslice: the process set a channel group's timeslice itself.
	ChangeTimeslice
	// ChangeObjects: objects were added or freed (other than groups).
	ChangeObjects
	// ChangeExit: the process exited and was forgotten.
	ChangeExit
)

// Change is what Apply did, for whoever follows the registry (the
// Controller re-applies Arbiter's timeslice on ChangeNewGroup and
// ChangeTimeslice).
type Change struct {
	Kind ChangeKind
	PID  uint32
	// Group is the channel group concerned, for the group changes.
	Group Group
}

// Apply updates the registry with one traced event. Calls RM refused are
// ignored; so are controls on objects never seen allocated, and frees of
// objects the registry does not keep.
func (r *Registry) Apply(ev *trace.Event) Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch ev.Kind {
	case trace.KindExit:
		if _, ok := r.procs[ev.PID]; !ok {
			return Change{}
		}
		r.forget(ev.PID)
		return Change{Kind: ChangeExit, PID: ev.PID}
	case trace.KindRMAlloc:
		return r.applyAlloc(ev)
	case trace.KindRMFree:
		return r.applyFree(ev)
	case trace.KindRMControl:
		return r.applyControl(ev)
	}
	return Change{}
}

func (r *Registry) applyAlloc(ev *trace.Event) Change {
	rm := &ev.RM
	cls := Class(rm.Class)
	if rm.Status != 0 || !(cls.IsClient() || cls == ClassDevice || cls == ClassSubdevice || cls == ClassChannelGroup || cls.IsChannel()) {
		return Change{}
	}
	p := r.procs[ev.PID]
	if p == nil {
		if !cls.IsClient() {
			// An object under a client never seen: its tree is unknown.
			return Change{}
		}
		p = &proc{pid: ev.PID, start: r.opts.StartTime(ev.PID), objs: map[objKey]*object{}}
		r.procs[ev.PID] = p
	}
	o := &object{Handle: rm.Object, Parent: rm.Parent, Client: rm.Client, Class: cls, FD: -1, Interleave: -1}
	switch {
	case cls.IsClient():
		o.Class, o.FD, o.Parent = ClassRootClient, rm.FD, 0
	case p.objs[objKey{rm.Client, rm.Client}] == nil:
		return Change{}
	case cls == ClassDevice || cls == ClassSubdevice:
		o.Instance = uint32(rm.Value)
	case cls == ClassChannelGroup:
		o.Engine = EngineType(rm.EngineType)
	}
	p.objs[objKey{o.Client, o.Handle}] = o
	if cls == ClassChannelGroup {
		return Change{Kind: ChangeNewGroup, PID: ev.PID, Group: p.group(o)}
	}
	return Change{Kind: ChangeObjects, PID: ev.PID}
}

func (r *Registry) applyFree(ev *trace.Event) Change {
	p := r.procs[ev.PID]
	if p == nil || ev.RM.Status != 0 {
		return Change{}
	}
	k := objKey{ev.RM.Client, ev.RM.Object}
	if p.objs[k] == nil {
		return Change{}
	}
	// RM frees an object's descendants with it; freeing the client frees
	// all of its objects.
	gone := map[uint32]bool{k.handle: true}
	for changed := true; changed; {
		changed = false
		for ok, o := range p.objs {
			if ok.client == k.client && !gone[o.Handle] && (gone[o.Parent] || k.handle == k.client) {
				gone[o.Handle] = true
				changed = true
			}
		}
	}
	for h := range gone {
		delete(p.objs, objKey{k.client, h})
		delete(r.suspended, groupKey{ev.PID, k.client, h})
	}
	if len(p.objs) == 0 {
		r.forget(ev.PID)
	}
	return Change{Kind: ChangeObjects, PID: ev.PID}
}

func (r *Registry) applyControl(ev *trace.Event) Change {
	p := r.procs[ev.PID]
	if p == nil || ev.RM.Status != 0 {
		return Change{}
	}
	o := p.objs[objKey{ev.RM.Client, ev.RM.Object}]
	if o == nil || o.Class != ClassChannelGroup {
		return Change{}
	}
	switch Control(ev.RM.Cmd) {
	case CtrlSetTimeslice:
		o.Timeslice, o.TimesliceBy = ev.RM.Value, "process"
		return Change{Kind: ChangeTimeslice, PID: ev.PID, Group: p.group(o)}
	case CtrlGPFIFOSchedule:
		o.Disabled = ev.RM.Value == 0
	case CtrlSetInterleaveLevel:
		o.Interleave = int32(ev.RM.Value)
	}
	return Change{}
}

// forget drops a process and anything Arbiter holds for it.
func (r *Registry) forget(pid uint32) {
	delete(r.procs, pid)
	for k := range r.suspended {
		if k.PID == pid {
			delete(r.suspended, k)
		}
	}
}

// Prune drops the processes that no longer run (or whose pid now names
// another process), in case their exit was not traced, and returns how
// many it dropped.
func (r *Registry) Prune() int {
	r.mu.Lock()
	pids := make(map[uint32]uint64, len(r.procs))
	for pid, p := range r.procs {
		pids[pid] = p.start
	}
	r.mu.Unlock()
	n := 0
	for pid, start := range pids {
		if !r.alive(pid, start) {
			r.Forget(pid)
			n++
		}
	}
	return n
}

// Forget drops a process, e.g. one found to have exited.
func (r *Registry) Forget(pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(pid)
}

// Process is one traced process's RM tree.
type Process struct {
	PID uint32
	// StartTime is the process's start (clock ticks after boot), 0 if
	// unknown.
	StartTime uint64
	Clients   []Client
}

// Client is an RM client and the descriptor it lives on.
type Client struct {
	Handle uint32
	// FD is the process's descriptor the client was allocated on; calls
	// on the client are accepted only on that open file.
	FD      int32
	Devices []Device
}

// Device is an RM device (one GPU) of a client.
type Device struct {
	Handle uint32
	// Instance is the device's deviceId, RM's device instance: the GPU's
	// index among those the driver exposes. It is expected to equal the
	// NVML index (both follow the driver's enumeration, unaffected by
	// CUDA_VISIBLE_DEVICES); the hardware procedure records it.
	Instance   uint32
	Subdevices []uint32
	Groups     []Group
}

// Group is a channel group (TSG) and its channels.
type Group struct {
	Client, Device, Handle uint32
	// FD is the client's descriptor.
	FD int32
	// Instance is the GPU (device instance) the group runs on.
	Instance uint32
	Engine   EngineType
	// Timeslice is the last timeslice set in µs (0: none seen, the driver
	// default applies) and TimesliceBy who set it: "process" or "arbiter".
	Timeslice   uint64
	TimesliceBy string
	// Interleave is the last level set, -1 if none seen.
	Interleave int32
	// Disabled is true while scheduling is disabled (GPFIFO_SCHEDULE{0}).
	Disabled bool
	// Suspended is true while Arbiter holds it suspended.
	Suspended bool
	Channels  []Channel
}

// Channel is a GPFIFO channel.
type Channel struct {
	Handle uint32
	Class  Class
}

// Process returns pid's tree, or an error wrapping ErrUnknownProcess.
func (r *Registry) Process(pid uint32) (Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[pid]
	if p == nil {
		return Process{}, fmt.Errorf("nvrm: process %d: %w (start the tracer before the process creates its CUDA context)", pid, ErrUnknownProcess)
	}
	return r.snapshot(p), nil
}

// startTime returns pid's recorded start time, or an error wrapping
// ErrUnknownProcess.
func (r *Registry) startTime(pid uint32) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[pid]
	if p == nil {
		return 0, fmt.Errorf("nvrm: process %d: %w (start the tracer before the process creates its CUDA context)", pid, ErrUnknownProcess)
	}
	return p.start, nil
}

// Processes returns every traced process's tree, by pid.
func (r *Registry) Processes() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Process, 0, len(r.procs))
	for _, p := range r.procs {
		out = append(out, r.snapshot(p))
	}
	slices.SortFunc(out, func(a, b Process) int { return int(a.PID) - int(b.PID) })
	return out
}

// Len returns the number of traced processes.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.procs)
}

func (r *Registry) snapshot(p *proc) Process {
	out := Process{PID: p.pid, StartTime: p.start}
	for _, c := range p.sorted(func(o *object) bool { return o.Class == ClassRootClient }) {
		cl := Client{Handle: c.Handle, FD: c.FD}
		for _, d := range p.sorted(func(o *object) bool { return o.Class == ClassDevice && o.Client == c.Handle }) {
			dev := Device{Handle: d.Handle, Instance: d.Instance}
			for _, s := range p.sorted(func(o *object) bool {
				return o.Class == ClassSubdevice && o.Client == c.Handle && o.Parent == d.Handle
			}) {
				dev.Subdevices = append(dev.Subdevices, s.Handle)
			}
			for _, g := range p.sorted(func(o *object) bool {
				return o.Class == ClassChannelGroup && o.Client == c.Handle && o.Parent == d.Handle
			}) {
				grp := p.group(g)
				_, grp.Suspended = r.suspended[groupKey{p.pid, g.Client, g.Handle}]
				dev.Groups = append(dev.Groups, grp)
			}
			cl.Devices = append(cl.Devices, dev)
		}
		out.Clients = append(out.Clients, cl)
	}
	return out
}

// group builds a Group view of channel-group object g.
func (p *proc) group(g *object) Group {
	grp := Group{Client: g.Client, Device: g.Parent, Handle: g.Handle, Engine: g.Engine,
		Timeslice: g.Timeslice, TimesliceBy: g.TimesliceBy, Interleave: g.Interleave, Disabled: g.Disabled, FD: -1}
	if c := p.objs[objKey{g.Client, g.Client}]; c != nil {
		grp.FD = c.FD
	}
	if d := p.objs[objKey{g.Client, g.Parent}]; d != nil {
		grp.Instance = d.Instance
	}
	for _, ch := range p.sorted(func(o *object) bool { return o.Class.IsChannel() && o.Client == g.Client && o.Parent == g.Handle }) {
		grp.Channels = append(grp.Channels, Channel{Handle: ch.Handle, Class: ch.Class})
	}
	return grp
}

// sorted returns the objects matching keep, by client then handle.
func (p *proc) sorted(keep func(*object) bool) []*object {
	var out []*object
	for _, o := range p.objs {
		if keep(o) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *object) int {
		if a.Client != b.Client {
			return cmpU32(a.Client, b.Client)
		}
		return cmpU32(a.Handle, b.Handle)
	})
	return out
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Groups returns pid's channel groups on GPU instance gpu (every GPU where
// gpu is negative), or an error wrapping ErrUnknownProcess.
func (r *Registry) Groups(pid uint32, gpu int) ([]Group, error) {
	p, err := r.Process(pid)
	if err != nil {
		return nil, err
	}
	var out []Group
	for _, c := range p.Clients {
		for _, d := range c.Devices {
			if gpu >= 0 && d.Instance != uint32(gpu) {
				continue
			}
			out = append(out, d.Groups...)
		}
	}
	return out, nil
}

// setGroup records what Arbiter set on a group.
func (r *Registry) setGroup(pid uint32, g Group, fn func(o *object)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.procs[pid]; p != nil {
		if o := p.objs[objKey{g.Client, g.Handle}]; o != nil {
			fn(o)
		}
	}
}

// setDesiredTimeslice records the timeslice Arbiter keeps on pid's groups
// of GPU gpu (negative: all).
func (r *Registry) setDesiredTimeslice(pid uint32, gpu int, us uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.procs[pid]; p != nil {
		if gpu < 0 {
			gpu = -1
			p.desiredTimeslice = nil
		}
		if p.desiredTimeslice == nil {
			p.desiredTimeslice = map[int]uint64{}
		}
		p.desiredTimeslice[gpu] = us
	}
}

// clearDesiredTimeslice stops keeping a timeslice on pid's groups of GPU
// gpu (of every GPU where gpu < 0).
func (r *Registry) clearDesiredTimeslice(pid uint32, gpu int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.procs[pid]; p != nil {
		if gpu < 0 {
			p.desiredTimeslice = nil
			return
		}
		delete(p.desiredTimeslice, gpu)
	}
}

// desiredTimeslice returns the timeslice Arbiter keeps on pid's groups of
// GPU gpu, if any.
func (r *Registry) desiredTimeslice(pid uint32, gpu uint32) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[pid]
	if p == nil {
		return 0, false
	}
	if us, ok := p.desiredTimeslice[int(gpu)]; ok {
		return us, true
	}
	us, ok := p.desiredTimeslice[-1]
	return us, ok
}

// procStartTime reads pid's start time from /proc/PID/stat (procfs), 0 if
// the process does not exist.
func procStartTime(pid uint32) uint64 {
	start, err := procfs.At("/proc").StartTime(int(pid))
	if err != nil {
		return 0
	}
	return start
}
