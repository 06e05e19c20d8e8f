package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runSimCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newSimCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestSimCommand(t *testing.T) {
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	dirs := []string{t.TempDir(), t.TempDir()}
	var reports [][]byte
	for _, dir := range dirs {
		out, err := runSimCmd(t, "--workload", spec, "--duration", "5s", "--seed", "42", "--quiet",
			"--baselines", "exclusive,timeslice,priority,scripted-suspend", "--out", dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"seed 42", "exclusive", "timeslice", "priority", "scripted-suspend", "resnet-infer", "llm-train", "p99/excl"} {
			if !strings.Contains(out, want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		}
		for _, name := range []string{"report.json", "cdf.svg", "timeline.svg"} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v", name, err)
			}
			if strings.HasSuffix(name, ".svg") && !bytes.HasPrefix(b, []byte("<svg")) {
				t.Errorf("%s is not SVG", name)
			}
		}
		b, _ := os.ReadFile(filepath.Join(dir, "report.json"))
		reports = append(reports, b)
	}
	if !bytes.Equal(reports[0], reports[1]) {
		t.Error("same seed, different report.json")
	}
}

func TestSimCommandErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("gpus: 1\nbe:\n  - name: x\n    gpu: 0\n    kernel: -3ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", bad}, "bad.yaml:5: be[0].kernel: negative duration"},
		{[]string{"--workload", spec, "--baselines", "nope"}, `unknown baseline "nope"`},
		{[]string{"--workload", spec, "--policy", t.TempDir()}, "not yet available: needs the engine"},
		{[]string{"--workload", filepath.Join(t.TempDir(), "missing.yaml")}, "no such file"},
		{[]string{}, `required flag(s) "workload" not set`},
	}
	for _, c := range cases {
		_, err := runSimCmd(t, append(c.args, "--quiet")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
}

// TestSimCommandInterrupted: a cancelled run (Ctrl-C) stops with an error
// and writes no output files.
func TestSimCommandInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "out")
	cmd := newSimCmd()
	var errOut bytes.Buffer
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--workload", filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml"),
		"--duration", "1h", "--out", dir})
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("output directory created on an interrupted run: %v", err)
	}
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b)
	p.last = p.last.Add(-2 * time.Second)
	p.report("timeslice", 30e9, 60e9)
	if got := b.String(); !strings.Contains(got, "timeslice") || !strings.Contains(got, "30.0s / 60.0s simulated ( 50%)") {
		t.Errorf("progress line %q", got)
	}
	p.report("timeslice", 31e9, 60e9) // within a second: nothing
	if strings.Count(b.String(), "\n") != 1 {
		t.Errorf("progress printed more than once a second: %q", b.String())
	}
}
