package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
p50/p99/p99.9 latency, its ratio to running alone, SLO attainment; per BE
workload its throughput as a fraction of running alone; preemptions per second
and GPU utilization.

Baselines: ` + strings.Join(whatif.Names(), ", ") + `.
With --out, writes report.json (same seed, same bytes), cdf.svg and
timeline.svg into the directory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.workload, "workload", "", "workload spec file (YAML or JSON)")
	fl.StringVar(&f.baselines, "baselines", "exclusive,timeslice,mps,priority", "comma-separated baselines to compare")
	fl.Uint64Var(&f.seed, "seed", 1, "random seed (same seed, same results)")
	fl.DurationVar(&f.duration, "duration", 0, "simulated time per run (default: the spec's duration, else 60s)")
	fl.StringVar(&f.out, "out", "", "directory for report.json and the SVG plots")
	fl.StringVar(&f.policy, "policy", "", "Rego policy directory: adds the arbiter baseline")
	fl.DurationVar(&f.window, "timeline-window", 50*time.Millisecond, "simulated time shown in timeline.svg")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress on stderr")
	_ = cmd.MarkFlagRequired("workload")
	return cmd
}

func runSim(cmd *cobra.Command, f *simFlags) error {
	file, err := workload.Load(f.workload)
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
	if dur < 0 || f.window < 0 {
		return errors.New("--duration and --timeline-window must not be negative")
	}
	var names []string
	for _, n := range strings.Split(f.baselines, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if f.policy != "" {
		names = append(names, whatif.Arbiter)
	}
	cfg := &whatif.Config{
		Name: file.Spec.Name, Workloads: ws, Options: opts, Seed: f.seed, Duration: dur,
		Baselines: names, PolicyDir: f.policy, TimelineWindow: min(f.window, dur),
	}
	if !f.quiet {
		cfg.Progress = newProgress(cmd.ErrOrStderr()).report
	}
	rep, err := whatif.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	if f.out == "" {
		return nil
	}
	return writeSimOutputs(f.out, rep, uint64(cfg.TimelineWindow))
}

// writeSimOutputs writes the report files, each atomically.
func writeSimOutputs(dir string, rep *report.Report, window uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	files := []struct {
		name  string
		write func(io.Writer) error
	}{
		{"report.json", rep.WriteJSON},
		{"cdf.svg", rep.WriteCDF},
		{"timeline.svg", func(w io.Writer) error { return rep.WriteTimeline(w, window) }},
	}
	for _, fl := range files {
		var buf bytes.Buffer
		if err := fl.write(&buf); err != nil {
			return fmt.Errorf("%s: %w", fl.name, err)
		}
		path := filepath.Join(dir, fl.name)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// progress prints at most one line a second on stderr: the run, simulated
// time reached and the simulation rate.
type progress struct {
	w       io.Writer
	start   time.Time
	last    time.Time
	run     string
	runWall time.Time
	printed bool
}

func newProgress(w io.Writer) *progress {
	now := time.Now()
	return &progress{w: w, start: now, last: now}
}

func (p *progress) report(run string, now, end uint64) {
	t := time.Now()
	if run != p.run {
		p.run, p.runWall = run, t
	}
	if t.Sub(p.last) < time.Second {
		return
	}
	p.last = t
	rate := time.Duration(now).Seconds() / max(t.Sub(p.runWall).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "sim: %-28s %8.1fs / %.1fs simulated (%3.0f%%), %.0f simulated s per s\n",
		run, time.Duration(now).Seconds(), time.Duration(end).Seconds(), 100*float64(now)/float64(max(end, 1)), rate)
}
