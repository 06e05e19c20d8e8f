package nvrm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// The state file keeps the registry across daemon restarts. A file rather
// than a pinned BPF map holding the tree: the tree needs the cascade of
// frees (a freed client takes its whole subtree), which a BPF program
// cannot walk, and a file is readable by `arbiter channels` with no BPF at
// all. What the file cannot hold — calls made while no reader ran — the
// pinned ring buffer keeps: the Tracer's programs stay attached through a
// restart, and the next reader drains what they recorded (see
// TracerOptions.PinPath). A running Keeper saves the registry whenever the
// ring buffer is drained after a change: a crash loses at most the burst
// of records in hand (typically part of one context's creation).

// stateFile is state.json; its format versions are in stateformat.go.
type stateFile struct {
	Version   int            `json:"version"`
	BootID    string         `json:"boot_id,omitempty"`
	Processes []stateProcess `json:"processes"`
}

// suspendedFile is the record of suspended groups, a file of its own so
// that recording a suspension, which precedes every Suspend's controls,
// writes a few hundred bytes rather than the whole registry.
type suspendedFile struct {
	Version   int              `json:"version"`
	BootID    string           `json:"boot_id,omitempty"`
	Suspended []SuspendedGroup `json:"suspended"`
}

type stateProcess struct {
	PID       uint32            `json:"pid"`
	StartTime uint64            `json:"start_time"`
	Objects   []object          `json:"objects"`
	Timeslice map[string]uint64 `json:"desired_timeslice,omitempty"`
}

