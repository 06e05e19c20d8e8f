package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/report"
)

// TestSimCommandOutCheckedFirst: an --out that cannot be written fails at
// once, before any simulation, not after a long run.
func TestSimCommandOutCheckedFirst(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	start := time.Now()
	_, err := runSimCmd(t, "--workload", spec, "--duration", "1000h", "--quiet", "--out", filepath.Join(file, "sub"))
	if err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the bad --out was found after %v: the run started first", time.Since(start))
	}
	// A directory to create under one nobody can write in (not even
	// root: /proc) names that one, not the probe file tried there.
	_, err = runSimCmd(t, "--workload", spec, "--duration", "1000h", "--quiet", "--out", "/proc/arbiter-sim-out")
	if err == nil || !strings.Contains(err.Error(), "--out /proc/arbiter-sim-out: cannot be created: /proc, the nearest directory that exists, cannot be written") ||
		strings.Contains(err.Error(), ".arbiter-sim-") {
		t.Errorf("under /proc: %v", err)
	}
	// A directory where a report file goes is found before the run too,
	// and nothing is written.
	out := t.TempDir()
	if err := os.Mkdir(filepath.Join(out, "timeline.svg"), 0o755); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = runSimCmd(t, "--workload", spec, "--duration", "1000h", "--quiet", "--out", out)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(out, "timeline.svg")+" is in the way") {
		t.Errorf("timeline.svg a directory: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the directory in the way was found after %v: the run started first", time.Since(start))
	}
	if left, _ := os.ReadDir(out); len(left) != 1 {
		t.Errorf("the refused run left %v", left)
	}
	// A link to nowhere is named before the run, not found by mkdir after it.
	link := filepath.Join(t.TempDir(), "dangling")
	if err := os.Symlink(filepath.Join(out, "gone"), link); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = runSimCmd(t, "--workload", spec, "--duration", "1000h", "--quiet", "--out", link)
	if err == nil || !strings.Contains(err.Error(), link+" is a symbolic link to "+filepath.Join(out, "gone")+", which does not exist") {
		t.Errorf("dangling link: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the dangling link was found after %v: the run started first", time.Since(start))
	}
}

// TestSimOutputsNoStrays: the report files are written through temporary
// files of their own, so a file or link someone left at a name such as
// report.json.tmp is not touched, and no temporary file stays, even when
// a rename fails part way; then the error says which files were already
// replaced.
func TestSimOutputsNoStrays(t *testing.T) {
	out := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	for _, f := range []struct{ name, body string }{{"report.json", "earlier"}, {"report.json.tmp", "mine"}, {victim, "not to be written"}} {
		path := f.name
		if !filepath.IsAbs(path) {
			path = filepath.Join(out, path)
		}
		if err := os.WriteFile(path, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(victim, filepath.Join(out, "latency.svg.tmp")); err != nil {
		t.Fatal(err)
	}
	// timeline.svg is a directory with something in it: its rename fails
	// after the other two were renamed.
	if err := os.MkdirAll(filepath.Join(out, "timeline.svg", "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	rep := &report.Report{Workload: "w", Seed: 1, DurationNS: 1e9, GPUs: 1, Baselines: []report.Baseline{{Name: "exclusive"}}}
	// The files get the mode a plain write would: 0644 less the umask.
	defer syscall.Umask(syscall.Umask(0o027))
	err := writeSimOutputs(out, rep, uint64(50*time.Millisecond))
	if fi, serr := os.Stat(filepath.Join(out, "report.json")); serr != nil {
		t.Error(serr)
	} else if fi.Mode().Perm() != 0o640 {
		t.Errorf("report.json under umask 027: %v, want -rw-r-----", fi.Mode())
	}
	if err == nil || !strings.Contains(err.Error(), "write "+filepath.Join(out, "timeline.svg")) ||
		!strings.Contains(err.Error(), "(report.json and latency.svg already replaced by this run's)") {
		t.Fatalf("got %v", err)
	}
	var names []string
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"latency.svg", "latency.svg.tmp", "report.json", "report.json.tmp", "timeline.svg"}) {
		t.Errorf("left behind: %v", names)
	}
	for path, want := range map[string]string{filepath.Join(out, "report.json.tmp"): "mine", victim: "not to be written"} {
		if b, _ := os.ReadFile(path); string(b) != want {
			t.Errorf("%s was written: %.40q", path, b)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(out, "report.json")); !strings.Contains(string(b), `"workload": "w"`) {
		t.Errorf("report.json not replaced: %.40q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "timeline.svg", "keep")); err != nil {
		t.Errorf("the directory in the way was touched: %v", err)
	}
}
