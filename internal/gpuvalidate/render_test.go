package gpuvalidate

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// renderResults is a results file as a hardware run writes it.
const renderResults = `META date 2026-11-25T09:00:00Z
META host gpu-17
META kernel 6.8.0-45-generic x86_64
META driver 570.86.15
META gpu.0 NVIDIA H200, 00000000:17:00.0, 143771 MiB, Default, Disabled, Enabled, 96.00.99.00.02
META gpu.1 NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559 MiB, Default, Disabled, Enabled, 96.00.99.00.01
META gpu_used 1
META gsp 570.86.15
META cuda_driver 12.8
META nvcc release 12.6, V12.6.77
META torch 2.5.1 CUDA 12.4
META arbiter arbiter v0.9.0
META mode hardware
META extra_fact something | odd
SECTION build DONE 41
CHECK capture-cuda launches PASS 2400 captured, the program made launches=2400
CHECK capture-cuda copies FAIL 80 captured, the program made copies=120: 40 missed
RESULT capture-cuda launches 2400 calls
RESULT capture-cuda launch_ns.probed 5412.5 ns
RESULT capture-cuda lat.p50 312.5 us
RESULT capture-cuda lat.p99 1520 us
RESULT capture-cuda lat.max 2500000 us
RESULT capture-cuda lat2.p99 4.5 us
RESULT capture-cuda ratio 1.234 x
RESULT capture-cuda engines graphics,copy2 -
RUN capture-cuda $BUNDLE/arbiter trace --format json --pid 42
RUN capture-cuda $BUNDLE/arbiter trace --format json --pid 42
RUN capture-cuda $WORK/bin/capture 200
NOTE capture-cuda the trace said: warning | x
ATTACH capture-cuda text capture-cuda/trace.log arbiter trace: standard error
ATTACH capture-cuda markdown nvrm/nvrm.md nvrm's report
ATTACH capture-cuda text missing.txt gone
SECTION capture-cuda DONE 75
SECTION capture-torch SKIP 0 PyTorch unusable: No module named 'torch' (pip install torch)
CHECK nvrm procedure PASS passed
SECTION nvrm TIMEOUT 400 ran past its budget of 400 s and was stopped
META elapsed 9 min 16 s of the 25-minute limit
BROKEN line
`

// TestRender checks the report's parts: the heading with date, GPU and
// driver, the machine table, the summary, each section with what it
// checks, its commands, checks, measurements (percentiles pivoted) and raw
// output.
func TestRender(t *testing.T) {
	res, err := Parse(strings.NewReader(renderResults))
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Repeat("line\n", 250) + "last ``` line\n"
	files := fstest.MapFS{
		"capture-cuda/trace.log": {Data: []byte(log)},
		"nvrm/nvrm.md":           {Data: []byte("Driver 570.\n\n### Registry\n\n- client 0x1\n")},
	}
	var buf bytes.Buffer
	if err := Render(&buf, res, &RenderOptions{Files: files}); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"### 2026-11-25 — NVIDIA H100 80GB HBM3, driver 570.86.15\n\n| | |\n|---|---|\n| Date | 2026-11-25T09:00:00Z |\n| Host | gpu-17 |",
		"| GPU 1 | NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559 MiB, Default, Disabled, Enabled, 96.00.99.00.01 |\n| GPU used | 1 |\n| Driver | 570.86.15 |\n| GSP firmware | 570.86.15 |\n| CUDA (driver) | 12.8 |",
		"| Time | 9 min 16 s of the 25-minute limit |\n| extra_fact | something \\| odd |\n",
		"#### Summary\n\n| section | result | checks | time |\n|---|---|---|---|\n| Build | INFO | - | 41 s |\n| Capture: a CUDA C program on real libcuda | FAIL | 1 pass, 1 fail | 1 min 15 s |\n| Capture: PyTorch | SKIP | - | - |\n| RM allocations and channel controls (nvrm's procedure) | TIMEOUT | 1 pass | 6 min 40 s |\n",
		"#### Capture: a CUDA C program on real libcuda — FAIL\n\nTraces a CUDA C program",
		"Ran:\n\n```sh\n$BUNDLE/arbiter trace --format json --pid 42\n$WORK/bin/capture 200\n```\n",
		"| check | result | seen |\n|---|---|---|\n| launches | PASS | 2400 captured, the program made launches=2400 |\n| copies | FAIL | 80 captured, the program made copies=120: 40 missed |\n",
		"| measure | p50 | p99 | max |\n|---|---|---|---|\n| lat | 312 µs | 1.52 ms | 2.50 s |\n| lat2 | - | 4.50 µs | - |\n",
		"| measure | value |\n|---|---|\n| launches | 2400 calls |\n| launch_ns.probed | 5412 ns |\n| ratio | 1.23× |\n| engines | graphics,copy2 |\n",
		"- the trace said: warning | x\n",
		"<details><summary>arbiter trace: standard error</summary>\n\n(last 200 of 251 lines)\n\n```\nline\n",
		"last ''' line\n```\n\n</details>",
		"<details><summary>nvrm's report</summary>\n\nDriver 570.\n\n##### Registry\n\n- client 0x1\n",
		"(missing.txt could not be read:",
		"#### Capture: PyTorch — SKIP\n\nTraces a PyTorch inference loop",
		"**Skipped:** PyTorch unusable: No module named 'torch' (pip install torch)",
		"**TIMEOUT:** ran past its budget of 400 s and was stopped",
		"#### Lines the report could not read\n\n```\nline 38: BROKEN line (unknown record \"BROKEN\")\n```",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks:\n%s", want)
		}
	}
	if strings.Count(md, "$BUNDLE/arbiter trace --format json --pid 42") != 1 {
		t.Error("a repeated command is shown twice")
	}
	if t.Failed() {
		t.Log("\n" + md)
	}
}

// TestRenderTestRun checks that a run on the stub driver and the stand-in
// says loudly that it is no hardware result.
func TestRenderTestRun(t *testing.T) {
	res, err := Parse(strings.NewReader("META date 2026-11-25T09:00:00Z\nMETA mode test: stub CUDA driver and RM stand-in\nSECTION build SKIP 0 test mode\n"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, res, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "### 2026-11-25 — test: stub CUDA driver and RM stand-in (not a hardware result)\n\n> This run used the stub CUDA driver") {
		t.Errorf("report:\n%s", buf.String())
	}
}

// TestFormatValue checks units.
func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v    Value
		want string
	}{
		{Value{Num: 3.456, IsNum: true, Unit: "us"}, "3.46 µs"},
		{Value{Num: 312.5, IsNum: true, Unit: "us"}, "312 µs"},
		{Value{Num: 1520, IsNum: true, Unit: "us"}, "1.52 ms"},
		{Value{Num: 2.5e6, IsNum: true, Unit: "us"}, "2.50 s"},
		{Value{Num: 198.7, IsNum: true, Unit: "launches/s"}, "198.7 launches/s"},
		{Value{Num: 3, IsNum: true, Unit: "groups"}, "3 groups"},
		{Value{Text: "1e3", Num: 1000, IsNum: true}, "1e3"},
		{Value{Text: "n/a", Unit: "us"}, "n/a us"},
	} {
		if got := formatValue(tc.v); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestWorkloadsShipped checks that every source the script compiles or
// runs is where the bundle script copies it from.
func TestWorkloadsShipped(t *testing.T) {
	for _, f := range []string{"capture.cu", "victim.cu", "colocate.cu", "capture_torch.py"} {
		if _, err := os.Stat(filepath.Join("workloads", f)); err != nil {
			t.Error(err)
		}
	}
}
