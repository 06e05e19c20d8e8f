package gpuvalidate

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// nvrmChecks parses a report file and returns its section of results.
func nvrmChecks(t *testing.T, file string) (*NVRMReport, *Section) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := ParseNVRMReport(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WriteNVRM(NewWriter(&buf, "nvrm"), rep)
	return rep, mustParse(t, buf.String()).Section("nvrm")
}

// wantChecks compares checks by status and a fragment of what was seen.
func wantChecks(t *testing.T, s *Section, want map[string][2]string) {
	t.Helper()
	for name, w := range want {
		c, ok := s.Check(name)
		if !ok {
			t.Errorf("no check %s", name)
			continue
		}
		if string(c.Status) != w[0] || !strings.Contains(c.Seen, w[1]) {
			t.Errorf("%s: %s %q, want %s containing %q", name, c.Status, c.Seen, w[0], w[1])
		}
	}
}

// TestNVRMStandinLog reads the log of nvrm.test running the procedure on
// the stand-in (testdata/nvrm-standin.log, as the script ran it), where
// the report is logged and the "kernel", a CPU thread, never stops.
func TestNVRMStandinLog(t *testing.T) {
	rep, s := nvrmChecks(t, "testdata/nvrm-standin.log")
	if rep.Outcome != "PASS" || len(rep.Parts) < 8 {
		t.Fatalf("outcome %q, %d parts", rep.Outcome, len(rep.Parts))
	}
	wantChecks(t, s, map[string][2]string{
		"procedure":                {"PASS", "TestGPUValidate passed"},
		"alloc_traced":             {"PASS", "14 calls traced: client ×1, device ×2, subdevice ×2, channel-group ×3, gpfifo-C86F ×3; channel-group engines graphics, copy0, graphics"},
		"process_controls":         {"INFO", "SET_TIMESLICE 2000, GPFIFO_SCHEDULE 1, GPFIFO_SCHEDULE 1"},
		"get_info":                 {"PASS", "3 calls NV_OK"},
		"set_timeslice":            {"PASS", "27 calls NV_OK"},
		"interleave":               {"PASS", "9 calls NV_OK; levels read back from the registry's record: low, high, medium"},
		"no_get_interleave":        {"PASS", "never issued"},
		"preempt_timeout":          {"INFO", "PREEMPT issued 9 times"},
		"suspend.disable-channels": {"FAIL", "2 of 2 trials completed; 2 failures: disable-channels trial 0: kernel still running 50ms after Suspend"},
		"suspend.schedule":         {"FAIL", "schedule trial 1: kernel still running"},
		"suspend_methods":          {"PASS", "both measured: disable-channels, schedule"},
		"after_resume":             {"PASS", "correct: stand-in"},
		"reapply_timeslice":        {"PASS", "without error"},
		"later_calls":              {"INFO", "none"},
	})
	if v, ok := s.Value("schedule.kernel_stopped_after.p50"); !ok || v.Unit != "us" || v.Num < 40000 {
		t.Errorf("stop latency: %+v", v)
	}
	if v, _ := s.Value("issued.FIFO_DISABLE_CHANNELS"); v.Num != 8 {
		t.Errorf("issued FIFO_DISABLE_CHANNELS: %+v", v)
	}
	if s.Verdict() != Fail {
		t.Errorf("verdict %s: the stand-in's kernel cannot be stopped", s.Verdict())
	}
}

// TestNVRMSynthetic reads a report shaped like one from a GSP GPU: a
// refused timeslice past 1 s is no failure, a failed trial is, and the
// PREEMPT timeout is checked where the report states it.
func TestNVRMSynthetic(t *testing.T) {
	rep, s := nvrmChecks(t, "testdata/nvrm-synthetic.md")
	if rep.Outcome != "" {
		t.Errorf("outcome %q from a report without a log", rep.Outcome)
	}
	wantChecks(t, s, map[string][2]string{
		"alloc_traced":                   {"PASS", "9 calls traced: client ×1, device ×1, subdevice ×1, channel-group ×2, gpfifo-C86F ×2; channel-group engines graphics, copy2"},
		"registry":                       {"INFO", "0x5c000003 engine graphics, 2 channels, timeslice 1024 by \"process\""},
		"get_info":                       {"PASS", "first group: tsgID 12"},
		"set_timeslice":                  {"PASS", "(read only)→1024 µs, 1 µs→1 µs, 1000 µs→1000 µs, 2000000 µs→nvrm: SET_TIMESLICE: NV_ERR_INVALID_ARGUMENT (0x1f)"},
		"interleave":                     {"PASS", "low, high"},
		"preempt_timeout":                {"PASS", "PREEMPT issued 210 times with bManualTimeout=1, timeoutUs=1000000"},
		"suspend.disable-channels":       {"PASS", "100 of 100 trials"},
		"suspend.schedule":               {"FAIL", "98 of 100 trials completed; 2 failures"},
		"suspend_methods":                {"PASS", "disable-channels, schedule"},
		"variant.gpfifo_schedule_0_only": {"INFO", "stopped in 0/10 trials"},
		"variant.preempt_bwait_1_only":   {"INFO", "stopped in 10/10 trials, median 290µs"},
		"after_resume":                   {"PASS", "correct: 1048576 elements"},
		"later_calls":                    {"INFO", "rm_control  SET_TIMESLICE 1024"},
	})
	for name, want := range map[string]float64{
		"disable-channels.suspend_call.p50":         310,
		"disable-channels.suspend_call.p99":         420.5,
		"disable-channels.suspend_call.max":         1200,
		"disable-channels.kernel_stopped_after.p50": 35,
		"schedule.kernel_restarted_after.max":       510,
		"timeslice_readback.1":                      1,
		"preempt_timeout":                           1_000_000,
		"schedule.trials":                           98,
		"variant.preempt_bwait_1_only.stopped":      10,
	} {
		if v, ok := s.Value(name); !ok || v.Num != want {
			t.Errorf("%s = %+v, want %v", name, v, want)
		}
	}
	if _, ok := s.Value("timeslice_readback.2000000"); ok {
		t.Error("a refused timeslice has a read-back value")
	}
}

