package gpuvalidate

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// channelSteps is a command log as the channels section writes it, for a
// victim (pid 500) on a GSP GPU, with two suspend methods.
const channelSteps = `@@ watch 1000 3000 0 $BUNDLE/arbiter channels watch --format json
{"class":65,"class_name":"client","client":1,"fd":5,"kind":"rm_alloc","object":1,"parent":0,"pid":500}
{"class":41068,"class_name":"channel-group","client":1,"engine":"graphics","fd":5,"kind":"rm_alloc","object":3,"parent":2,"pid":500}
{"class":41068,"class_name":"channel-group","client":1,"engine":"copy2","fd":5,"kind":"rm_alloc","object":4,"parent":2,"pid":500}
{"class":41068,"class_name":"channel-group","client":9,"engine":"graphics","fd":5,"kind":"rm_alloc","object":3,"parent":2,"pid":501}
{"client":1,"control":"SET_TIMESLICE","fd":5,"kind":"rm_control","object":3,"pid":500,"value":1024}
tracer: 5 records read, 0 undecodable
@@ list 3000 3100 0 $BUNDLE/arbiter channels list --format json
note: no tracer is pinned: handles come from the saved state only
[{"pid":500,"comm":"victim","known":true,"groups":[{"gpu":0,"engine":"graphics","channels":8,"timeslice_us":1024,"queried_timeslice_us":1024,"timeslice_set_by":"process","state":"scheduled"}]}]
@@ timeslice 3100 3200 0 $BUNDLE/arbiter channels timeslice 500 200
process 500 group 0x5c000003 (graphics, GPU 0): timeslice set to 200 µs, driver reports 200 µs
@@ interleave.low 3200 3300 0 $BUNDLE/arbiter channels interleave 500 low
process 500: interleave level low
@@ interleave.high 3300 3400 77 $BUNDLE/arbiter channels interleave 500 high
arbiter: setting another process's interleave level needs CAP_SYS_NICE
@@ suspend.schedule.1 4000 4200 0 $BUNDLE/arbiter channels suspend 500 --for 100ms --method schedule
process 500 suspended in 650µs (GPU 0: schedule, 1 group)
process 500 resumed in 300µs
@@ suspend.schedule.2 4300 4500 0 $BUNDLE/arbiter channels suspend 500 --for 100ms --method schedule
process 500 suspended in 700µs (GPU 0: schedule, 1 group)
process 500 resumed in 310µs
@@ suspend.disable-channels.1 5000 5200 0 $BUNDLE/arbiter channels suspend 500 --for 100ms --method disable-channels
process 500 suspended in 320µs (GPU 0: disable-channels, 8 channels)
process 500 resumed in 150µs
@@ suspend.disable-channels.2 5300 5500 1 $BUNDLE/arbiter channels suspend 500 --for 100ms --method disable-channels
arbiter: {"error":"FIFO_DISABLE_CHANNELS: NV_ERR_NOT_SUPPORTED"}
@@ resume 6000 6100 0 $BUNDLE/arbiter channels resume 500
process 500 resumed
`

