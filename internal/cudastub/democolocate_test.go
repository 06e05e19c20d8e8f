package cudastub

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runColocateDemo runs scripts/demo-colocate.sh with env added and returns
// its exit status and combined output.
func runColocateDemo(t *testing.T, env ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "demo-colocate.sh"))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

var demoRow = regexp.MustCompile(`(?m)^(LC p50 latency \(us\)|LC p99 latency \(us\)|BE launches/s) +([0-9.]+) +([0-9.]+) +n/a$`)

// demoNode reads the stub node the demo ran its GPUs on.
var demoNode = regexp.MustCompile(`on a GPU of its own \(ARBITER_STUB_NODE=(demo-[0-9]+)\)`)

// TestColocateDemo runs the demo's co-location part: LC and BE alone, side
// by side, and the column left for arbiter run.
func TestColocateDemo(t *testing.T) {
	b := ForTest(t)
	// No daemon binary: the third column says so (cmd/arbiter's TestDemo
	// runs it under the daemon).
	code, out := runColocateDemo(t, "COLOCATE_SECONDS=1", "ARBITER_STUB="+b.Dir, "ARBITER_BIN="+filepath.Join(t.TempDir(), "arbiter"))
	if code != 0 {
		t.Fatalf("exit status %d:\n%s", code, out)
	}
	rows := map[string][2]float64{}
	for _, m := range demoRow.FindAllStringSubmatch(out, -1) {
		alone, _ := strconv.ParseFloat(m[2], 64)
		shared, _ := strconv.ParseFloat(m[3], 64)
		rows[m[1]] = [2]float64{alone, shared}
	}
	if len(rows) != 3 {
		t.Fatalf("want 3 rows of alone, side by side and n/a for arbiter run:\n%s", out)
	}
	// Side by side every LC layer waits for a BE timeslice: ~9 ms
	// against ~1 ms alone. p99 of a one-second run is too noisy to bound.
	if lc := rows["LC p50 latency (us)"]; lc[1] < 3*lc[0] {
		t.Errorf("LC p50 side by side %.0f µs, want >= 3× alone (%.0f µs):\n%s", lc[1], lc[0], out)
	}
	if be := rows["BE launches/s"]; be[0] < 100 || be[1] < 100 {
		t.Errorf("BE throughput %v, want >= 100 launches/s in both (1 ms kernels):\n%s", be, out)
	}
	if !strings.Contains(out, "(under arbiter run: not measured: ") {
		t.Errorf("the empty arbiter column is not explained:\n%s", out)
	}
	// Its own GPUs only: cmd/arbiter's TestDemo may be running another
	// demo, on GPUs of its own, in parallel.
	node := demoNode.FindStringSubmatch(out)
	if node == nil {
		t.Fatalf("the demo does not name its stub node:\n%s", out)
	}
	if left, _ := filepath.Glob("/dev/shm/arbiter-stubgpu-" + node[1] + "-*"); len(left) != 0 {
		t.Errorf("the demo left its GPUs behind: %v", left)
	}
}

func TestColocateDemoNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	code, out := runColocateDemo(t, "ARBITER_STUB="+dir)
	if code != 1 || !strings.Contains(out, "demo-colocate: "+dir+"/infer is missing: run 'make build'") {
		t.Errorf("exit %d\n%s", code, out)
	}
	code, out = runColocateDemo(t, "COLOCATE_SECONDS=soon")
	if code != 2 || !strings.Contains(out, `COLOCATE_SECONDS="soon": want a whole number of seconds`) {
		t.Errorf("exit %d\n%s", code, out)
	}
}