// TestNVRMProblems checks reports that lack what the checks need.
func TestNVRMProblems(t *testing.T) {
	for _, tc := range []struct {
		name, report string
		want         map[string][2]string
	}{
		{"failed test, no report", "=== RUN   TestGPUValidate\n    gpu_validate_test.go:46: nvrm: driver 600.10: newer than 595.45.04: unverified\n--- FAIL: TestGPUValidate (0.00s)\nFAIL\n",
			map[string][2]string{"procedure": {"FAIL", "driver 600.10: newer than 595.45.04"}, "report": {"FAIL", "no report"}}},
		{"skipped", "=== RUN   TestGPUValidate\n    gpu_validate_test.go:37: hardware validation: run scripts/gpu-validate.sh\n--- SKIP: TestGPUValidate (0.00s)\n",
			map[string][2]string{"procedure": {"FAIL", "skipped: hardware validation"}}},
		{"GET_INTERLEAVE issued, one method", "### Controls from another process\n\n| group | engine | control | argument | result | read back |\n|---|---|---|---|---|---|\n| 0x1 | graphics | GET_INTERLEAVE_LEVEL | | nvrm: NV_ERR_NOT_SUPPORTED | |\n| 0x1 | graphics | SET_INTERLEAVE_LEVEL | low | NV_OK | medium (registry) |\n\n### Suspend (GPFIFO_SCHEDULE{0} + PREEMPT{bWait}) and resume\n\n3 of 3 trials completed.\n\n### Controls Arbiter issued\n\n| control | calls |\n|---|---|\n| PREEMPT | 3 |\n",
			map[string][2]string{
				"no_get_interleave": {"FAIL", "GET_INTERLEAVE_LEVEL was issued"},
				"interleave":        {"FAIL", `0x1 graphics low: NV_OK, read back "medium (registry)"`},
				"suspend.schedule":  {"PASS", "3 of 3 trials"},
				"suspend_methods":   {"SKIP", "measures only schedule"},
				"alloc_traced":      {"FAIL", "no traced allocation sequence"},
				"after_resume":      {"FAIL", "does not say how the victim ended"},
				"preempt_timeout":   {"INFO", "PREEMPT issued 3 times"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := ParseNVRMReport(strings.NewReader(tc.report))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			WriteNVRM(NewWriter(&buf, "nvrm"), rep)
			wantChecks(t, mustParse(t, buf.String()).Section("nvrm"), tc.want)
		})
	}
}

// TestMethodSlug names suspend methods from part titles.
func TestMethodSlug(t *testing.T) {
	for title, want := range map[string]string{
		"Suspend (disable-channels: FIFO_DISABLE_CHANNELS on the process's subdevice) and resume, all groups": "disable-channels",
		"Suspend (schedule: GPFIFO_SCHEDULE{0} + PREEMPT{bWait, manual timeout} per group) and resume":        "schedule",
		"Suspend (GPFIFO_SCHEDULE{0} + PREEMPT{bWait}) and resume, all groups":                                "schedule",
		"Suspend (NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS) and resume":                                          "disable-channels",
		"Suspend (Something Else) and resume":                                                                 "something_else",
	} {
		if got := MethodSlug(title); got != want {
			t.Errorf("%q: %q, want %q", title, got, want)
		}
	}
}

// FuzzParseNVRMReport checks that no report makes the parser or the checks
// panic.
func FuzzParseNVRMReport(f *testing.F) {
	for _, file := range []string{"testdata/nvrm-standin.log", "testdata/nvrm-synthetic.md"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("### Suspend (x)\n| measure | p50 |\n|---|---|\n| a |\n")
	f.Fuzz(func(t *testing.T, in string) {
		rep, err := ParseNVRMReport(strings.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		WriteNVRM(NewWriter(&buf, "nvrm"), rep)
		if _, err := Parse(&buf); err != nil {
			t.Fatal(err)
		}
	})
}
