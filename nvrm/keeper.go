package nvrm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/trace"
)

// DefaultStateDir holds the registry's state file and the keeper lock:
// nvrm/ in the daemon's default state directory, where the daemon and
// arbiter channels keep them unless configured otherwise. State of an
// earlier boot is dropped on reading (the files carry the boot id).
const DefaultStateDir = "/var/lib/arbiter/nvrm"

// ErrKeeperRunning is returned by OpenKeeper while another process keeps
// the registry.
var ErrKeeperRunning = errors.New("the RM registry is kept by another running arbiter")

// TraceMode says whether a Keeper attaches the tracer.
type TraceMode uint8

// Trace modes.
const (
	// TraceIfPinned reads a tracer a previous keeper left pinned, and
	// attaches none otherwise: one-shot commands use what a daemon set
	// up, without installing a tracer that outlives them.
	TraceIfPinned TraceMode = iota
	// TraceAlways attaches the tracer (reusing pins where they exist).
	TraceAlways
	// TraceNever works from the state file alone.
	TraceNever
)

// Keeper owns the registry on a node: it holds an exclusive lock in the
// state directory, feeds the tracer's events into the registry, saves its
// state file after each change, keeps Arbiter's timeslices applied
// (Controller.Follow), and resumes the channel groups a previous keeper
// left suspended when it starts and its own when it closes.
type Keeper struct {
	opts KeeperOptions
	lock *os.File
	tr   *Tracer
	reg  *Registry
	ctrl *Controller
	// ResumeErr is what resuming a previous keeper's suspended groups
	// returned at start, nil if all went well.
	ResumeErr error
}

// KeeperOptions configures a Keeper.
type KeeperOptions struct {
	// StateDir holds the state file and the lock; empty is
	// DefaultStateDir.
	StateDir string
	// Trace chooses whether a tracer is attached.
	Trace TraceMode
	// Tracer configures the tracer; its PinPath, where set, makes the
	// tracer outlive the keeper (needed for TraceIfPinned to find it).
	Tracer TracerOptions
	// Controller configures channel control; a zero Layout leaves the
	// keeper without a Controller (tracing only).
	Controller ControllerOptions
	// Unpin removes the tracer's pins at Close: tracing stops for good.
	Unpin bool
}

// OpenKeeper takes the keeper lock, loads the registry, attaches or
// reopens the tracer and applies what it recorded while no keeper ran,
// then resumes groups a previous keeper left suspended. It returns an
// error wrapping ErrKeeperRunning, naming the holder, if another keeper
// runs.
func OpenKeeper(opts *KeeperOptions) (*Keeper, error) {
	k := &Keeper{}
	if opts != nil {
		k.opts = *opts
	}
	if k.opts.StateDir == "" {
		k.opts.StateDir = DefaultStateDir
	}
	if err := k.takeLock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			k.closeAll()
		}
	}()
	var err error
	k.reg, err = NewRegistry(&RegistryOptions{StatePath: filepath.Join(k.opts.StateDir, "state.json")})
	if err != nil {
		return nil, err
	}
	if k.opts.Controller.Layout.ScheduleSize != 0 {
		if k.ctrl, err = NewController(k.reg, &k.opts.Controller); err != nil {
			return nil, err
		}
	}
	attach := k.opts.Trace == TraceAlways
	if k.opts.Trace == TraceIfPinned && k.opts.Tracer.PinPath != "" {
		_, err := os.Stat(filepath.Join(k.opts.Tracer.PinPath, "link_nvrm_enter"))
		attach = err == nil
	}
	if attach {
		if k.tr, err = NewTracer(&k.opts.Tracer); err != nil {
			return nil, err
		}
		if _, err := k.tr.Drain(func(ev *trace.Event) { k.apply(ev) }); err != nil {
			return nil, err
		}
	}
	if err := k.reg.Save(); err != nil {
		return nil, err
	}
	if k.ctrl != nil {
		k.ResumeErr = k.ctrl.ResumeAll()
	}
	ok = true
	return k, nil
}