// SuspendedGroup is a channel group Arbiter disabled and has not yet
// resumed. It is written to the state file before the group is disabled,
// so that a crash between the two leaves a record the next start acts on;
// it holds all that resuming needs, even where the registry lost the
// process's tree.
type SuspendedGroup struct {
	PID       uint32 `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Group     Group  `json:"group"`
	// Method is how the group was (or is being) taken off the GPU, which
	// says how to undo it: SuspendDisableChannels re-enables the group's
	// channels on Subdevice, anything else (SuspendSchedule, or none in
	// records of earlier versions) schedules the group again.
	Method SuspendMethod `json:"method,omitempty"`
	// Subdevice is the process's subdevice that FIFO_DISABLE_CHANNELS
	// went to.
	Subdevice uint32 `json:"subdevice,omitempty"`
}

// Save writes the registry to its state file, if it has one, atomically:
// a reader sees the old file or the new, never a mix.
func (r *Registry) Save() error {
	if r.opts.StatePath == "" {
		return nil
	}
	r.mu.Lock()
	st := stateFile{Version: stateVersion, BootID: r.bootID}
	for _, p := range r.procs {
		sp := stateProcess{PID: p.pid, StartTime: p.start}
		for _, o := range p.objs {
			sp.Objects = append(sp.Objects, *o)
		}
		slices.SortFunc(sp.Objects, func(a, b object) int {
			if a.Client != b.Client {
				return cmpU32(a.Client, b.Client)
			}
			return cmpU32(a.Handle, b.Handle)
		})
		for gpu, us := range p.desiredTimeslice {
			if sp.Timeslice == nil {
				sp.Timeslice = map[string]uint64{}
			}
			sp.Timeslice[fmt.Sprint(gpu)] = us
		}
		st.Processes = append(st.Processes, sp)
	}
	r.mu.Unlock()
	slices.SortFunc(st.Processes, func(a, b stateProcess) int { return cmpU32(a.PID, b.PID) })
	b, err := json.MarshalIndent(&st, "", " ")
	if err != nil {
		return fmt.Errorf("nvrm: encode state: %w", err)
	}
	if err := writeAtomic(r.opts.StatePath, b); err != nil {
		return err
	}
	return r.saveSuspended()
}

// suspendedPath is the suspended-groups file beside the state file.
func (r *Registry) suspendedPath() string {
	return filepath.Join(filepath.Dir(r.opts.StatePath), "suspended.json")
}

// saveSuspended writes the suspended-groups file, if the registry keeps
// state. It runs before every Suspend's controls, so it is one system
// call where it can be: the file stays open and the record is written over
// it from offset 0 in a single pwrite, padded with spaces (JSON ignores
// them) to the file's length so nothing stale follows it. A write of one
// page or less completes even if the daemon is killed during it; a larger
// record goes through writeAtomic's temporary file and rename.
func (r *Registry) saveSuspended() error {
	if r.opts.StatePath == "" {
		return nil
	}
	r.susMu.Lock()
	defer r.susMu.Unlock()
	b, err := json.Marshal(&suspendedFile{Version: stateVersion, BootID: r.bootID, Suspended: r.Suspended()})
	if err != nil {
		return fmt.Errorf("nvrm: encode suspended groups: %w", err)
	}
	path := r.suspendedPath()
	if max(len(b), r.susLen) > pageSize {
		r.closeSuspended()
		return writeAtomic(path, b)
	}
	if r.susFD < 0 {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.ENOENT) {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return fmt.Errorf("nvrm: state directory: %w", err)
			}
			fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		}
		if err != nil {
			return fmt.Errorf("nvrm: open %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size > pageSize {
			unix.Close(fd)
			return writeAtomic(path, b)
		}
		r.susFD, r.susLen = fd, int(st.Size)
	}
	for len(b) < r.susLen {
		b = append(b, ' ')
	}
	n, err := unix.Pwrite(r.susFD, b, 0)
	if err != nil || n != len(b) {
		r.closeSuspended()
		return fmt.Errorf("nvrm: write %s: %d of %d bytes: %w", path, n, len(b), err)
	}
	r.susLen = len(b)
	return nil
}

// pageSize bounds a suspended-groups record written in place.
const pageSize = 4096

// closeSuspended closes the suspended-groups file; susMu is held.
func (r *Registry) closeSuspended() {
	if r.susFD >= 0 {
		unix.Close(r.susFD)
		r.susFD, r.susLen = -1, 0
	}
}

// Close releases the registry's open state file. The registry stays
// usable; the next save reopens it.
func (r *Registry) Close() error {
	r.susMu.Lock()
	defer r.susMu.Unlock()
	r.closeSuspended()
	return nil
}

// load reads the state file, keeping processes that still run. A missing
// file is an empty registry; a file of a format version this build does not
// read is refused (Refused), not an error.
func (r *Registry) load() error {
	path := r.opts.StatePath
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r.loadSuspended()
	}
	if err != nil {
		return fmt.Errorf("nvrm: read state: %w", err)
	}
	head, err := readHead(path, b)
	if err != nil {
		return fmt.Errorf("%w (remove the file to start afresh)", err)
	}
	if !knownVersion(head.Version) {
		r.refused = append(r.refused, &FormatError{Path: path, Version: head.Version,
			Instead: "not used: the driver handles it records are forgotten (their processes fall back to the launch gate), and it is overwritten"})
		return r.loadSuspended()
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%w (remove the file to start afresh)", jsonError(path, err))
	}
	if otherBoot(st.BootID, r.bootID) {
		return r.loadSuspended() // none of its processes exists any more
	}
	for _, sp := range st.Processes {
		if !r.alive(sp.PID, sp.StartTime) {
			continue
		}
		p := &proc{pid: sp.PID, start: sp.StartTime, objs: map[objKey]*object{}}
		for i := range sp.Objects {
			o := sp.Objects[i]
			p.objs[objKey{o.Client, o.Handle}] = &o
		}
		for k, us := range sp.Timeslice {
			var gpu int
			if _, err := fmt.Sscan(k, &gpu); err != nil {
				return fmt.Errorf("nvrm: state file %s: process %d: desired timeslice key %q: %w", path, sp.PID, k, err)
			}
			if p.desiredTimeslice == nil {
				p.desiredTimeslice = map[int]uint64{}
			}
			p.desiredTimeslice[gpu] = us
		}
		r.procs[sp.PID] = p
	}
	return r.loadSuspended()
}

// loadSuspended reads the suspended-groups file, keeping the groups of
// processes that still run (same pid and start time): a suspended group of
// an exited process went with it. A file of a format version this build
// does not read is refused (Refused) but its records are kept as far as
// they decode, so that they are resumed: a process is never left
// suspended because of the file's version.
func (r *Registry) loadSuspended() error {
	path := r.suspendedPath()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nvrm: read suspended groups: %w", err)
	}
	head, err := readHead(path, b)
	if err != nil {
		return err
	}
	var recs []SuspendedGroup
	if knownVersion(head.Version) {
		var sf suspendedFile
		if err := json.Unmarshal(b, &sf); err != nil {
			return jsonError(path, err)
		}
		if otherBoot(sf.BootID, r.bootID) {
			return nil
		}
		recs = sf.Suspended
	} else {
		var lost int
		recs, lost = salvageSuspended(b)
		instead := fmt.Sprintf("its %d suspension record(s) were read as far as they decode, to be resumed", len(recs))
		switch {
		case lost < 0:
			instead = "no suspension record could be read from it: a process it names may stay suspended until an arbiter that reads it runs `arbiter recover`"
		case lost > 0:
			instead += fmt.Sprintf("; %d could not be read: a process they name may stay suspended until an arbiter that reads the file runs `arbiter recover`", lost)
		}
		r.refused = append(r.refused, &FormatError{Path: path, Version: head.Version, Instead: instead})
	}
	for _, s := range recs {
		// Kept even where the tree was not saved: the record alone
		// (client, group, descriptor, start time) is enough to resume.
		if r.alive(s.PID, s.StartTime) {
			r.suspended[groupKey{s.PID, s.Group.Client, s.Group.Handle}] = s
		}
	}
	return nil
}

// alive reports whether pid still runs as the process that started at
// start (0: unknown, existence only).
func (r *Registry) alive(pid uint32, start uint64) bool {
	now := r.opts.StartTime(pid)
	return now != 0 && (start == 0 || now == start)
}

// markSuspended records groups as suspended (again, where a record's
// method changed) and saves the records before the caller disables them.
func (r *Registry) markSuspended(recs []SuspendedGroup) error {
	r.mu.Lock()
	for _, s := range recs {
		s.Group.Suspended = true
		r.suspended[groupKey{s.PID, s.Group.Client, s.Group.Handle}] = s
	}
	r.mu.Unlock()
	return r.saveSuspended()
}

// suspensionRecords returns records of pid's groups suspended with the
// per-group controls (SuspendSchedule).
func (r *Registry) suspensionRecords(pid uint32, groups []Group) []SuspendedGroup {
	r.mu.Lock()
	var start uint64
	if p := r.procs[pid]; p != nil {
		start = p.start
	}
	r.mu.Unlock()
	out := make([]SuspendedGroup, len(groups))
	for i, g := range groups {
		out[i] = SuspendedGroup{PID: pid, StartTime: start, Group: g, Method: SuspendSchedule}
	}
	return out
}

// suspendedOf returns pid's suspension records, by client and group.
func (r *Registry) suspendedOf(pid uint32) map[[2]uint32]SuspendedGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[[2]uint32]SuspendedGroup{}
	for k, s := range r.suspended {
		if k.PID == pid {
			out[[2]uint32{k.Client, k.Group}] = s
		}
	}
	return out
}

// clearSuspended forgets groups once resumed, and saves.
func (r *Registry) clearSuspended(pid uint32, groups []Group) error {
	r.mu.Lock()
	for _, g := range groups {
		delete(r.suspended, groupKey{pid, g.Client, g.Handle})
	}
	r.mu.Unlock()
	return r.saveSuspended()
}

// Suspended returns the channel groups Arbiter holds suspended.
func (r *Registry) Suspended() []SuspendedGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SuspendedGroup, 0, len(r.suspended))
	for _, s := range r.suspended {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b SuspendedGroup) int {
		if a.PID != b.PID {
			return cmpU32(a.PID, b.PID)
		}
		return cmpU32(a.Group.Handle, b.Group.Handle)
	})
	return out
}

// writeAtomic writes b to path through a temporary file and a rename. It
// does not fsync: the files must survive the daemon's death, which a
// completed write does, not the machine's, after which none of the
// processes they describe exists. Syncing would put a disk flush on the
// suspend path.
func writeAtomic(path string, b []byte) error {
	// Plain system calls and a fixed temporary name (one keeper writes,
	// under its lock): os.CreateTemp's poller registration and random
	// names cost more than the write itself.
	tmp := path + ".tmp"
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC
	fd, err := unix.Open(tmp, flags, 0o600)
	if errors.Is(err, unix.ENOENT) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return fmt.Errorf("nvrm: state directory: %w", err)
		}
		fd, err = unix.Open(tmp, flags, 0o600)
	}
	if err != nil {
		return fmt.Errorf("nvrm: write state %s: %w", path, err)
	}
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			unix.Close(fd)
			unix.Unlink(tmp)
			return fmt.Errorf("nvrm: write state %s: %w", path, err)
		}
		b = b[n:]
	}
	if err := unix.Close(fd); err != nil {
		unix.Unlink(tmp)
		return fmt.Errorf("nvrm: write state %s: %w", path, err)
	}
	if err := unix.Rename(tmp, path); err != nil {
		unix.Unlink(tmp)
		return fmt.Errorf("nvrm: write state %s: %w", path, err)
	}
	return nil
}
