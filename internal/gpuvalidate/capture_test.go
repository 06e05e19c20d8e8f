package gpuvalidate

import (
	"bytes"
	"strings"
	"testing"
)

// captureEvents is `arbiter trace --format json` output of one program
// (pid 42) and another process the filter should have left out.
const captureEvents = `{"time_ns":1,"kind":"exec","pid":42,"tid":42,"comm":"capture","ppid":1,"exit_code":0}
{"time_ns":2,"kind":"copy","func":"cuMemcpyHtoDAsync_v2","pid":42,"tid":42,"comm":"capture","dir":"htod","bytes":4096}
{"time_ns":3,"kind":"launch","func":"cuLaunchKernel","pid":42,"tid":42,"comm":"capture"}
{"time_ns":4,"kind":"launch","func":"cuLaunchKernelEx","pid":42,"tid":42,"comm":"capture"}
{"time_ns":5,"kind":"launch","func":"cuGraphLaunch","pid":42,"tid":42,"comm":"capture"}
{"time_ns":6,"kind":"copy","func":"cuMemcpyDtoHAsync_v2","pid":42,"tid":42,"comm":"capture","dir":"dtoh","bytes":4096}
{"time_ns":7,"kind":"sync","func":"cuStreamSynchronize","pid":42,"tid":42,"comm":"capture","duration_ns":10,"result":0,"result_name":"CUDA_SUCCESS"}
{"time_ns":8,"kind":"sync","func":"cuCtxSynchronize","pid":42,"tid":42,"comm":"capture","duration_ns":10,"result":700,"result_name":"CUDA_ERROR_ILLEGAL_ADDRESS"}
{"time_ns":9,"kind":"launch","func":"cuLaunchKernel","pid":77,"tid":77,"comm":"other"}
{"time_ns":10,"kind":"exit","pid":42,"tid":42,"comm":"capture","ppid":0,"exit_code":0}
`

const captureLog = `arbiter trace: attached 30 probes to /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15
warning: ring buffer almost full
{"kind":"summary","idle_gap_ns":2000000,"processes":[{"pid":42,"comm":"capture","launches":3,"launches_per_s":null,"sync_errors":1}],"other_processes":0,"tracer":{"events":9,"dropped":2,"undecodable":0,"wall_ns":1000}}
`

// TestCapture checks a capture against the program's own counts: a call
// the trace missed fails, calls the runtime added pass, lower bounds hold.
func TestCapture(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader(captureEvents), strings.NewReader(captureLog), 42)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Libraries) != 1 || tr.Libraries[0] != (Library{"/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15", 30}) {
		t.Errorf("libraries: %+v", tr.Libraries)
	}
	if tr.Count("launches") != 3 || tr.Count("copies") != 2 || tr.Count("htod") != 1 || tr.Count("dtoh") != 1 || tr.Count("syncs") != 2 || tr.Count("cuGraphLaunch") != 1 {
		t.Errorf("counts: kinds %v funcs %v", tr.Kinds, tr.Funcs)
	}
	prog := Workload{Calls: []Expectation{{"launches", 4, false}, {"copies", 1, false}, {"syncs", 2, true}, {"cuGraphLaunch", 1, false}}}
	var buf bytes.Buffer
	WriteCapture(NewWriter(&buf, "capture-cuda"), tr, prog, 0)
	s := mustParse(t, buf.String()).Section("capture-cuda")
	for name, want := range map[string]struct {
		st   Status
		seen string
	}{
		"attached":      {Pass, "30 probes on /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15"},
		"launches":      {Fail, "3 captured, the program made launches=4: 1 missed"},
		"copies":        {Pass, "2 captured, the program made copies=1 itself; the runtime made 1 more"},
		"syncs":         {Pass, "2 captured, the program made syncs>=2"},
		"cuGraphLaunch": {Pass, "1 captured, the program made cuGraphLaunch=1"},
		"functions":     {Info, "cuCtxSynchronize ×1, cuGraphLaunch ×1, cuLaunchKernel ×1, cuLaunchKernelEx ×1, cuMemcpyDtoHAsync_v2 ×1, cuMemcpyHtoDAsync_v2 ×1, cuStreamSynchronize ×1"},
		"sync_results":  {Fail, "synchronizing calls returned CUDA_ERROR_ILLEGAL_ADDRESS ×1"},
		"tracer_loss":   {Fail, "9 events, 2 dropped, 0 undecodable"},
		"exit":          {Pass, "the program exited with status 0; traced: exit status 0"},
	} {
		c, ok := s.Check(name)
		if !ok || c.Status != want.st || c.Seen != want.seen {
			t.Errorf("%s: %s %q, want %s %q", name, c.Status, c.Seen, want.st, want.seen)
		}
	}
	if v, _ := s.Value("calls.cuLaunchKernelEx"); v.Num != 1 {
		t.Errorf("per-function count: %+v", v)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0], "ring buffer almost full") {
		t.Errorf("notes: %q", s.Notes)
	}
}