// takeLock takes the state directory's lock file without waiting.
func (k *Keeper) takeLock() error {
	if err := os.MkdirAll(k.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("nvrm: state directory: %w", err)
	}
	path := filepath.Join(k.opts.StateDir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("nvrm: keeper lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("nvrm: %w (pid %s, lock %s)", ErrKeeperRunning, strings.TrimSpace(string(b)), path)
		}
		return fmt.Errorf("nvrm: keeper lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	k.lock = f
	return nil
}

// Registry returns the kept registry.
func (k *Keeper) Registry() *Registry { return k.reg }

// Controller returns the channel controller, nil without a driver layout.
func (k *Keeper) Controller() *Controller { return k.ctrl }

// Tracing reports whether a tracer feeds the registry.
func (k *Keeper) Tracing() bool { return k.tr != nil }

// Tracer returns the tracer, nil where none is attached.
func (k *Keeper) Tracer() *Tracer { return k.tr }

// KeeperEvent is one traced event as the keeper applied it.
type KeeperEvent struct {
	Event  trace.Event
	Change Change
	// Err is what re-applying Arbiter's settings after the event
	// returned (Controller.Follow), or a record that failed to decode.
	Err error
}

// apply feeds one event to the registry and the controller.
func (k *Keeper) apply(ev *trace.Event) KeeperEvent {
	ch := k.reg.Apply(ev)
	out := KeeperEvent{Event: *ev, Change: ch}
	if k.ctrl != nil {
		out.Err = k.ctrl.Follow(ch)
	}
	return out
}

// PruneInterval is how often a running Keeper drops processes that exited
// without their exit being traced (a record lost to a full ring buffer).
const PruneInterval = 10 * time.Second

// Run applies traced events until ctx is done and calls fn (if not nil)
// with each. It saves the state file once the ring buffer is drained after
// a change — at once for a lone event, once per burst for a CUDA context's
// dozens of allocations — so the file never lags what was read by more
// than the burst in hand. It returns nil when ctx ends, or the error that
// stopped it.
func (k *Keeper) Run(ctx context.Context, fn func(KeeperEvent)) error {
	if k.tr == nil {
		return errors.New("nvrm: keeper has no tracer")
	}
	var ev trace.Event
	dirty := false
	nextPrune := time.Now().Add(PruneInterval)
	for ctx.Err() == nil {
		if dirty && k.tr.Pending() == 0 {
			if err := k.reg.Save(); err != nil {
				return err
			}
			dirty = false
		}
		if now := time.Now(); now.After(nextPrune) {
			if k.reg.Prune() > 0 {
				dirty = true
			}
			nextPrune = now.Add(PruneInterval)
		}
		k.tr.SetDeadline(time.Now().Add(100 * time.Millisecond))
		err := k.tr.Read(&ev)
		var de *DecodeError
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case errors.As(err, &de):
			if fn != nil {
				fn(KeeperEvent{Err: err})
			}
			continue
		case err != nil:
			return err
		}
		ke := k.apply(&ev)
		if ke.Change.Kind != ChangeNone {
			dirty = true
		}
		if fn != nil {
			fn(ke)
		}
	}
	if dirty {
		return k.reg.Save()
	}
	return nil
}

// Close resumes every group this keeper suspended (a clean exit never
// leaves a process suspended), saves the state, detaches the tracer (its
// pins stay unless Unpin) and releases the lock. It is idempotent.
func (k *Keeper) Close() error {
	var errs []error
	if k.ctrl != nil {
		errs = append(errs, k.ctrl.ResumeAll())
	}
	if k.reg != nil {
		errs = append(errs, k.reg.Save())
	}
	if k.tr != nil && k.opts.Unpin {
		errs = append(errs, k.tr.Unpin())
	}
	errs = append(errs, k.closeAll())
	return errors.Join(errs...)
}

func (k *Keeper) closeAll() error {
	var errs []error
	if k.tr != nil {
		errs = append(errs, k.tr.Close())
		k.tr = nil
	}
	if k.ctrl != nil {
		errs = append(errs, k.ctrl.Close())
		k.ctrl = nil
	}
	if k.reg != nil {
		errs = append(errs, k.reg.Close())
	}
	if k.lock != nil {
		_ = k.lock.Truncate(0)
		errs = append(errs, k.lock.Close())
		k.lock = nil
	}
	return errors.Join(errs...)
}

// ReadState returns the registry as last saved in stateDir (empty:
// DefaultStateDir), for a reader while a keeper runs elsewhere. It is a
// snapshot: nothing is traced or saved through it.
func ReadState(stateDir string) (*Registry, error) {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	r, err := NewRegistry(&RegistryOptions{StatePath: filepath.Join(stateDir, "state.json")})
	if err != nil {
		return nil, err
	}
	r.opts.StatePath = "" // read-only
	return r, nil
}
