package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// recoverOptions are the flags of `arbiter recover`.
type recoverOptions struct {
	// bpffs and stateDir are the daemon's --bpffs (where it pins the
	// launch gate) and --state-dir (whose nvrm/ holds the suspension
	// records), as arbiter run takes them.
	bpffs    string
	stateDir string
	format   string
	// detach also detaches the driver-call tracer and drops the handles
	// it kept, for removing arbiter.
	detach bool
	cfgErr error // why the daemon's config file did not give the defaults
	// givenBPFFS and givenStateDir are set where the flags named the
	// paths: one that names nothing there is likely a mistyped path, which
	// would otherwise read as nothing to recover.
	givenBPFFS, givenStateDir bool
	// channels holds the registry directory (nvrm/ in stateDir) and the
	// driver flags that resuming channel groups shares with `arbiter
	// channels`.
	channels channelsOptions
}

// newRecoverCmd builds `arbiter recover`.
func newRecoverCmd() *cobra.Command { return newRecoverCmdWith(&recoverOptions{}) }

// newRecoverCmdWith builds `arbiter recover` on o, which tests prefill.
func newRecoverCmdWith(o *recoverOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Release every process a stopped arbiter left gated or suspended",
		Long: `Recover undoes what an arbiter daemon that is no longer running left in
force, so that no application stays stopped or off the GPU: it continues
every process the launch gate stopped (and only those: a process stopped
by anyone else stays stopped; a pid now used by another process is never
signalled), removes the pinned gate, and resumes every channel group the
daemon's state file records as suspended. State left by another version
of arbiter is released too: a launch gate pinned in another format, and
the suspension records of a state file of a format it does not read (it
names the file, the version found and the versions it reads).

It is meant for the service manager's stop hook (ExecStopPost= in systemd),
run after the daemon exited however it exited. It looks where the daemon's
config file says the daemon keeps its state; a daemon run with its own
--state-dir and --bpffs is recovered with the same two flags. It needs no
daemon, is safe to run again, and says "nothing to recover" where nothing
was left. It refuses to run while an arbiter keeps the state directory.
Every process is tried; the command exits non-zero if anything could not
be released, after saying what.

With --detach, once everything is released, it also detaches the
driver-call tracer the daemon keeps pinned across restarts (nvrm/ under
--bpffs), which would otherwise run on every NVIDIA ioctl until the next
boot, and drops the driver handles the tracer kept true (nvrm/state.json
under --state-dir): for removing arbiter, as the packages do. A daemon
started later learns the handles again from new allocations. Where
something could not be released, nothing is detached. A failure to detach
is a warning: nothing is left stopped or suspended for it.`,
		Example: `  sudo arbiter recover
  sudo arbiter recover --format json
  sudo arbiter recover --detach      # before removing arbiter

  # systemd unit of the daemon
  ExecStopPost=/usr/bin/arbiter recover`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			warnDefaults(cmd.ErrOrStderr(), cmd, o.cfgErr, "bpffs", "state-dir")
			o.channels.stateDir = nvrmStateDir(config.Config{StateDir: o.stateDir})
			o.givenBPFFS = cmd.Flags().Changed("bpffs") || cmd.Flags().Changed("gate-pin-dir")
			o.givenStateDir = cmd.Flags().Changed("state-dir")
			return o.run(cmd.OutOrStdout())
		},
	}
	// By default recover looks where the daemon's configuration says it
	// keeps its state, as a service manager's stop-post hook runs it with
	// no flags.
	daemonCfg, err := daemonDefaults()
	o.cfgErr = err
	f := cmd.Flags()
	f.StringVar(&o.bpffs, "bpffs", daemonCfg.BPFFS, "the daemon's --bpffs, where it pins the launch gate; the default is from its config file")
	f.StringVar(&o.stateDir, "state-dir", daemonCfg.StateDir, "the daemon's --state-dir, whose nvrm/ holds what it suspended; the default is from its config file")
	f.StringVar(&o.format, "format", "text", "output format: text or json")
	f.BoolVar(&o.detach, "detach", false, "also detach the pinned driver-call tracer and drop the driver handles it kept, once everything is released: for removing arbiter")
	// The flag's earlier name.
	f.StringVar(&o.bpffs, "gate-pin-dir", daemonCfg.BPFFS, "")
	_ = f.MarkDeprecated("gate-pin-dir", "use --bpffs, as arbiter run takes it")
	c := &o.channels
	f.StringVar(&c.control, "control", nvrm.ControlPath, "the driver's control device")
	f.StringVar(&c.controlRdev, "control-rdev", "195:255", "the control device's number (major:minor)")
	f.IntVar(&c.acceptErrno, "accept-errno", 0, "treat ioctls failing with this errno as run by RM (stand-in control files only)")
	f.StringVar(&c.driverVersion, "driver-version", "", "driver version whose layouts to use, instead of the loaded driver's")
	f.BoolVar(&c.allowUnverified, "allow-unverified-driver", false,
		fmt.Sprintf("accept a driver newer than %s, the newest whose layouts were checked, with that branch's layouts (at your own risk)", nvrm.NewestVerifiedDriver()))
	for _, h := range []string{"control", "control-rdev", "accept-errno", "driver-version"} {
		_ = f.MarkHidden(h)
	}
	return cmd
}

