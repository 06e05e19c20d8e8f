package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/whatif"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// simFlags are the options of `arbiter sim`.
type simFlags struct {
	workload  string
	baselines string
	seed      uint64
	duration  time.Duration
	out       string
	format    string
	policy    string
	window    time.Duration
	quiet     bool
}

// newSimCmd builds `arbiter sim`: what-if comparisons on the simulated GPU.
func newSimCmd() *cobra.Command {
	f := &simFlags{}
	cmd := &cobra.Command{
		Use:   "sim --workload FILE [--baselines LIST] [--seed N] [--duration D] [--out DIR]",
		Short: "Simulate a workload under scheduling baselines and compare LC latency and BE throughput",
		Long: `sim runs a workload spec (YAML or JSON; see examples/workloads and
docs/simulator.md) on a discrete-event model of the GPUs, once per baseline,
with the same seed, and prints a comparison table: per LC workload the
requests that arrived, were served and were left waiting, the p50/p99/p99.9
latency, its ratio to running alone, SLO attainment; per BE workload its
throughput as a fraction of running alone; preemptions per second and GPU
utilization. Baselines run concurrently; the output does not depend on it.

Baselines: ` + strings.Join(whatif.Names(), ", ") + `.
With --out, writes report.json (same seed, same bytes), latency.svg and
timeline.svg into the directory. A trace recorded by arbiter trace --record
is replayed through a spec; given one, sim prints a spec to start from.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("%q: sim takes no arguments; the workload spec goes in --workload FILE", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.workload, "workload", "", "workload spec file (YAML or JSON)")
	fl.StringVar(&f.baselines, "baselines", strings.Join(whatif.DefaultBaselines(), ","), "comma-separated baselines to compare")
	fl.Uint64Var(&f.seed, "seed", 1, "random seed (same seed, same results)")
	fl.DurationVar(&f.duration, "duration", 0, "simulated time per run (default: the spec's duration, else 60s)")
	fl.StringVar(&f.out, "out", "", "directory for report.json and the SVG plots")
	fl.StringVar(&f.format, "format", "table", "what to print on stdout: table or json (the report.json content)")
	fl.StringVar(&f.policy, "policy", "", "Rego policy directory for the arbiter baseline (added last unless --baselines names it)")
	fl.DurationVar(&f.window, "timeline-window", 50*time.Millisecond, "simulated time shown in timeline.svg")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress or warnings on stderr")
	_ = cmd.MarkFlagRequired("workload")
	return cmd
}

// errInterrupted ends a run stopped by Ctrl-C or SIGTERM: exit status 130,
// as interrupted command-line tools do, and no output files.
type errInterrupted struct{}

func (errInterrupted) Error() string { return "interrupted: no output written" }

// ExitCode implements exitCoder.
func (errInterrupted) ExitCode() int { return 130 }

func runSim(cmd *cobra.Command, f *simFlags) error {
	if f.format != "table" && f.format != "json" {
		return usageErrorf("--format %q: want table or json", f.format)
	}
	if f.duration < 0 {
		return usageErrorf("--duration %v: must not be negative", f.duration)
	}
	if f.window < 0 {
		return usageErrorf("--timeline-window %v: must not be negative", f.window)
	}
	var names []string
	for _, n := range strings.Split(f.baselines, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	// Checked before the spec, so that a mistyped flag is not preceded by
	// the spec's warnings.
	for i, n := range names {
		if !slices.Contains(whatif.Names(), n) {
			return usageErrorf("--baselines: unknown baseline %q (known: %s)", n, strings.Join(whatif.Names(), ", "))
		}
		if slices.Contains(names[:i], n) {
			return usageErrorf("--baselines: baseline %q given twice", n)
		}
	}
	if slices.Contains(names, whatif.Arbiter) && f.policy == "" {
		return usageErrorf("--baselines %s: the arbiter baseline needs a policy: give its directory with --policy DIR (e.g. --policy rego/default)", f.baselines)
	}
	if f.out != "" {
		if err := checkOutDir(f.out); err != nil {
			return err
		}
	}
	file, err := loadSpec(f.workload)
	if tr, ok := errors.AsType[*errTraceGiven](err); ok {
		// The spec to start from is the output, unless JSON was asked
		// for: then stdout holds the error, which says how to get it.
		if f.format == "json" {
			tr.noSpec = true
		} else if _, werr := io.WriteString(cmd.OutOrStdout(), tr.spec); werr != nil {
			return fmt.Errorf("%w (and writing the spec: %v)", err, werr)
		}
	}
	if err != nil {
		return err
	}
	ws, err := file.Workloads()
	if err != nil {
		return err
	}
	opts, err := file.Options()
	if err != nil {
		return err
	}
	dur := f.duration
	if dur == 0 {
		dur = time.Duration(file.Spec.Duration)
	}
	if dur == 0 {
		dur = time.Minute
	}
	if f.policy != "" && !slices.Contains(names, whatif.Arbiter) {
		names = append(names, whatif.Arbiter)
	}
	cfg := &whatif.Config{
		Name: file.Spec.Name, Workloads: ws, Options: opts, ControlLatency: file.ControlLatency(), Seed: f.seed, Duration: dur,
		Baselines: names, TimelineWindow: min(f.window, dur),
	}
	var mismatches []string
	if f.policy != "" {
		gpus := max(opts.GPUs, 1)
		extra, plan, err := arbiterBaseline(cmd.Context(), f.policy, gpus, defaultRequestGap)
		if err != nil {
			return err
		}
		cfg.Extra = append(cfg.Extra, extra)
		mismatches = classMismatches(f.policy, plan, ws)
	}
	stderr := cmd.ErrOrStderr()
	var prog *progress
	if !f.quiet {
		if cmd.Flags().Changed("duration") && f.duration == 0 {
			fmt.Fprintf(stderr, "warning: --duration 0 means the default: each run simulates %v (the spec's duration, else 1m); give a positive duration for another\n", dur)
		}
		if f.out != "" && f.window == 0 {
			fmt.Fprintln(stderr, "warning: --timeline-window 0: timeline.svg shows no timeline; give a positive window (the default is 50ms)")
		}
		for _, w := range file.Warnings {
			fmt.Fprintln(stderr, "warning:", w)
		}
		for _, w := range workload.LoadWarnings(file, dur) {
			fmt.Fprintln(stderr, "warning:", w)
		}
		for _, w := range mismatches {
			fmt.Fprintln(stderr, "warning:", w)
		}
		prog = newProgress(stderr, time.Now, terminalWidth(stderr))
		cfg.Progress = prog.report
	}
	rep, err := whatif.Run(cmd.Context(), cfg)
	if prog != nil {
		prog.done()
	}
	if err != nil {
		if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
			return errInterrupted{}
		}
		return err
	}
	out := cmd.OutOrStdout()
	if f.format == "json" {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteTable(out)
	}
	if err != nil {
		return err
	}
	if f.out == "" {
		return nil
	}
	return writeSimOutputs(f.out, rep, uint64(cfg.TimelineWindow))
}

// checkOutDir makes sure the output directory can be written before the
// run, so that a long run does not end in an error that throws its
// results away. It creates nothing: an interrupted run leaves no trace.
func checkOutDir(dir string) error {
	at := filepath.Clean(dir)
	for {
		fi, err := os.Stat(at)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("--out %s: %s is not a directory", dir, at)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("--out %s: %w", dir, err)
		}
		if fi, lerr := os.Lstat(at); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(at)
			return fmt.Errorf("--out %s: %s is a symbolic link to %s, which does not exist", dir, at, target)
		}
		parent := filepath.Dir(at)
		if parent == at {
			return fmt.Errorf("--out %s: no existing directory above it", dir)
		}
		at = parent
	}
	probe, err := os.CreateTemp(at, ".arbiter-sim-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the probe file's name says nothing
		}
		if at != filepath.Clean(dir) {
			return fmt.Errorf("--out %s: cannot be created: %s, the nearest directory that exists, cannot be written (creating a file in it: %w)", dir, at, err)
		}
		return fmt.Errorf("--out %s: cannot be written (creating a file in it: %w)", dir, err)
	}
	probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	if at != filepath.Clean(dir) {
		return nil // the files will be new
	}
	for _, name := range simOutputNames {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
			return fmt.Errorf("--out %s: %s is in the way: the run writes a file of that name there (remove it, or choose another --out)", dir, path)
		}
	}
	return nil
}

// simOutputNames are the files --out writes, in the order written.
var simOutputNames = []string{"report.json", "latency.svg", "timeline.svg"}

// writeSimOutputs writes the report files: all of them rendered, then
// written to temporary files of their own beside their final names, then
// renamed into place, so that a failure to write leaves the files there
// were, and no failure leaves a temporary file behind. A rename that
// fails after others succeeded says which files were already replaced.
func writeSimOutputs(dir string, rep *report.Report, window uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	render := map[string]func(io.Writer) error{
		"report.json":  rep.WriteJSON,
		"latency.svg":  rep.WriteLatency,
		"timeline.svg": func(w io.Writer) error { return rep.WriteTimeline(w, window) },
	}
	bodies := make([][]byte, len(simOutputNames))
	for i, name := range simOutputNames {
		var buf bytes.Buffer
		if err := render[name](&buf); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		bodies[i] = buf.Bytes()
	}
	var tmps []string
	removeTmps := func() {
		for _, tmp := range tmps {
			os.Remove(tmp)
		}
	}
	for i, name := range simOutputNames {
		out, err := createNew(dir, name)
		if err != nil {
			removeTmps()
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
		tmps = append(tmps, out.Name())
		_, err = out.Write(bodies[i])
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			removeTmps()
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
	}
	for i, name := range simOutputNames {
		if err := os.Rename(tmps[i], filepath.Join(dir, name)); err != nil {
			tmps = tmps[i:]
			removeTmps()
			if i > 0 {
				return fmt.Errorf("write %s: %w (%s already replaced by this run's)", filepath.Join(dir, name), err, strings.Join(simOutputNames[:i], " and "))
			}
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
	}
	return nil
}

// createNew creates a temporary file for name in dir under a name of its
// own (O_EXCL: never a file or link someone left there), with the mode
// os.WriteFile would give it (0644 less the umask), unlike os.CreateTemp's
// 0600.
func createNew(dir, name string) (*os.File, error) {
	for range 100 {
		path := filepath.Join(dir, fmt.Sprintf(".%s.%08x.tmp", name, rand.Uint32()))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
	return nil, fmt.Errorf("no free temporary name for %s in %s", name, dir)
}
