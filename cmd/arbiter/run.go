package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/internal/sdnotify"
	"github.com/gpu-arbiter/arbiter/kube"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/uprobe"
	"github.com/gpu-arbiter/arbiter/web"
)

// runFlags are `arbiter run`'s own flags; the daemon's settings are
// registered from package config's table.
type runFlags struct {
	config     string
	requestGap time.Duration
	// nodeName and kubeletSocket turn on Kubernetes pod metadata for the
	// policy input (the DaemonSet sets them).
	nodeName, kubeletSocket string
	cfg                     config.Config
	// driver holds the hidden flags that point channel control at a
	// stand-in control file (tests) or override the detected driver
	// version, as `arbiter channels` and `arbiter recover` take them.
	driver channelsOptions
}

func newRunCmd() *cobra.Command {
	f := &runFlags{cfg: config.Default()}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: trace CUDA processes, classify them by policy, enforce their SLOs",
		Long: `Run the Arbiter daemon on this node: it traces every CUDA process with eBPF,
classifies each by the policy (the embedded default unless --policy or the
config file names a directory, which is hot-reloaded on change and on SIGHUP,
or --bundle-url a bundle server, polled, whose bundles apply only once they
pass their checks and Rego tests), and enforces the policy's preemption
through the driver's channel control or the launch gate. It serves the HTTP
API, console and /metrics on --listen (over HTTPS with --tls-cert and
--tls-key; plain HTTP on a loopback address only, unless --listen-plain) and
on a root-only unix socket that arbiter ps and arbiter status read.

Settings come from the config file (--config, else /etc/arbiter/config.yaml
when it exists), then the flags given, which win. SIGINT and SIGTERM undo every
enforcement before exit; a killed daemon's leftovers are undone by the next
start or by arbiter recover.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDaemon(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "YAML config file (default "+config.DefaultPath+" when it exists)")
	fl.DurationVar(&f.requestGap, "request-gap", defaultRequestGap, "idle time after a latency-critical process's last synchronization that ends its request")
	fl.StringVar(&f.nodeName, "node-name", "", "Kubernetes node name (the DaemonSet passes spec.nodeName): policies then see each process's pod namespace, name and labels from the API server")
	fl.StringVar(&f.kubeletSocket, "kubelet-socket", "", "the kubelet's pod-resources socket (e.g. "+kube.DefaultPodResourcesSocket+"): pods named from their GPUs where the API server cannot")
	for _, s := range config.Settings() {
		if s.Bool {
			fl.Bool(s.Flag(), s.Get(&f.cfg) == "true", s.Usage)
		} else {
			fl.String(s.Flag(), s.Get(&f.cfg), s.Usage)
		}
	}
	fl.StringVar(&f.driver.controlRdev, "control-rdev", "195:255", "the control device's number (major:minor)")
	fl.IntVar(&f.driver.acceptErrno, "accept-errno", 0, "treat ioctls failing with this errno as run by RM (stand-in control files only)")
	fl.StringVar(&f.driver.driverVersion, "driver-version", "", "driver version whose layouts to use, instead of the loaded driver's")
	for _, h := range []string{"control-rdev", "accept-errno", "driver-version"} {
		_ = fl.MarkHidden(h)
	}
	return cmd
}

// resolveConfig reads the config file, then applies the flags the user
// gave.
func resolveConfig(fl *pflag.FlagSet, path string) (config.Config, string, error) {
	cfg, used, err := config.Resolve(path)
	if err != nil {
		return cfg, used, err
	}
	settings := map[string]bool{}
	for _, s := range config.Settings() {
		settings[s.Flag()] = true
	}
	var ferr error
	fl.Visit(func(fg *pflag.Flag) {
		if settings[fg.Name] && ferr == nil {
			ferr = cfg.SetFlag(fg.Name, fg.Value.String())
		}
	})
	if ferr != nil {
		return cfg, used, ferr
	}
	return cfg, used, cfg.Validate()
}

// newLogger returns the daemon's logger on out (stderr): JSON unless out
// is a terminal (auto) or the format says otherwise; text in colour only
// on a terminal.
func newLogger(cfg config.Config, out *os.File) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("log level %q: %w", cfg.LogLevel, err)
	}
	tty := term.IsTerminal(int(out.Fd()))
	text := cfg.LogFormat == "text" || cfg.LogFormat == "auto" && tty
	var l zerolog.Logger
	if text {
		// Colours only on a terminal: a log file or journal gets plain
		// text.
		l = zerolog.New(zerolog.ConsoleWriter{Out: out, TimeFormat: time.RFC3339, NoColor: !tty})
	} else {
		l = zerolog.New(out)
	}
	return l.Level(level).With().Timestamp().Logger(), nil
}

// daemonCaps are what the daemon needs at least: the eBPF probes.
var daemonCaps = []caps.Cap{caps.BPF, caps.Perfmon}

func runDaemon(cmd *cobra.Command, f *runFlags) error {
	cfg, used, err := resolveConfig(cmd.Flags(), f.config)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, os.Stderr)
	if err != nil {
		return err
	}
	if f.requestGap < 0 {
		return usageErrorf("--request-gap %v: must not be negative", f.requestGap)
	}
	log.Info().Str("version", version).Str("config", orNone(used)).Msg("arbiter starting")
	if err := caps.Require("running the daemon", daemonCaps...); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f.driver.allowUnverified = cfg.AllowUnverifiedDriver
	d := &daemon{cfg: cfg, log: log, requestGap: f.requestGap, proc: procfs.New("/"), driver: &f.driver}
	if f.nodeName != "" || f.kubeletSocket != "" {
		d.pods = kube.New(kube.Options{NodeName: f.nodeName, Client: kubeClient(f.nodeName), PodResourcesSocket: f.kubeletSocket,
			OnChange: func(h kube.Health) { log.Info().Interface("kubernetes", h).Msg("pod metadata source changed") }})
		d.pods.Start(ctx)
	}
	return d.run(ctx)
}

func orNone(s string) string {
	if s == "" {
		return "none (defaults and flags)"
	}
	return s
}

// daemon is one run of `arbiter run`: what it opened, so that it closes
// everything whatever way it stops.
type daemon struct {
	cfg        config.Config
	log        zerolog.Logger
	requestGap time.Duration
	proc       *procfs.FS
	driver     *channelsOptions
	pods       *kube.Resolver // nil off Kubernetes
	tls        *web.KeyPair   // nil: --listen serves plain HTTP
	keeper     *nvrm.Keeper
	tracer     *uprobe.Tracer
	policy     *livePolicy
	eng        *engine.Engine
	// apiLn is the API's TCP listener, opened before anything else.
	apiLn net.Listener
}

// kubeClient is the API server source, on when the node name is known.
func kubeClient(node string) func() (kubernetes.Interface, error) {
	if node == "" {
		return nil
	}
	return kube.InClusterClient
}

// podLookup resolves a pod UID from a cgroup path to its namespace, name
// and labels for the policy input; nil off Kubernetes.
func (d *daemon) podLookup() func(uid string) (input.Pod, bool) {
	if d.pods == nil {
		return nil
	}
	return func(uid string) (input.Pod, bool) {
		p, ok := d.pods.ByUID(uid)
		if !ok {
			return input.Pod{}, false
		}
		return input.Pod{UID: p.UID, Namespace: p.Namespace, Name: p.Name, Labels: p.Labels}, true
	}
}

// daemonDefaults is the daemon's configuration as its config file sets
// it, for the defaults of the commands that act on what the daemon keeps
// (recover, channels). Where the file does not load, it returns the
// built-in defaults and why, for the command to warn of when it runs.
func daemonDefaults() (config.Config, error) {
	cfg, _, err := config.Resolve("")
	if err != nil {
		return config.Default(), err
	}
	return cfg, nil
}

// warnDefaults tells the user, on w, that the daemon's config file did not
// load (err) and which of flags, not given, took the built-in defaults.
func warnDefaults(w io.Writer, cmd *cobra.Command, err error, flags ...string) {
	if err == nil {
		return
	}
	var unset []string
	for _, f := range flags {
		if !cmd.Flags().Changed(f) {
			unset = append(unset, "--"+f)
		}
	}
	verb := "take"
	switch len(unset) {
	case 0:
		return
	case 1:
		verb = "takes"
	}
	fmt.Fprintf(w, "warning: %v: %s %s the built-in default, which may not be the daemon's\n", err, strings.Join(unset, " and "), verb)
}

// nvrmStateDir is where the daemon's driver registry and its lock live;
// arbiter recover and arbiter channels read the same place.
func nvrmStateDir(cfg config.Config) string { return filepath.Join(cfg.StateDir, "nvrm") }

// nvrmPinPath is where the daemon pins the RM tracer; arbiter channels
// drains the same one.
func nvrmPinPath(cfg config.Config) string { return filepath.Join(cfg.BPFFS, "nvrm") }

func (d *daemon) run(ctx context.Context) (err error) {
	defer func() {
		if cerr := d.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	// Policy first: a policy that fails its checks keeps the daemon from
	// starting, before it touches anything.
	if d.cfg.BundleURL != "" {
		d.policy, err = openBundlePolicy(ctx, d.cfg, d.log)
	} else {
		d.policy, err = openPolicy(ctx, d.cfg.Policy, d.log)
	}
	if err != nil {
		return err
	}
	// The TLS files too: a missing or wrong one is named now, not after
	// the probes are in and the driver's tracer is pinned.
	if d.cfg.TLSCert != "" {
		if d.tls, err = web.LoadKeyPair(d.cfg.TLSCert, d.cfg.TLSKey, d.log); err != nil {
			return fmt.Errorf("serve --listen over TLS (--tls-cert, --tls-key): %w", err)
		}
	}
	// And an address the API would refuse (plain HTTP off loopback), or
	// cannot have (in use, not on this host): the listener is opened now.
	if err := web.CheckTCP(d.cfg.Listen, &web.TCPOptions{TLS: d.tls, Plain: d.cfg.ListenPlain}); err != nil {
		return listenError(d.cfg.Listen, err)
	}
	if d.apiLn, err = net.Listen("tcp", d.cfg.Listen); err != nil {
		return listenError(d.cfg.Listen, err)
	}
	if err := nvrm.MountBPFFS(d.cfg.BPFFS); err != nil {
		return fmt.Errorf("bpffs at %s (--bpffs): %w", d.cfg.BPFFS, err)
	}
	enf := &liveEnforcer{}
	if err := d.openDriver(enf); err != nil {
		return err
	}
	// Gates of another format: the tracer pins its own beside them.
	d.releaseOtherGates()
	// A latency-critical process's call after the engine's idle gap opens
	// a request: its record wakes the reader (liveEnforcer.Expedite).
	d.tracer, err = uprobe.Open(&uprobe.Options{GatePinDir: d.cfg.BPFFS, ExpediteGap: d.requestGap})
	if err != nil {
		return caps.Diagnose("tracing CUDA calls", fmt.Errorf("start tracing: %w", err), caps.ProbeFeature, tracingNeeds...)
	}
	enf.tracer, enf.gate = d.tracer, d.tracer.Gate()
	// A killed daemon's gated processes: the pinned map outlived it.
	if rel, rerr := enf.gate.ReleaseAll(); rerr != nil || len(rel) > 0 {
		d.log.Warn().Err(rerr).Int("released", len(rel)).Msg("released processes a previous daemon left gated")
	}
	node := newNodeInfo(d.log, enf)
	enf.node = node
	src := engine.NewLive(d.tracer)
	defer src.Close()
	opts := engine.Options{
		Classifier: d.policy.classifier(node.policyNode, d.proc, d.podLookup()),
		Placement:  enf,
		Victims:    d.policy.victims(node.policyNode),
		IdleGap:    d.requestGap,
		Feedback:   true,
		Name:       d.procName,
		// What a best-effort process gets back when no latency-critical
		// process shares its GPU any more.
		DefaultTimeslice: nvrm.DefaultTimesliceUs * time.Microsecond,
	}
	if d.eng, err = engine.New(src, enf, &opts); err != nil {
		return err
	}
	d.policy.onReload(func(why string) {
		d.eng.Post(func(e *engine.Engine) { e.Reclassify(nil, why) })
	})
	api, err := d.serveAPI(node)
	if err != nil {
		return err
	}
	defer api.stop(d.log)
	go d.keep(ctx)
	go d.signals(ctx)
	api.ready()
	if _, err := sdnotify.Ready(); err != nil {
		d.log.Warn().Err(err).Msg("systemd notification failed")
	}
	go d.watchdog(ctx)
	d.log.Info().Str("listen", d.cfg.Listen).Bool("tls", d.tls != nil).Str("socket", d.cfg.Socket).Str("policy", d.policy.describe()).
		Str("channel_control", enf.describe()).Msg("arbiter running")
	err = d.eng.Run(ctx)
	_, _ = sdnotify.Stopping()
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	d.log.Info().Msg("arbiter stopped: every enforcement undone")
	return nil
}

// openDriver opens the driver registry and channel control; a node with
// no driver, or one whose version channel control does not support, runs
// with the launch gate only, and says why.
func (d *daemon) openDriver(enf *liveEnforcer) error {
	rdev, err := d.driver.rdev()
	if err != nil {
		return err
	}
	accept := syscall.Errno(d.driver.acceptErrno)
	layout, lerr := d.driver.layout()
	opts := &nvrm.KeeperOptions{StateDir: nvrmStateDir(d.cfg), Trace: nvrm.TraceAlways,
		Tracer: nvrm.TracerOptions{ControlRdev: rdev, AcceptErrno: accept, PinPath: nvrmPinPath(d.cfg)}}
	if lerr == nil {
		opts.Controller = nvrm.ControllerOptions{Layout: layout, ControlRdev: rdev, AcceptErrno: accept}
	}
	k, err := nvrm.OpenKeeper(opts)
	if err != nil {
		if errors.Is(err, nvrm.ErrKeeperRunning) {
			return fmt.Errorf("another arbiter is running on this node: %w", err)
		}
		return caps.Diagnose("tracing driver calls", fmt.Errorf("open the driver registry in %s: %w", opts.StateDir, err),
			caps.ProbeFeature, tracingNeeds...)
	}
	d.keeper = k
	for _, r := range k.Registry().Refused() {
		d.log.Warn().Err(r).Msg("state left by another version of arbiter refused")
	}
	if k.ResumeErr != nil {
		d.log.Warn().Err(k.ResumeErr).Msg("resuming channel groups a previous daemon left suspended")
	}
	enf.reg = k.Registry()
	switch {
	case lerr != nil:
		enf.ctlWhy = lerr.Error()
		d.log.Warn().Err(lerr).Msg("no driver channel control: best-effort work is gated at its launches instead")
	case k.Controller() == nil:
		enf.ctlWhy = "channel control unavailable"
	default:
		enf.ctl = k.Controller()
	}
	return nil
}

// releaseOtherGates releases the processes of every launch gate pinned
// in another format than this build's (a newer or older arbiter's) and
// removes its pin; what it cannot release is logged and stays pinned for
// an `arbiter recover` of the version that pinned it.
func (d *daemon) releaseOtherGates() {
	for _, g := range otherGates(d.cfg.BPFFS) {
		ev := d.log.Warn()
		if len(g.errs) > 0 {
			ev = d.log.Error().Strs("errors", g.errs)
		}
		ev.Str("pin", g.rec.Pin).Int("format", g.rec.Format).Int("released", len(g.rec.Released)).Bool("unpinned", g.rec.Unpinned).
			Msg(g.refusal)
	}
}

// procName reads the name of a process that was running before the
// daemon started tracing; "" where it cannot (it exited, say).
func (d *daemon) procName(pid uint32) string {
	comm, err := d.proc.Comm(int(pid))
	if err != nil {
		return ""
	}
	return comm
}

// keep feeds the driver trace into the registry until ctx ends. The
// trace closing after ctx ended is the daemon stopping, not a failure.
func (d *daemon) keep(ctx context.Context) {
	if err := d.keeper.Run(ctx, nil); err != nil && ctx.Err() == nil {
		d.log.Error().Err(err).Msg("driver trace stopped: channel handles of new processes are no longer learned")
	}
}

// signals reloads the policy on SIGHUP.
func (d *daemon) signals(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_, _ = sdnotify.Reloading()
			d.policy.reload(ctx)
			_, _ = sdnotify.Ready()
		}
	}
}

// watchdog pings systemd's watchdog at half its interval while the
// engine's snapshot keeps advancing.
func (d *daemon) watchdog(ctx context.Context) {
	iv, err := sdnotify.WatchdogInterval()
	if err != nil || iv <= 0 {
		return
	}
	t := time.NewTicker(iv / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = sdnotify.Watchdog()
		}
	}
}

// close undoes what run opened, in reverse: the tracer opens every gate,
// the keeper resumes every group still suspended.
func (d *daemon) close() error {
	var errs []error
	if d.apiLn != nil {
		d.apiLn.Close() // closed already where the API served on it
	}
	if d.tracer != nil {
		errs = append(errs, d.tracer.Close())
	}
	if d.keeper != nil {
		errs = append(errs, d.keeper.Close())
	}
	if d.policy != nil {
		errs = append(errs, d.policy.close())
	}
	return errors.Join(errs...)
}
