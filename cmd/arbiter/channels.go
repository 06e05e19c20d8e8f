package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
)

// channelsOptions are the flags shared by the `arbiter channels` commands.
type channelsOptions struct {
	stateDir string
	pinPath  string
	cfgErr   error // why the daemon's config file did not give the defaults
	gpu      int
	format   string
	// allowUnverified accepts a driver newer than the newest verified.
	allowUnverified bool

	// Hidden: they point the commands at a stand-in control file in tests
	// and let an operator override what is detected.
	control       string // the control device's path
	controlRdev   string // its device number, "major:minor"
	acceptErrno   int    // ioctl errno treated as "RM ran" (stand-in)
	driverVersion string // overrides the loaded driver's version

	// Set by tests; nil in production.
	haveCaps func() (caps.Set, error)
	procRoot string // default "/proc"
}

// newChannelsCmd builds `arbiter channels`.
func newChannelsCmd() *cobra.Command { return newChannelsCmdWith(&channelsOptions{}) }

// newChannelsCmdWith builds `arbiter channels` on o, which tests prefill.
func newChannelsCmdWith(o *channelsOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "channels",
		Short: "List and control CUDA processes' GPU channel groups through the NVIDIA driver",
		Long: `Channels shows and controls the GPU channel groups (TSGs) of CUDA processes
through the NVIDIA driver's own Resource Manager controls, on a stock driver
and with no change to the applications: timeslice, interleave level, suspend
(scheduling disabled and preempted off the GPU) and resume. With no command
it lists them, as "channels list" does.

Arbiter learns each process's RM handles by tracing its allocation ioctls on
/dev/nvidiactl with eBPF; the driver offers no way to list them. So a process
is controllable only if a tracer ran when it created its CUDA context: the
daemon (arbiter run) or "arbiter channels watch", which leave the tracer
pinned under /sys/fs/bpf so that the handles keep being recorded after they
exit, and commands run later read them. Processes using the driver whose
allocations were not seen are listed as unknown and never guessed at.

Control takes the process's own control file with pidfd_getfd (root, or
CAP_SYS_PTRACE plus access to the device nodes) and closes it at once.`,
		Example: `  sudo arbiter channels watch &        # trace allocations from now on
  sudo arbiter channels list
  sudo arbiter channels timeslice 4242 200
  sudo arbiter channels suspend 4242 --for 5s
  sudo arbiter channels resume 4242`,
	}
	// By default the commands use the daemon's registry, lock and pinned
	// tracer, where its configuration says they are: with a daemon
	// running, they find it keeping the registry, read its saved state and
	// leave control to it, rather than keep a second registry and drain
	// the tracer it reads.
	daemonCfg, err := daemonDefaults()
	o.cfgErr = err
	p := cmd.PersistentFlags()
	p.StringVar(&o.format, "format", "text", "output: text or json (with json, errors too are written to stdout as JSON)")
	p.StringVar(&o.stateDir, "state-dir", nvrmStateDir(daemonCfg),
		"directory of the handle registry's state file and lock; the default is the daemon's (nvrm/ in its state directory, from its config file)")
	p.StringVar(&o.pinPath, "pin-path", nvrmPinPath(daemonCfg),
		"bpffs directory where the tracer is pinned; the default is the daemon's (nvrm/ in its bpffs directory, from its config file)")
	p.StringVar(&o.control, "control", nvrm.ControlPath, "the driver's control device")
	p.StringVar(&o.controlRdev, "control-rdev", "195:255", "the control device's number (major:minor)")
	p.IntVar(&o.acceptErrno, "accept-errno", 0, "treat ioctls failing with this errno as run by RM (stand-in control files only)")
	p.StringVar(&o.driverVersion, "driver-version", "", "driver version whose layouts to use, instead of the loaded driver's")
	p.BoolVar(&o.allowUnverified, "allow-unverified-driver", false,
		fmt.Sprintf("accept a driver newer than %s, the newest whose layouts were checked, with that branch's layouts (at your own risk)", nvrm.NewestVerifiedDriver()))
	for _, h := range []string{"control", "control-rdev", "accept-errno", "driver-version"} {
		_ = p.MarkHidden(h)
	}
	cmd.AddCommand(
		newChannelsListCmd(o),
		newChannelsTimesliceCmd(o),
		newChannelsInterleaveCmd(o),
		newChannelsSuspendCmd(o),
		newChannelsResumeCmd(o),
		newChannelsWatchCmd(o),
	)
	// With no command, channels lists, as channels list does.
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageErrorf("unknown command %q%s", args[0], didYouMean(cmd, args[0]))
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return runChannelsList(o, true, cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	o.reportErrors(cmd)
	for _, sub := range cmd.Commands() {
		o.reportErrors(sub)
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageErrorf("%w\nusage: %s", err, c.UseLine())
	})
	return cmd
}

