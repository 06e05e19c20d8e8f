package workload

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodSpec = `
name: small
gpus: 2
duration: 10s
model:
  timeslice: 2ms
  granularity: block
  control_latency: 300us
lc:
  - name: infer
    gpu: 0
    slo: {target: 5ms, percentile: 99}
    arrival: {process: poisson, rate: 100}
    request:
      - copy: {dir: h2d, bytes: 600000}
      - kernel: {count: 10, duration: {dist: lognormal, mean: 150us, cv: 0.3}}
      - host: {duration: 20us}
      - copy: {dir: d2h, bytes: 4000}
be:
  - name: train
    gpu: 1
    kernel: 20ms
    sync_every: 4
`

func TestParseGood(t *testing.T) {
	f, err := Parse([]byte(goodSpec), "good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := f.Spec
	if s.Name != "small" || s.GPUs != 2 || time.Duration(s.Duration) != 10*time.Second || len(s.LC) != 1 || len(s.BE) != 1 {
		t.Fatalf("spec %+v", s)
	}
	k := s.LC[0].Request[1].Kernel
	if k.Count != 10 || k.Duration.Dist != "lognormal" || time.Duration(k.Duration.Mean) != 150*time.Microsecond || k.Duration.CV != 0.3 {
		t.Errorf("kernel step %+v", k)
	}
	if s.BE[0].Kernel.Dist != "const" || time.Duration(s.BE[0].Kernel.Mean) != 20*time.Millisecond {
		t.Errorf("be kernel %+v", s.BE[0].Kernel)
	}
	o, err := f.Options()
	if err != nil || o.GPUs != 2 || o.Timeslice != 2*time.Millisecond || o.Granularity != 1 {
		t.Errorf("options %+v %v", o, err)
	}
	if cl := f.ControlLatency(); cl == nil || *cl != 300*time.Microsecond {
		t.Errorf("control latency %v", cl)
	}
	ws, err := f.Workloads()
	if err != nil || len(ws) != 2 || ws[0].Name != "infer" || ws[1].GPU != 1 {
		t.Fatalf("workloads %+v %v", ws, err)
	}
}

func TestParseJSON(t *testing.T) {
	js := `{"gpus": 1, "be": [{"name": "b", "gpu": 0, "kernel": {"mean": "1ms"}}]}`
	if _, err := Parse([]byte(js), "w.json"); err != nil {
		t.Fatal(err)
	}
	js = `{"gpus": 1, "be": [{"name": "b", "gpu": 0, "kernel": {"mean": "1ms", "bogus": 1}}]}`
	_, err := Parse([]byte(js), "w.json")
	want := `w.json:1: be[0].kernel.bogus: unknown field`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want prefix %q", err, want)
	}
}