// recoverReport is what recover did, as --format json writes it.
type recoverReport struct {
	Gate gateRecovery `json:"gate"`
	// OtherGates are the gates pinned in another format version than
	// this build's (a newer or an older arbiter's), each released as far
	// as it could be.
	OtherGates []gateRecovery  `json:"other_gates"`
	Channels   channelRecovery `json:"channels"`
	// Warnings name the state this build did not read for its format
	// version (see docs/install.md, "Upgrading"), and what it did
	// instead.
	Warnings []string `json:"warnings"`
	// Errors are the problems left; the command exits non-zero if any.
	Errors []string `json:"errors"`
	// NothingToRecover is true where nothing was gated or suspended.
	NothingToRecover bool `json:"nothing_to_recover"`
	// Tracer is what --detach did with the driver-call tracer (absent
	// without --detach).
	Tracer *tracerRecovery `json:"tracer,omitempty"`
}

// tracerRecovery is what --detach did with the driver-call tracer.
type tracerRecovery struct {
	// Pin is where the daemon pins the tracer; Detached is true where a
	// tracer was pinned there and is detached now.
	Pin      string `json:"pin"`
	Detached bool   `json:"detached"`
	// State is the driver handles' file; Dropped is true where it was
	// there and is removed now.
	State   string `json:"state"`
	Dropped bool   `json:"dropped"`
	// NotDetached says why nothing was detached (something is left to
	// release), empty otherwise.
	NotDetached string `json:"not_detached,omitempty"`
}

// gateRecovery is what recover did with the launch gate.
type gateRecovery struct {
	// Pin is the pinned gate map's path.
	Pin string `json:"pin"`
	// Format is the gate's format version (uprobe.GateFormat is this
	// build's).
	Format int `json:"format"`
	// Found is true where a gate, or its stop records, were pinned there.
	Found bool `json:"found"`
	// Records is the pin of the gate's stop records (the processes it
	// stopped and had not continued yet), where they were pinned.
	Records string `json:"records,omitempty"`
	// gatePinned is whether Pin held a gate (records can be pinned
	// alone).
	gatePinned bool
	// Released lists the processes whose gate was opened.
	Released []releasedProcess `json:"released"`
	// Unpinned is true where the pin was removed.
	Unpinned bool `json:"unpinned"`
}

// releasedProcess is one process whose gate recover opened.
type releasedProcess struct {
	PID uint32 `json:"pid"`
	// Start is its start time, clock ticks after boot.
	Start uint64 `json:"start"`
	// Stopped says the gate had stopped it; Continued that it got
	// SIGCONT; Gone that it had exited (or its pid is another process's).
	Stopped   bool   `json:"stopped"`
	Continued bool   `json:"continued"`
	Gone      bool   `json:"gone"`
	Error     string `json:"error,omitempty"`
}

// channelRecovery is what recover did with suspended channel groups.
type channelRecovery struct {
	StateDir string `json:"state_dir"`
	// Suspended counts the groups recorded as suspended, of processes
	// that still run.
	Suspended int `json:"suspended"`
	// Resumed lists, per process, the groups resumed.
	Resumed []resumedProcess `json:"resumed"`
}

// resumedProcess is one process whose channel groups recover resumed.
type resumedProcess struct {
	PID    uint32 `json:"pid"`
	Groups int    `json:"groups"`
}