// reportErrors makes sub name its usage line when given the wrong
// arguments, and, with --format json, also write any error it returns to
// stdout as one JSON object, {"error": "...", "exit_code": N}, so that
// stdout holds only JSON; the error still ends the command, with the same
// exit status, and main prints it on stderr as text. (main writes that
// object for any command that fails with --format json before it wrote
// anything; channels writes it itself, its usage line in it.)
func (o *channelsOptions) reportErrors(sub *cobra.Command) {
	validate, run := sub.Args, sub.RunE
	if validate == nil {
		validate = cobra.ArbitraryArgs
	}
	sub.Args = cobra.ArbitraryArgs
	if sub.Annotations == nil {
		sub.Annotations = map[string]string{}
	}
	sub.Annotations[ownUsageErrors] = "channels"
	sub.RunE = func(cmd *cobra.Command, args []string) error {
		if o.format != "text" && o.format != "json" {
			return usageErrorf("--format %q: want text or json\nusage: %s", o.format, cmd.UseLine())
		}
		err := validate(cmd, args)
		if err != nil {
			err = usageErrorf("%s: %w\nusage: %s", cmd.CommandPath(), err, cmd.UseLine())
		} else {
			warnDefaults(cmd.ErrOrStderr(), cmd, o.cfgErr, "state-dir", "pin-path")
			err = run(cmd, args)
		}
		if err != nil && o.format == "json" {
			code := 1
			var ec exitCoder
			if errors.As(err, &ec) {
				code = ec.ExitCode()
			}
			_ = json.NewEncoder(cmd.OutOrStdout()).Encode(jsonError{Error: err.Error(), ExitCode: code})
		}
		return err
	}
}

// jsonError is a failed command's error as --format json writes it.
type jsonError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// errNoDriver says the driver is absent.
var errNoDriver = errors.New("no NVIDIA driver")

// checkDriver fails clearly where the control device is absent.
func (o *channelsOptions) checkDriver() error {
	if _, err := os.Stat(o.control); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %s does not exist (is the nvidia kernel module loaded? nvidia-smi should work)", errNoDriver, o.control)
		}
		return fmt.Errorf("%s: %w", o.control, err)
	}
	return nil
}

// requireCaps names the capabilities an action lacks.
func (o *channelsOptions) requireCaps(what string, want ...caps.Cap) error {
	have := o.haveCaps
	if have == nil {
		have = caps.Effective
	}
	set, err := have()
	if err != nil {
		return err
	}
	return caps.Check(set, what, want...)
}

// rdev parses --control-rdev.
func (o *channelsOptions) rdev() (nvrm.Rdev, error) {
	maj, min, ok := strings.Cut(o.controlRdev, ":")
	a, err1 := strconv.ParseUint(maj, 10, 12)
	b, err2 := strconv.ParseUint(min, 10, 20)
	if !ok || err1 != nil || err2 != nil {
		return 0, usageErrorf("--control-rdev %q: want major:minor, e.g. 195:255", o.controlRdev)
	}
	return nvrm.MkRdev(uint32(a), uint32(b)), nil
}

// layout returns the driver's parameter layouts.
func (o *channelsOptions) layout() (nvrm.Layout, error) {
	opts := &nvrm.LayoutOptions{AllowUnverified: o.allowUnverified}
	if o.driverVersion != "" {
		v, err := nvrm.ParseDriverVersion(o.driverVersion)
		if err != nil {
			return nvrm.Layout{}, usageErrorf("--driver-version: %w", err)
		}
		return nvrm.LayoutFor(v, opts)
	}
	return nvrm.DetectLayout("/", opts)
}

