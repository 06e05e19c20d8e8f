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

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// recoverOptions are the flags of `arbiter recover`.
type recoverOptions struct {
	gatePinDir string
	format     string
	// channels holds the state directory and the driver flags that
	// resuming channel groups shares with `arbiter channels`.
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
daemon's state file records as suspended.

It is meant for the service manager's stop hook (ExecStopPost= in systemd),
run after the daemon exited however it exited. It needs no daemon, is safe
to run again, and says "nothing to recover" where nothing was left. It
refuses to run while an arbiter keeps the state directory. Every process is
tried; the command exits non-zero if anything could not be released, after
saying what.`,
		Example: `  sudo arbiter recover
  sudo arbiter recover --format json

  # systemd unit of the daemon
  ExecStopPost=/usr/local/bin/arbiter recover`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.OutOrStdout())
		},
	}
	// By default recover looks where the daemon's configuration says it
	// keeps its state, as a service manager's stop-post hook runs it with
	// no flags.
	daemonCfg, _, err := config.Resolve("")
	if err != nil {
		daemonCfg = config.Default()
	}
	f := cmd.Flags()
	f.StringVar(&o.gatePinDir, "gate-pin-dir", daemonCfg.BPFFS, "bpffs directory where the daemon pins the launch gate (default: the daemon's --bpffs)")
	f.StringVar(&o.format, "format", "text", "output format: text or json")
	c := &o.channels
	f.StringVar(&c.stateDir, "state-dir", nvrmStateDir(daemonCfg), "directory of the handle registry's state file and lock (default: nvrm/ in the daemon's --state-dir)")
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
	Gate     gateRecovery    `json:"gate"`
	Channels channelRecovery `json:"channels"`
	// Errors are the problems left; the command exits non-zero if any.
	Errors []string `json:"errors"`
	// NothingToRecover is true where nothing was gated or suspended.
	NothingToRecover bool `json:"nothing_to_recover"`
}

// gateRecovery is what recover did with the launch gate.
type gateRecovery struct {
	// Pin is the pinned gate map's path.
	Pin string `json:"pin"`
	// Found is true where a gate was pinned there.
	Found bool `json:"found"`
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
		return fmt.Errorf("--format %q: want text or json", o.format)
	}
	if err := o.channels.requireCaps("releasing what a stopped arbiter left (opening its pinned BPF map, controlling other processes' channels)",
		caps.BPF, caps.SysPtrace); err != nil {
		return err
	}
	rep := &recoverReport{
		Gate:     gateRecovery{Pin: filepath.Join(o.gatePinDir, uprobe.GateMapName), Released: []releasedProcess{}},
		Channels: channelRecovery{StateDir: o.channels.stateDir, Resumed: []resumedProcess{}},
		Errors:   []string{},
	}
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
	if keeper != nil {
		if err := keeper.Close(); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("channels: close the registry: %v", err))
		}
	}
	rep.NothingToRecover = len(rep.Errors) == 0 && !rep.Gate.Found && len(rep.Gate.Released) == 0 && rep.Channels.Suspended == 0
	if err := rep.write(stdout, o.format); err != nil {
		return err
	}
	if n := len(rep.Errors); n > 0 {
		return fmt.Errorf("recover: %d problem(s) left (listed above); run it again once they are fixed", n)
	}
	return nil
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

// releaseGate opens every gate of the pinned gate map and removes the pin.
func (o *recoverOptions) releaseGate(rep *recoverReport) {
	g, err := uprobe.OpenGate(o.gatePinDir)
	if errors.Is(err, uprobe.ErrNoGate) {
		return
	}
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("gate: %v", err))
		return
	}
	defer g.Close()
	rep.Gate.Found = true
	rels, err := g.ReleaseAll()
	for _, r := range rels {
		p := releasedProcess{PID: r.PID, Start: r.Start, Stopped: r.Stopped, Continued: r.Continued, Gone: r.Gone}
		if r.Err != nil {
			p.Error = r.Err.Error()
		}
		rep.Gate.Released = append(rep.Gate.Released, p)
	}
	slices.SortFunc(rep.Gate.Released, func(a, b releasedProcess) int { return int(a.PID) - int(b.PID) })
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("gate: %v", err))
		return // the pin stays: nothing is forgotten
	}
	if err := g.Unpin(); err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("gate: %v", err))
		return
	}
	rep.Gate.Unpinned = true
}

// write prints the report as text or JSON.
func (rep *recoverReport) write(w io.Writer, format string) error {
	if format == "json" {
		return json.NewEncoder(w).Encode(rep)
	}
	for _, p := range rep.Gate.Released {
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
	if rep.Gate.Unpinned {
		if _, err := fmt.Fprintf(w, "gate: removed %s\n", rep.Gate.Pin); err != nil {
			return err
		}
	}
	for _, p := range rep.Channels.Resumed {
		if _, err := fmt.Fprintf(w, "channels: process %d: resumed %d channel group(s)\n", p.PID, p.Groups); err != nil {
			return err
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