// run recovers and reports; it returns an error if anything is left.
func (o *recoverOptions) run(stdout io.Writer) error {
	if o.format != "text" && o.format != "json" {
		return usageErrorf("--format %q: want text or json", o.format)
	}
	if err := o.channels.requireCaps("releasing what a stopped arbiter left (opening its pinned BPF map, controlling other processes' channels)",
		caps.BPF, caps.SysPtrace); err != nil {
		return err
	}
	rep := &recoverReport{
		Gate:       gateRecovery{Pin: filepath.Join(o.bpffs, uprobe.GateMapName), Format: uprobe.GateFormat, Released: []releasedProcess{}},
		OtherGates: []gateRecovery{},
		Channels:   channelRecovery{StateDir: o.channels.stateDir, Resumed: []resumedProcess{}},
		Warnings:   []string{},
		Errors:     []string{},
	}
	// Resuming opens the registry, which writes its state file back:
	// whether one was there before says whether --detach drops handles.
	_, statErr := os.Stat(filepath.Join(o.channels.stateDir, "state.json"))
	hadState := statErr == nil
	keeper, err := o.resumeChannels(rep)
	if errors.Is(err, nvrm.ErrKeeperRunning) {
		return fmt.Errorf("%w\n  recover releases what a stopped arbiter left: stop the running one first (it releases its own at exit)", err)
	}
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	// The keeper lock, where taken, is held while the gate is released, so
	// that no daemon starts meanwhile.
	o.releaseGate(rep)
	for _, g := range otherGates(o.bpffs) {
		rep.OtherGates = append(rep.OtherGates, g.rec)
		rep.Warnings = append(rep.Warnings, g.refusal)
		rep.Errors = append(rep.Errors, g.errs...)
	}
	if keeper != nil {
		if err := keeper.Close(); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("channels: close the registry: %v", err))
		}
	}
	rep.NothingToRecover = len(rep.Errors) == 0 && !rep.Gate.Found && len(rep.Gate.Released) == 0 && len(rep.OtherGates) == 0 && rep.Channels.Suspended == 0
	o.warnNothingThere(rep)
	if o.detach {
		o.detachTracer(rep, hadState)
		if t := rep.Tracer; t != nil && (t.Detached || t.Dropped) {
			rep.NothingToRecover = false
		}
	}
	if err := rep.write(stdout, o.format); err != nil {
		return err
	}
	if n := len(rep.Errors); n > 0 {
		where := "listed above"
		if o.format == "json" {
			where = "the report's errors"
		}
		return fmt.Errorf("recover: %d problem(s) left (%s); run it again once they are fixed", n, where)
	}
	return nil
}

// warnNothingThere warns of a --state-dir or --bpffs given on the
// command line that names nothing a daemon could have left: no such
// directory, or, for --bpffs, one that is not on a BPF filesystem.
func (o *recoverOptions) warnNothingThere(rep *recoverReport) {
	if o.givenStateDir {
		if _, err := os.Stat(o.stateDir); err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("--state-dir %s: %v: no daemon kept state there yet (if one ran, is this its --state-dir?)", o.stateDir, errors.Unwrap(err)))
		}
	}
	if !o.givenBPFFS {
		return
	}
	// The daemon makes its directory on the BPF filesystem when it first
	// pins: where it is not there, the nearest directory above it is what
	// says whether it could be.
	at := filepath.Clean(o.bpffs)
	var st unix.Statfs_t
	for {
		err := unix.Statfs(at, &st)
		if err == nil {
			break
		}
		if parent := filepath.Dir(at); err == unix.ENOENT && parent != at {
			at = parent
			continue
		}
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("--bpffs %s: %v: nothing looked at there (if a daemon ran, is this its --bpffs?)", o.bpffs, err))
		return
	}
	if st.Type != unix.BPF_FS_MAGIC {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("--bpffs %s: not on a BPF filesystem (%s is not): no daemon pinned anything there yet (if one ran, is this its --bpffs?)", o.bpffs, at))
	}
}