// keeperMode says how a command opens the keeper.
type keeperMode struct {
	trace nvrm.TraceMode
	// control: channel control is needed (the driver's layouts must be
	// known); optional: wanted but a command can go on without it.
	control, optional bool
	// unpin removes the tracer's pins on close.
	unpin bool
}

// keeper opens the registry keeper. It returns a warning where an
// optional controller could not be set up, or where the driver is newer
// than the newest verified and --allow-unverified-driver accepted it.
func (o *channelsOptions) keeper(m keeperMode) (*nvrm.Keeper, error, error) {
	rdev, err := o.rdev()
	if err != nil {
		return nil, nil, err
	}
	opts := &nvrm.KeeperOptions{
		StateDir: o.stateDir,
		Trace:    m.trace,
		Tracer:   nvrm.TracerOptions{ControlRdev: rdev, AcceptErrno: syscall.Errno(o.acceptErrno), PinPath: o.pinPath},
		Unpin:    m.unpin,
	}
	var warn error
	if m.control || m.trace != nvrm.TraceNever {
		// The tracer decodes allocations with the same layouts as
		// control issues them: a driver refused for one is refused for
		// both.
		l, err := o.layout()
		switch {
		case errors.Is(err, nvrm.ErrUnsupportedDriver) || errors.Is(err, nvrm.ErrUnverifiedDriver):
			return nil, nil, err
		case err != nil && (m.optional || !m.control):
			if m.control {
				warn = fmt.Errorf("channel control disabled: %w", err)
			}
		case err != nil:
			return nil, nil, err
		default:
			if l.Unverified {
				warn = fmt.Errorf("driver %s is newer than %s, the newest whose layouts were checked: using that branch's layouts (--allow-unverified-driver)", l.Version, nvrm.NewestVerifiedDriver())
			}
			if m.control {
				opts.Controller = nvrm.ControllerOptions{Layout: l, ControlRdev: rdev, AcceptErrno: syscall.Errno(o.acceptErrno)}
			}
		}
	}
	if m.trace != nvrm.TraceNever && o.pinPath != "" {
		if err := nvrm.MountBPFFS(bpffsRoot(o.pinPath)); err != nil {
			return nil, nil, err
		}
	}
	k, err := nvrm.OpenKeeper(opts)
	if err != nil && m.trace != nvrm.TraceNever {
		// A kernel feature the tracer needs may be what is missing: name
		// it, its minimum kernel and the fix, and exit 77.
		err = caps.Diagnose("tracing RM calls", err, nil, caps.FeatureBPF, caps.FeatureBTF, caps.FeatureRingBuf)
	}
	return k, warn, err
}

// bpffsRoot is where the bpffs holding pin path p is mounted: the first
// directory under /sys/fs/bpf, or p's parent elsewhere.
func bpffsRoot(p string) string {
	if rest, ok := strings.CutPrefix(p, "/sys/fs/bpf/"); ok && rest != "" {
		return "/sys/fs/bpf"
	}
	i := strings.LastIndexByte(strings.TrimSuffix(p, "/"), '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// parsePID parses a PID argument.
func parsePID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 31)
	if err != nil || v == 0 {
		return 0, usageErrorf("PID %q: want a positive process id", s)
	}
	return uint32(v), nil
}

// explain adds what an operator can do to the controller's errors.
func explain(pid uint32, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nvrm.ErrUnknownProcess):
		return fmt.Errorf("%w\n  process %d created its CUDA context while no Arbiter tracer ran, so its RM handles are unknown;\n  keep `arbiter run` or `arbiter channels watch` running (or pinned) before CUDA processes start, then restart the process", err, pid)
	case errors.Is(err, nvrm.ErrProcessExited):
		return fmt.Errorf("process %d exited: %w", pid, err)
	case errors.Is(err, nvrm.ErrKeeperRunning):
		return fmt.Errorf("%w\n  another arbiter keeps the registry and would lose track of what this command changed; control channels through it, or stop it first", err)
	case errors.Is(err, nvrm.ErrUnverifiedDriver):
		return fmt.Errorf("%w\n  to accept the risk, pass --allow-unverified-driver", err)
	}
	return err
}