func TestParseErrors(t *testing.T) {
	base := func(lc string) string {
		return "gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: poisson, rate: 10}\n    request:\n      - kernel: {duration: 1ms}\n" + lc
	}
	cases := []struct {
		name, spec, want string
	}{
		{"unknown top", "gpus: 1\ngpu_count: 2\n", "x.yaml:2: gpu_count: unknown field"},
		{"unknown nested", base("    slo: {target: 1ms, pct: 9}\n"), "x.yaml:8: lc[0].slo.pct: unknown field"},
		{"zero gpus", "gpus: 0\nbe: [{name: b, gpu: 0, kernel: 1ms}]\n", "x.yaml:1: gpus: 0 GPUs: must be between 1"},
		{"missing gpus", "be: [{name: b, gpu: 0, kernel: 1ms}]\n", "gpus: 0 GPUs"},
		{"negative kernel", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: -5ms\n", "x.yaml:5: be[0].kernel: -5ms: a duration must not be negative"},
		{"negative min", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: lognormal, mean: 1ms, min: -2ms}\n", "x.yaml:5: be[0].kernel.min: -2ms: a duration must not be negative"},
		{"zero kernel", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: 0s\n", "x.yaml:5: be[0].kernel: 0s: a duration here must be positive"},
		{"const without mean", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: const}\n", "x.yaml:5: be[0].kernel.mean: required and must be positive"},
		{"const with negative min", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: const, mean: 1ms, min: -2ms}\n", "x.yaml:5: be[0].kernel.min: -2ms"},
		{"empty", "\n  \n", "x.yaml: empty: a workload spec gives gpus and at least one workload"},
		{"number for duration", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: 5\n", `x.yaml:5: be[0].kernel: want a duration string with a unit such as "250us", got number 5`},
		{"bad duration", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: 5 parsecs\n", `be[0].kernel: bad duration "5 parsecs"`},
		{"huge rate", strings.Replace(base(""), "rate: 10", "rate: 1e12", 1), "x.yaml:5: lc[0].arrival.rate: 1e+12 requests/s: must be positive and at most 1e+06"},
		{"zero rate", strings.Replace(base(""), "rate: 10", "rate: 0", 1), "lc[0].arrival.rate: missing or 0: process poisson needs requests per second"},
		{"no rate", strings.Replace(base(""), "{process: poisson, rate: 10}", "{process: poisson}", 1), "lc[0].arrival.rate: missing or 0: process poisson"},
		{"bad process", strings.Replace(base(""), "poisson", "bursty", 1), `x.yaml:5: lc[0].arrival.process: "bursty": want poisson`},
		{"gpu out of range", strings.Replace(base(""), "gpu: 0", "gpu: 3", 1), "x.yaml:4: lc[0].gpu: gpu 3 does not exist"},
		{"two kinds in a step", base("      - {copy: {dir: h2d, bytes: 1}, sync: {}}\n"), "x.yaml:8: lc[0].request[1]: a step is exactly one of"},
		{"bad dir", base("      - copy: {dir: sideways, bytes: 1}\n"), `x.yaml:8: lc[0].request[1].copy.dir: "sideways"`},
		{"string for int", base("    max_pending: lots\n"), `x.yaml:8: lc[0].max_pending: want an integer, got string "lots"`},
		{"list for map", "gpus: 1\nmodel: [1]\n", "x.yaml:2: model: want a mapping, got a list"},
		{"duplicate name", "gpus: 1\nbe: [{name: b, gpu: 0, kernel: 1ms}, {name: b, gpu: 0, kernel: 1ms}]\n", `be[1].name: name "b" already used at be[0].name`},
		{"no workloads", "gpus: 1\n", "no workloads"},
		{"not yaml", "gpus: [1\n", "x.yaml: not valid YAML or JSON"},
		{"unclosed flow mapping, its line", "name: x\ngpus: 1\nlc:\n  - name: a\n    arrival: {process: poisson, rate: 10\n    request: []\n",
			"x.yaml: not valid YAML or JSON: line 5: did not find expected ',' or '}'"},
		{"negative slo", base("    slo: {target: -1ms}\n"), "x.yaml:8: lc[0].slo.target: -1ms: must be positive"},
		{"cv on const", "gpus: 1\nbe: [{name: b, gpu: 0, kernel: {mean: 1ms, cv: 1}}]\n", "be[0].kernel.cv: cv applies to dist lognormal only"},
		{"trace without times", strings.Replace(base(""), "{process: poisson, rate: 10}", "{process: trace}", 1), "lc[0].arrival: process trace needs its arrivals: times (a list of offsets"},
		{"trace with both", strings.Replace(base(""), "{process: poisson, rate: 10}", "{process: trace, times: [1ms], file: t.txt}", 1), "lc[0].arrival: process trace takes times or file, not both"},
		{"decreasing times", strings.Replace(base(""), "{process: poisson, rate: 10}", "{process: trace, times: [2ms, 1ms]}", 1), "lc[0].arrival.times[1]: 1ms"},
		{"bad request_end", "gpus: 1\nreplay: [{file: x, processes: [{pid: 1, name: a, class: lc, gpu: 0, request_end: never}]}]\n", `replay[0].processes[0].request_end: "never": want gap or sync`},
		{"pid and comm", "gpus: 1\nreplay: [{file: x, processes: [{pid: 1, comm: a, name: a, class: lc, gpu: 0}]}]\n", "replay[0].processes[0]: give exactly one of pid and comm"},
		{"too many replicas", base("    replicas: 65\n"), "x.yaml:8: lc[0].replicas: 65: must be between 1 and 64"},
		{"bad model", "gpus: 1\nmodel: {granularity: warp}\nbe: [{name: b, gpu: 0, kernel: 1ms}]\n", `x.yaml:2: model.granularity: "warp"`},
		{"NaN slowdown", "gpus: 1\nmodel:\n  spatial_slowdown: .nan\nbe: [{name: b, gpu: 0, kernel: 1ms}]\n", "x.yaml:3: model.spatial_slowdown: .nan: want a finite number"},
		{"Inf bandwidth", "gpus: 1\nmodel: {copy_bandwidth: .inf}\nbe: [{name: b, gpu: 0, kernel: 1ms}]\n", "x.yaml:2: model.copy_bandwidth: .inf: want a finite number"},
		{"NaN percentile", base("    slo: {target: 1ms, percentile: .NaN}\n"), "x.yaml:8: lc[0].slo.percentile: .NaN: want a finite number"},
		{"NaN cv", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: lognormal, mean: 1ms, cv: -.inf}\n", "x.yaml:5: be[0].kernel.cv: -.inf: want a finite number"},
		{"sigma with poisson", strings.Replace(base(""), "rate: 10}", "rate: 10, sigma: 2}", 1), "x.yaml:5: lc[0].arrival.sigma: sigma applies to process lognormal only"},
		{"mean with uniform", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: uniform, mean: 2ms, min: 1ms, max: 3ms}\n", "x.yaml:5: be[0].kernel.mean: a uniform distribution is set by min and max"},
		// A field the distribution or process does not take is refused
		// even where it is 0: it says the spec was meant otherwise.
		{"zero cv with exp", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: exp, mean: 1ms, cv: 0}\n", "x.yaml:5: be[0].kernel.cv: cv applies to dist lognormal only"},
		{"zero mean with uniform", "gpus: 1\nbe:\n  - name: b\n    gpu: 0\n    kernel: {dist: uniform, min: 1ms, max: 2ms, mean: 0s}\n", "x.yaml:5: be[0].kernel.mean: a uniform distribution is set by min and max"},
		{"zero sigma with periodic", strings.Replace(base(""), "poisson, rate: 10}", "periodic, rate: 10, sigma: 0}", 1), "x.yaml:5: lc[0].arrival.sigma: sigma applies to process lognormal only, not periodic"},
		{"zero min with poisson", strings.Replace(base(""), "rate: 10}", "rate: 10, min: 0s}", 1), "x.yaml:5: lc[0].arrival.min: min applies to process uniform only, not poisson"},
		{"empty times with poisson", strings.Replace(base(""), "rate: 10}", "rate: 10, times: []}", 1), "x.yaml:5: lc[0].arrival.times: times applies to process trace only, not poisson"},
		{"control characters in the name", "name: \"a\\e[31mred\\a\"\n" + base(""), `x.yaml:1: name: "a\x1b[31mred\a": want at most 128 printable characters`},
		{"a long name", "name: " + strings.Repeat("n", 129) + "\n" + base(""), "x.yaml:1: name: \"nnnn"},
		{"fields in sync", base("      - sync: {x: 1}\n"), "x.yaml:8: lc[0].request[1].sync.x: unknown field: lc[0].request[1].sync takes no fields (write sync: {})"},
		{"binary", "gpus: 1\x00\x01\x02" + strings.Repeat("\xff", 5000), "x.yaml: not a text file (binary data at byte offset 7)"},
		{"invalid UTF-8 before a NUL", "gp\xffus: 1\x00", "x.yaml: not a text file (binary data at byte offset 2)"},
		{"trace file", "ARBTRACE\x01\x00garbage", "x.yaml: this is a trace recorded by arbiter trace --record, not a workload spec"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.spec), "x.yaml")
			if err == nil {
				t.Fatalf("accepted")
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("not a *FieldError: %T", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("got  %v\nwant %q", err, c.want)
			}
		})
	}
}

// TestParseEchoesLittle: a long or binary value is quoted in a message
// cut to a few dozen characters, never echoed whole.
func TestParseEchoesLittle(t *testing.T) {
	blob := strings.Repeat("ab\u00e9", 3000)
	for _, spec := range []string{
		"gpus: 1\nbe: [{name: \"" + blob + "\", gpu: 0, kernel: 1ms}]\n",
		"gpus: 1\n" + blob + ": 1\n",
		"gpus: 1\nbe: [{name: b, gpu: 0, kernel: \"" + blob + "\"}]\n",
		"gpus: 1\nbe: [{name: b, gpu: 0, kernel: 1ms, sync_every: " + strings.Repeat("9", 5000) + "}]\n",
	} {
		_, err := Parse([]byte(spec), "x.yaml")
		if err == nil || len(err.Error()) > 300 {
			t.Errorf("error of %d bytes: %.400v", len(fmt.Sprint(err)), err)
		}
	}
}

// TestParseWarnings: an explicit 0 that stands for a default is valid
// but probably not meant: it is reported with its line.
func TestParseWarnings(t *testing.T) {
	spec := "gpus: 1\nmodel:\n  timeslice: 0s\n  spatial_slowdown: 0\n  control_latency: 0s\nbe:\n  - {name: b, gpu: 0, kernel: 1ms, sync_every: 0}\n"
	f, err := Parse([]byte(spec), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(f.Warnings, "\n")
	for _, want := range []string{"w.yaml:3: model.timeslice: 0 means the default (1.024ms)",
		"w.yaml:4: model.spatial_slowdown: 0 means the default (0.7); not \"no interference\"",
		"w.yaml:7: be[0].sync_every: 0 means the default (a sync after every kernel)"} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "control_latency") {
		t.Errorf("control_latency 0s is meaningful (at once), not a default: %s", got)
	}
	if cl := f.ControlLatency(); cl == nil || *cl != 0 {
		t.Errorf("explicit control_latency 0s read as %v", cl)
	}
	if f, _ := Parse([]byte(goodSpec), "good.yaml"); len(f.Warnings) != 0 {
		t.Errorf("warnings for a spec without zeros: %v", f.Warnings)
	}
}

// TestNullIsNotWritten: a field written as null is a field not written,
// here as everywhere in a spec: it is no field that does not apply.
func TestNullIsNotWritten(t *testing.T) {
	for _, spec := range []string{
		"gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: poisson, rate: 10, think: null, sigma: ~, times: null, file: null}\n    request:\n      - kernel: {duration: {dist: exp, mean: 1ms, cv: null}}\n",
		"gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: closed, rate: ~}\n    request:\n      - kernel: {duration: {dist: uniform, min: 1ms, max: 2ms, mean: null}}\n",
		`{"gpus": 1, "lc": [{"name": "a", "gpu": 0, "arrival": {"process": "closed", "think": null, "sigma": null}, "request": [{"kernel": {"duration": "1ms"}}]}]}`,
	} {
		if _, err := Parse([]byte(spec), "n.yaml"); err != nil {
			t.Errorf("%v\n%s", err, spec)
		}
	}
}

// TestLoadWarnings: an LC workload asking 500× the GPU's time is reported
// before the run with the numbers; a feasible one is not.
func TestLoadWarnings(t *testing.T) {
	spec := func(rate int) string {
		return fmt.Sprintf("gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: poisson, rate: %d}\n"+
			"    request:\n      - kernel: {count: 10, duration: {dist: uniform, min: 0.5ms, max: 1.5ms}}\n", rate)
	}
	f, err := Parse([]byte(spec(50000)), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w := LoadWarnings(f, time.Hour)
	if len(w) != 1 || !strings.Contains(w[0], "gpu 0: the LC workload a asks for 500 s of kernel time per simulated second, 500× what the GPU has: no baseline can serve it, and its queue grows") ||
		!strings.Contains(w[0], "a has max_pending 100000 requests waiting after about 2.004s and turns later ones away") {
		t.Errorf("warnings %q", w)
	}
	f, _ = Parse([]byte(spec(50)), "w.yaml")
	if w := LoadWarnings(f, time.Hour); len(w) != 0 {
		t.Errorf("feasible load warned: %q", w)
	}
	// Three recorded arrivals a millisecond apart, 10 s of kernel each:
	// 30 s of work, spread over the run, not over the 2 ms they span.
	f, err = Parse([]byte("gpus: 1\nlc:\n  - name: r\n    gpu: 0\n    arrival: {process: trace, times: [0s, 1ms, 2ms]}\n"+
		"    request:\n      - kernel: {duration: 10s}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if w := LoadWarnings(f, time.Hour); len(w) != 0 {
		t.Errorf("30 s of work in an hour warned: %q", w)
	}
	if w := LoadWarnings(f, 20*time.Second); len(w) != 1 || !strings.Contains(w[0], "asks for 1.5 s of kernel time per simulated second, 1.5× what the GPU has") ||
		strings.Contains(w[0], "max_pending") {
		t.Errorf("30 s of work in 20 s: %q", w)
	}
}

// TestLoadBounded: Load reads no more than a spec may hold, so a device
// that never ends, or a huge file, is refused at once, as binary data
// where its head is binary.
func TestLoadBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("# a comment line\n"), maxSpecBytes/16), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{"/dev/zero", "/dev/zero: not a text file (binary data at byte offset 0)"},
		{big, big + ": more than 8388608 bytes (8 MiB): a workload spec is a small YAML or JSON text"},
	} {
		_, err := Load(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%s): %v, want %q", c.path, err, c.want)
		}
	}
	// Past the limit, a multi-byte character cut at the end of the head
	// looked at is text, not binary.
	long := append(bytes.Repeat([]byte("#"), 64<<10-1), "é"...)
	long = append(long, bytes.Repeat([]byte("#"), maxSpecBytes)...)
	if _, err := Parse(long, "long.yaml"); err == nil || !strings.Contains(err.Error(), "more than 8388608 bytes") {
		t.Errorf("long text with a character across the head's end: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte(`{"gpus": 1, "be": [{"name": "b", "gpu": 0, "kernel": "1ms"}]}`))
	f.Add([]byte("gpus: 1\nbe: [{name: b, gpu: 0, kernel: {dist: uniform, min: 1us, max: 2us}}]\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data, "fuzz.yaml")
		if err != nil {
			return
		}
		if _, err := file.Workloads(); err != nil {
			return
		}
	})
}