// resumeChannels resumes the channel groups recorded as suspended. It
// returns the keeper it opened (holding the state directory's lock), nil
// where there is no state directory.
func (o *recoverOptions) resumeChannels(rep *recoverReport) (*nvrm.Keeper, error) {
	dir := o.channels.stateDir
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // no arbiter ever kept a registry here
	}
	reg, err := nvrm.ReadState(dir)
	if err != nil {
		return nil, fmt.Errorf("channels: %w", err)
	}
	for _, r := range reg.Refused() {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("channels: %v", r))
	}
	before := reg.Suspended()
	if err := reg.Close(); err != nil {
		return nil, fmt.Errorf("channels: %w", err)
	}
	rep.Channels.Suspended = len(before)
	// The keeper resumes a previous keeper's suspended groups as it
	// opens: that is the whole of the work. Without suspended groups it
	// only takes the lock (and needs no driver).
	k, warn, err := o.channels.keeper(keeperMode{trace: nvrm.TraceNever, control: len(before) > 0})
	if err != nil {
		if errors.Is(err, nvrm.ErrKeeperRunning) {
			return nil, err
		}
		return nil, fmt.Errorf("channels: cannot resume %d suspended channel group(s): %w", len(before), err)
	}
	if warn != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("channels: %v", warn))
	}
	left := map[[3]uint32]bool{}
	for _, s := range k.Registry().Suspended() {
		left[[3]uint32{s.PID, s.Group.Client, s.Group.Handle}] = true
	}
	counts := map[uint32]int{}
	for _, s := range before {
		if !left[[3]uint32{s.PID, s.Group.Client, s.Group.Handle}] {
			counts[s.PID]++
		}
	}
	for pid, n := range counts {
		rep.Channels.Resumed = append(rep.Channels.Resumed, resumedProcess{PID: pid, Groups: n})
	}
	slices.SortFunc(rep.Channels.Resumed, func(a, b resumedProcess) int { return int(a.PID) - int(b.PID) })
	if k.ResumeErr != nil {
		return k, fmt.Errorf("channels: %w", k.ResumeErr)
	}
	return k, nil
}

// detachTracer detaches the driver-call tracer pinned under --bpffs and
// removes the driver handles it kept (reported where hadState: the file
// was there before recover opened the registry, which writes it back),
// unless something is left to release: the tracer and the handles are
// what resuming a suspended channel group needs. It reopens the tracer
// through a keeper, which takes the state directory's lock (no daemon
// starts meanwhile) and records what the tracer holds before it unpins
// it. Its problems are warnings: nothing is left stopped or suspended
// for them.
func (o *recoverOptions) detachTracer(rep *recoverReport, hadState bool) {
	t := &tracerRecovery{Pin: filepath.Join(o.bpffs, "nvrm"), State: filepath.Join(o.channels.stateDir, "state.json")}
	rep.Tracer = t
	if len(rep.Errors) > 0 {
		t.NotDetached = "something is left to release (above): the tracer and the driver handles stay, for a later recover"
		return
	}
	if _, err := os.Stat(filepath.Join(t.Pin, "link_nvrm_enter")); err == nil {
		o.channels.pinPath = t.Pin
		k, _, err := o.channels.keeper(keeperMode{trace: nvrm.TraceIfPinned, unpin: true})
		if err == nil {
			err = k.Close()
		}
		if err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("tracer: not detached (remove %s by hand: sudo rm -r %s): %v", t.Pin, t.Pin, err))
			return
		}
		t.Detached = true
	} else if !errors.Is(err, os.ErrNotExist) {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("tracer: %v", err))
		return
	}
	switch err := os.Remove(t.State); {
	case err == nil:
		t.Dropped = hadState
	case !errors.Is(err, os.ErrNotExist):
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("tracer: driver handles not dropped: %v", err))
	}
}

// releaseGate opens every gate of the pinned gate map and removes the pin.
func (o *recoverOptions) releaseGate(rep *recoverReport) {
	errs := releasePin(uprobe.GatePin{Path: rep.Gate.Pin, Format: uprobe.GateFormat}, &rep.Gate)
	rep.Errors = append(rep.Errors, errs...)
}

// otherGate is what releasing a gate of another format did.
type otherGate struct {
	rec gateRecovery
	// refusal says that this build does not gate with it, and why it
	// released it all the same.
	refusal string
	errs    []string
}

// otherGates releases every gate pinned in dir in another format than
// this build's (uprobe.GateFormat) and removes its pin: the daemon at its
// start, and recover, leave no process stopped because a different
// version of arbiter stopped it.
func otherGates(dir string) []otherGate {
	pins, err := uprobe.FindGates(dir)
	if err != nil {
		return []otherGate{{rec: gateRecovery{Pin: dir, Released: []releasedProcess{}}, refusal: "gate: cannot look for gates of other formats", errs: []string{fmt.Sprintf("gate: %v", err)}}}
	}
	var out []otherGate
	for _, p := range pins {
		if p.Format == uprobe.GateFormat {
			continue
		}
		g := otherGate{rec: gateRecovery{Pin: p.Path, Format: p.Format, Released: []releasedProcess{}}}
		who := "a newer arbiter's"
		if p.Format < uprobe.GateFormat {
			who = "an older arbiter's"
		}
		g.refusal = fmt.Sprintf("gate: %s has launch gate format version %d (%s); this arbiter gates only with version %d: not used: its processes are released through the fields every format keeps, and its pin removed once empty",
			p.Path, p.Format, who, uprobe.GateFormat)
		g.errs = releasePin(p, &g.rec)
		out = append(out, g)
	}
	return out
}