// TestCaptureNothing checks what a capture says when the trace attached to
// nothing, printed no summary and the program printed no counts.
func TestCaptureNothing(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader(""), strings.NewReader("arbiter: no libcuda found\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WriteCapture(NewWriter(&buf, "c"), tr, Workload{Other: []string{"capture: no CUDA-capable device is detected"}}, 2)
	s := mustParse(t, buf.String()).Section("c")
	for name, want := range map[string]string{
		"attached":    "the trace named no library it attached to (arbiter: no libcuda found)",
		"calls":       `the program printed no "calls:" line to check the capture against (capture: no CUDA-capable device is detected)`,
		"tracer_loss": "the trace printed no summary (killed before it could?)",
		"exit":        "the program failed, exit status 2, its exit was not traced (capture: no CUDA-capable device is detected)",
	} {
		if c, _ := s.Check(name); c.Status != Fail || c.Seen != want {
			t.Errorf("%s: %+v, want FAIL %q", name, c, want)
		}
	}
	if s.Verdict() != Fail {
		t.Errorf("verdict %s", s.Verdict())
	}
}

// TestCaptureExit checks how a program's end is told from its exit status
// and the traced wait status.
func TestCaptureExit(t *testing.T) {
	for _, tc := range []struct {
		events string
		exit   int
		want   Status
		seen   string
	}{
		{`{"kind":"exit","pid":1,"exit_code":512}`, 2, Fail, "the program failed, exit status 2, traced: exit status 2"},
		{`{"kind":"exit","pid":1,"exit_code":9}`, -1, Fail, "the program failed, exit status -1, traced: killed by signal 9"},
		{`{"kind":"exit","pid":1,"exit_code":0}`, -1, Info, "exit status is unknown; traced: exit status 0"},
		{``, 0, Pass, "the program exited with status 0; its exit was not traced"},
	} {
		tr, err := ParseTrace(strings.NewReader(tc.events), strings.NewReader(""), 1)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		WriteCapture(NewWriter(&buf, "c"), tr, Workload{}, tc.exit)
		wantChecks(t, mustParse(t, buf.String()).Section("c"), map[string][2]string{"exit": {string(tc.want), tc.seen}})
	}
}

// FuzzParseTrace checks that no trace output makes the parser panic.
func FuzzParseTrace(f *testing.F) {
	f.Add(captureEvents, captureLog)
	f.Add(`{"kind":"summary","tracer":{"events":"x"}}`, "attached 3 probes to")
	f.Fuzz(func(t *testing.T, events, log string) {
		tr, err := ParseTrace(strings.NewReader(events), strings.NewReader(log), 0)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		WriteCapture(NewWriter(&buf, "c"), tr, Workload{}, -1)
		if _, err := Parse(&buf); err != nil {
			t.Fatal(err)
		}
	})
}