// TestChannels checks the command-line section's checks, with a victim
// that reports its stalls: the schedule suspensions each stalled it, one
// of the two disable-channels suspensions failed.
func TestChannels(t *testing.T) {
	steps, err := ParseSteps(strings.NewReader(channelSteps))
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 10 || steps[5].Label != "suspend.schedule.1" || steps[5].Start != 4000 || steps[5].End != 4200 || steps[4].Exit != 77 {
		t.Fatalf("steps: %+v", steps)
	}
	victim, err := ParseVictim(strings.NewReader("ready 0x7f00\nmonitor on\nstall 4010.5 120.25\nstall 4310 110\nstall 5020 105\nstall 9000 6\nx: noise\ncorrect: 1048576 elements, spin count 99\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !victim.Ready || !victim.Monitor || len(victim.Stalls) != 4 || victim.Stalls[0] != (Stall{4010.5, 120.25}) || !strings.HasPrefix(victim.Verdict, "correct") || len(victim.Messages) != 1 {
		t.Fatalf("victim: %+v", victim)
	}
	var buf bytes.Buffer
	WriteChannels(NewWriter(&buf, "channels"), steps, victim, 500)
	s := mustParse(t, buf.String()).Section("channels")
	wantChecks(t, s, map[string][2]string{
		"watch":                    {"PASS", "the victim's allocations: client ×1, channel-group ×2; engines graphics, copy2; its own controls: SET_TIMESLICE 1024"},
		"list":                     {"PASS", "1 groups: graphics on GPU 0 (8 channels, 1024 µs queried, 1024 µs by process, scheduled)"},
		"timeslice":                {"PASS", "exit 0: set 200 µs, driver reports 200 µs"},
		"interleave":               {"FAIL", "interleave.high exit 77: arbiter: setting another process's interleave level needs CAP_SYS_NICE"},
		"suspend.schedule":         {"PASS", "2 trials of suspend --for and resume (GPU 0: schedule, 1 group): suspend call p50 700µs, p99 700µs"},
		"stopped.schedule":         {"PASS", "stalled during each of 2 suspensions, median stall 120.2 ms"},
		"suspend.disable-channels": {"FAIL", `1 of 2 trials failed: suspend.disable-channels.2 exit 1: arbiter: {"error":"FIFO_DISABLE_CHANNELS: NV_ERR_NOT_SUPPORTED"}`},
		"stopped.disable-channels": {"PASS", "each of 1 suspensions"},
		"resume":                   {"PASS", "process 500 resumed"},
		"after_resume":             {"PASS", "correct: 1048576 elements"},
	})
	if len(s.Notes) != 1 || s.Notes[0] != "list said: note: no tracer is pinned: handles come from the saved state only" {
		t.Errorf("notes: %q", s.Notes)
	}
	for name, want := range map[string]float64{
		"schedule.suspend_call.p50":         700,
		"schedule.resume_call.max":          310,
		"disable-channels.suspend_call.p50": 320,
		"list.groups":                       1,
	} {
		if v, ok := s.Value(name); !ok || v.Num != want {
			t.Errorf("%s = %+v, want %v", name, v, want)
		}
	}

	// A stall outside the command's window does not count.
	victim.Stalls = []Stall{{4010, 120}, {9000, 200}}
	buf.Reset()
	WriteChannels(NewWriter(&buf, "channels"), steps[5:7], victim, 500)
	wantChecks(t, mustParse(t, buf.String()).Section("channels"), map[string][2]string{
		"stopped.schedule": {"FAIL", "the kernel stalled during 1 of 2 suspensions"},
		"after_resume":     {"PASS", ""},
	})

	// The stand-in's victim does not monitor: stops are not checked, a
	// missing verdict is.
	buf.Reset()
	WriteChannels(NewWriter(&buf, "channels"), steps[5:6], Victim{Ready: true, Messages: []string{"killed"}}, 500)
	wantChecks(t, mustParse(t, buf.String()).Section("channels"), map[string][2]string{
		"suspend.schedule": {"PASS", "1 trials"},
		"stopped.schedule": {"SKIP", "does not watch its own kernel"},
		"after_resume":     {"FAIL", "the victim gave no verdict (killed)"},
	})
}

// TestChannelsListProblems checks list output that does not show the
// victim.
func TestChannelsListProblems(t *testing.T) {
	for out, want := range map[string]string{
		`{"error":"no NVIDIA driver"}`:                   "printed no JSON list",
		`[{"pid":9,"known":true,"groups":[{}]}]`:         "pid 500 is not listed (1 processes)",
		`[{"pid":500,"known":false,"groups":[]}]`:        "pid 500 listed with known=false and 0 groups",
		`[{"pid":500,"known":true,"groups":[]}, {}]`:     "listed with known=true and 0 groups",
		"arbiter: the RM registry is kept by another...": "printed no JSON list",
		"[{\"pid\": 500, \"groups\": [}":                 "output is not a JSON list (invalid character '}'",
	} {
		var buf bytes.Buffer
		WriteChannels(NewWriter(&buf, "c"), []Step{{Label: "list", Exit: 1, Output: []string{out}}}, Victim{Verdict: "correct"}, 500)
		wantChecks(t, mustParse(t, buf.String()).Section("c"), map[string][2]string{"list": {"FAIL", want}})
	}
}

// TestParseStepsErrors checks malformed command logs.
func TestParseStepsErrors(t *testing.T) {
	for _, in := range []string{"output first\n@@ a 1 2 0 cmd\n", "@@ a 1\n", "@@ a x 2 0 cmd\n", "@@ a 1 2 zero cmd\n"} {
		if _, err := ParseSteps(strings.NewReader(in)); err == nil {
			t.Errorf("accepted %q", in)
		}
	}
	steps, err := ParseSteps(strings.NewReader("\n@@ a 1 2 0\n"))
	if err != nil || len(steps) != 1 || steps[0].Command != "" {
		t.Errorf("a step without a command: %+v, %v", steps, err)
	}
}

// TestSuspendMethods reads the methods from several forms of the suspend
// command's help.
func TestSuspendMethods(t *testing.T) {
	for help, want := range map[string]string{
		`      --method string   how: auto, schedule or disable-channels (default "auto")`:        "auto schedule disable-channels",
		`      --method string   how to suspend: "schedule" or "disable-channels"`:                "schedule disable-channels",
		`      --method string   how to suspend (schedule|disable-channels) (default "schedule")`: "schedule disable-channels",
		`      --method string   suspend method (default "auto")`:                                 "auto",
		"      --for duration    resume after this long\n      --gpu int   only this GPU":         "",
	} {
		if got := strings.Join(SuspendMethods(help), " "); got != want {
			t.Errorf("%q: %q, want %q", help, got, want)
		}
	}
}

// TestPercentiles matches nvrm's procedure's definition.
func TestPercentiles(t *testing.T) {
	var v []time.Duration
	for i := 100; i >= 1; i-- {
		v = append(v, time.Duration(i)*time.Millisecond)
	}
	p50, p99, max := Percentiles(v)
	if p50 != 51*time.Millisecond || p99 != 100*time.Millisecond || max != 100*time.Millisecond || v[0] != 100*time.Millisecond {
		t.Errorf("p50 %v p99 %v max %v (input changed: %v)", p50, p99, max, v[0] != 100*time.Millisecond)
	}
	if a, b, c := Percentiles(nil); a != 0 || b != 0 || c != 0 {
		t.Error("percentiles of nothing")
	}
}