// releasePin opens every gate of the gate pinned at p into rec and
// removes the pin; it returns the problems left.
func releasePin(p uprobe.GatePin, rec *gateRecovery) []string {
	g, err := uprobe.OpenGatePin(p)
	if errors.Is(err, uprobe.ErrNoGate) {
		return nil
	}
	if err != nil {
		return []string{fmt.Sprintf("gate: %v", err)}
	}
	defer g.Close()
	rec.Found = true
	var records bool
	rec.gatePinned, records = g.Pinned()
	if records {
		rec.Records = filepath.Join(filepath.Dir(p.Path), uprobe.StopsMapName)
	}
	var errs []string
	rels, err := g.ReleaseAll()
	for _, r := range rels {
		p := releasedProcess{PID: r.PID, Start: r.Start, Stopped: r.Stopped, Continued: r.Continued, Gone: r.Gone}
		if r.Err != nil {
			p.Error = r.Err.Error()
		}
		rec.Released = append(rec.Released, p)
	}
	slices.SortFunc(rec.Released, func(a, b releasedProcess) int { return int(a.PID) - int(b.PID) })
	if err != nil {
		return append(errs, fmt.Sprintf("gate: %v", err)) // the pin stays: nothing is forgotten
	}
	if err := g.Unpin(); err != nil {
		return append(errs, fmt.Sprintf("gate: %v", err))
	}
	rec.Unpinned = true
	return errs
}

// write prints the report as text or JSON.
func (rep *recoverReport) write(w io.Writer, format string) error {
	if format == "json" {
		return json.NewEncoder(w).Encode(rep)
	}
	for _, msg := range rep.Warnings {
		if _, err := fmt.Fprintf(w, "warning: %s\n", msg); err != nil {
			return err
		}
	}
	for _, g := range append([]gateRecovery{rep.Gate}, rep.OtherGates...) {
		if err := g.write(w); err != nil {
			return err
		}
	}
	for _, p := range rep.Channels.Resumed {
		if _, err := fmt.Fprintf(w, "channels: process %d: resumed %d channel group(s)\n", p.PID, p.Groups); err != nil {
			return err
		}
	}
	if t := rep.Tracer; t != nil {
		if t.Detached {
			if _, err := fmt.Fprintf(w, "tracer: detached the driver-call tracer pinned at %s\n", t.Pin); err != nil {
				return err
			}
		}
		if t.Dropped {
			if _, err := fmt.Fprintf(w, "tracer: dropped the driver handles in %s\n", t.State); err != nil {
				return err
			}
		}
		if t.NotDetached != "" {
			if _, err := fmt.Fprintf(w, "tracer: not detached: %s\n", t.NotDetached); err != nil {
				return err
			}
		}
	}
	for _, e := range rep.Errors {
		if _, err := fmt.Fprintf(w, "error: %s\n", e); err != nil {
			return err
		}
	}
	if rep.NothingToRecover {
		_, err := fmt.Fprintln(w, "nothing to recover")
		return err
	}
	return nil
}

// write prints what releasing one gate did, a line per process.
func (g *gateRecovery) write(w io.Writer) error {
	for _, p := range g.Released {
		var what string
		switch {
		case p.Error != "":
			what = "NOT continued: " + p.Error
		case p.Continued:
			what = "continued (the gate had stopped it)"
		case p.Gone:
			what = "released (exited, or its pid is another process's now: not signalled)"
		default:
			what = "released (it was not stopped)"
		}
		if _, err := fmt.Fprintf(w, "gate: process %d (start %d): %s\n", p.PID, p.Start, what); err != nil {
			return err
		}
	}
	for _, pin := range []string{g.Pin, g.Records} {
		if !g.Unpinned || pin == "" || (pin == g.Pin && !g.gatePinned) {
			continue
		}
		if _, err := fmt.Fprintf(w, "gate: removed %s\n", pin); err != nil {
			return err
		}
	}
	return nil
}
