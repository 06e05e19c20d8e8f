package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
)

func opString(op sim.Op) string {
	switch op.Kind {
	case sim.OpKernel:
		if op.Burst != nil {
			durs := op.Burst.Kernels(0, int(op.Count))
			var sum uint64
			for _, d := range durs {
				sum += d
			}
			if sum != op.Dur || len(durs) != int(op.Count) {
				return fmt.Sprintf("burst of %d summing to %d gave %d summing to %d", op.Count, op.Dur, len(durs), sum)
			}
			op.Durs = durs
		}
		if op.Durs != nil {
			var ks []string
			for _, d := range op.Durs {
				ks = append(ks, fmt.Sprintf("k%d", d/1000))
			}
			return strings.Join(ks, " ")
		}
		return fmt.Sprintf("k%d", op.Dur/1000)
	case sim.OpCopy:
		return fmt.Sprintf("c%d/%v", op.Bytes, op.Dir)
	case sim.OpSleep:
		return fmt.Sprintf("s%d", op.Dur/1000)
	case sim.OpWaitUntil:
		return fmt.Sprintf("w%d", op.At/1000)
	case sim.OpBegin:
		return fmt.Sprintf("b%d", op.At/1000)
	}
	return opName(op)
}

func TestLCProgramSteps(t *testing.T) {
	spec := `
gpus: 1
lc:
  - name: a
    gpu: 0
    arrival: {process: periodic, rate: 1000}
    request:
      - copy: {dir: h2d, bytes: 10}
      - kernel: {count: 2, duration: 5us, sync_each: true}
      - host: {duration: 7us}
      - kernel: {duration: 3us}
      - sync: {}
      - copy: {dir: d2h, bytes: 20}
`
	ws := specWorkloads(t, spec, "a.yaml")
	p := ws[0].Program(1, uint64(2500*time.Microsecond))
	var got []string
	// The host is ready at 0, at 1.5 ms (late: the 1 ms arrival waited)
	// and then asks again at 3 ms, past the horizon.
	for _, now := range []uint64{0, 1500_000, 3000_000} {
		for {
			op, err := p.Next(now)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, opString(op))
			if op.Kind == sim.OpEnd || op.Kind == sim.OpWaitUntil || op.Kind == sim.OpStop {
				break
			}
		}
	}
	req := "c10/htod k5 sync k5 sync s7 k3 sync c20/dtoh end"
	want := "b0 " + req + " b1000 " + req + " b2000 " + req
	if s := strings.Join(got, " "); !strings.HasPrefix(s, want) {
		t.Errorf("ops\n got %s\nwant %s ...", s, want)
	}
}

func TestArrivalsIndependentOfService(t *testing.T) {
	spec := "gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: lognormal, rate: 500, sigma: 1.5}\n    request:\n      - kernel: {duration: {dist: exp, mean: 100us}}\n"
	f, err := Parse([]byte(spec), "a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := f.Workloads()
	// Two hosts that poll at different times see the same arrivals and
	// the same kernel durations in the same order.
	collect := func(step uint64) (arrivals, kernels []uint64) {
		p := ws[0].Program(42, uint64(time.Second))
		for now := uint64(0); len(arrivals) < 200; now += step {
			for {
				op, err := p.Next(now)
				if err != nil {
					t.Fatal(err)
				}
				if op.Kind == sim.OpBegin {
					arrivals = append(arrivals, op.At)
				}
				if op.Kind == sim.OpKernel {
					kernels = append(kernels, op.Dur)
				}
				if op.Kind == sim.OpWaitUntil || op.Kind == sim.OpStop {
					break
				}
			}
		}
		return
	}
	a1, k1 := collect(100_000)
	a2, k2 := collect(3_000_000)
	for i := 0; i < 200; i++ {
		if a1[i] != a2[i] || k1[i] != k2[i] {
			t.Fatalf("request %d: arrival %d vs %d, kernel %d vs %d", i, a1[i], a2[i], k1[i], k2[i])
		}
	}
	// Mean inter-arrival close to 1/rate = 2 ms.
	if mean := float64(a1[199]-a1[0]) / 199; mean < 1e6 || mean > 4e6 {
		t.Errorf("mean inter-arrival %.0f ns, want about 2 ms", mean)
	}
}

func TestBEProgram(t *testing.T) {
	spec := "gpus: 1\nbe:\n  - {name: b, gpu: 0, kernel: 2ms, sync_every: 3, host_gap: 50us}\n"
	f, err := Parse([]byte(spec), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := f.Workloads()
	p := ws[0].Program(1, 0)
	var got []string
	for range 6 {
		op, _ := p.Next(0)
		got = append(got, opString(op))
	}
	if s := strings.Join(got, " "); s != "k2000 k2000 k2000 sync s50 k2000 k2000 k2000 sync s50" {
		t.Errorf("got %s", s)
	}
}

// specWorkloads parses a spec and builds its workloads, failing t on an
// error.
func specWorkloads(t *testing.T, spec, name string) []Workload {
	t.Helper()
	f, err := Parse([]byte(spec), name)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := f.Workloads()
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// TestSamplersShared: steps and workloads that draw from the same
// distribution share one sampler (and its quantile table); different
// distributions do not.
func TestSamplersShared(t *testing.T) {
	ws := specWorkloads(t, `
name: shared
gpus: 1
lc:
  - name: a
    arrival: {process: poisson, rate: 10}
    request:
      - kernel: {count: 4, duration: {dist: lognormal, mean: 50us, cv: 0.3}}
      - sync: {}
      - kernel: {count: 4, duration: {dist: lognormal, mean: 50us, cv: 0.3}}
      - kernel: {count: 4, duration: {dist: lognormal, mean: 50us, cv: 0.4}}
be:
  - name: b
    kernel: {dist: lognormal, mean: 50us, cv: 0.3}
`, "shared.yaml")
	lc := ws[0].newProgram(1, uint64(time.Second), ws[0].newDispatcher(1, uint64(time.Second)), nil).(*lcProgram)
	be := ws[1].newProgram(1, uint64(time.Second), nil, nil).(*beProgram)
	k1, k2, k3 := lc.steps[0].dur, lc.steps[2].dur, lc.steps[3].dur
	if k1 != k2 || k1 != be.kernel || k1.q == nil {
		t.Errorf("alike distributions: samplers %p, %p and %p (BE), want one", k1, k2, be.kernel)
	}
	if k3 == k1 || k3.sigma == k1.sigma {
		t.Errorf("cv 0.4 shares cv 0.3's sampler")
	}
}

func TestSamplers(t *testing.T) {
	cases := []struct {
		d        Dist
		lo, hi   float64 // bounds on the sample mean (µs)
		min, max uint64  // bounds on every sample (ns)
	}{
		{Dist{Dist: "const", Mean: Duration(100 * time.Microsecond)}, 100, 100, 100_000, 100_000},
		{Dist{Dist: "exp", Mean: Duration(100 * time.Microsecond)}, 95, 105, 1, 1 << 62},
		{Dist{Dist: "lognormal", Mean: Duration(100 * time.Microsecond), CV: 0.5}, 97, 103, 1, 1 << 62},
		{Dist{Dist: "uniform", Min: Duration(50 * time.Microsecond), Max: Duration(150 * time.Microsecond)}, 99, 101, 50_000, 150_000},
		{Dist{Dist: "exp", Mean: Duration(100 * time.Microsecond), Min: Duration(80 * time.Microsecond), Max: Duration(120 * time.Microsecond)}, 80, 120, 80_000, 120_000},
	}
	for _, c := range cases {
		s := newSampler(&c.d)
		r := newRand(7)
		var sum float64
		const n = 50000
		for range n {
			v := s.draw(r)
			if v < c.min || v > c.max {
				t.Fatalf("%+v: sample %d outside [%d, %d]", c.d, v, c.min, c.max)
			}
			sum += float64(v)
		}
		if m := sum / n / 1000; m < c.lo || m > c.hi {
			t.Errorf("%+v: mean %.2f µs, want [%v, %v]", c.d, m, c.lo, c.hi)
		}
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

// TestDrawInto: drawing a batch gives the values of drawing one at a
// time, in order, leaving the generator where they leave it, for every
// distribution and batch length (across the batch size of 64).
func TestDrawInto(t *testing.T) {
	dists := []Dist{
		{Dist: "const", Mean: Duration(100 * time.Microsecond)},
		{Dist: "exp", Mean: Duration(100 * time.Microsecond), Max: Duration(300 * time.Microsecond)},
		{Dist: "lognormal", Mean: Duration(40500 * time.Nanosecond), CV: 0.03},
		{Dist: "lognormal", Mean: Duration(100 * time.Microsecond), CV: 3, Min: Duration(time.Microsecond), Max: Duration(2 * time.Millisecond)},
		{Dist: "uniform", Min: Duration(50 * time.Microsecond), Max: Duration(150 * time.Microsecond)},
	}
	for _, d := range dists {
		s := newSampler(&d)
		for _, n := range []int{1, 7, 64, 65, 160, 300, 5000} {
			var one, batch gen
			one.seed(uint64(n), 0)
			batch.seed(uint64(n), 0)
			got := make([]uint64, n)
			s.drawInto(&batch, got)
			for i := range n {
				if want := s.draw(&one); got[i] != want {
					t.Fatalf("%+v, %d draws: draw %d is %d, want %d", d, n, i, got[i], want)
				}
			}
			if a, b := one.Uint64(), batch.Uint64(); a != b {
				t.Errorf("%+v, %d draws: the generator is left elsewhere", d, n)
			}
		}
	}
}

func TestParseArrivals(t *testing.T) {
	got, err := parseArrivals(strings.NewReader("# offsets\n\n1ms\n 1.5ms \n1.5ms\n2s\n"), "a.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{1e6, 1.5e6, 1.5e6, 2e9}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	cases := map[string]string{
		"1ms\n0.5ms\n": "a.txt:2: arrival offsets must be non-negative and non-decreasing",
		"1ms\nsoon\n":  `a.txt:2: bad duration "soon"`,
		"-1ms\n":       "a.txt:1: arrival offsets must be non-negative",
		"# nothing\n":  "a.txt: no arrivals",
		"1ms\n2\n":     `a.txt:2: bad duration "2"`,
	}
	for in, want := range cases {
		if _, err := parseArrivals(strings.NewReader(in), "a.txt"); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
}

func FuzzParseArrivals(f *testing.F) {
	f.Add("1ms\n2ms\n")
	f.Add("# c\n0s\n1h\n")
	f.Fuzz(func(t *testing.T, in string) {
		times, err := parseArrivals(strings.NewReader(in), "f.txt")
		if err != nil {
			return
		}
		for i := 1; i < len(times); i++ {
			if times[i] < times[i-1] {
				t.Fatalf("decreasing arrivals accepted: %v", times)
			}
		}
	})
}

// TestReplicasShareQueue: replicas take requests from one queue, and a
// request gets the same service times whichever replica serves it.
func TestReplicasShareQueue(t *testing.T) {
	spec := "gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    replicas: 3\n    arrival: {process: poisson, rate: 1000}\n    request:\n      - kernel: {count: 2, duration: {dist: exp, mean: 100us}}\n"
	ws := specWorkloads(t, spec, "a.yaml")
	if len(ws) != 3 || ws[0].Name != "a/0" || ws[2].Name != "a/2" || ws[1].Group != "a" {
		t.Fatalf("workloads %+v", ws)
	}
	// serve runs requests to completion, always on replica pick(i).
	serve := func(pick func(i int) int) map[uint64]string {
		progs := Programs(ws, 9, uint64(time.Second), nil)
		out := map[uint64]string{}
		now := uint64(0)
		for i := 0; len(out) < 100; i++ {
			p := progs[pick(i)]
			var at uint64
			var durs []string
			for {
				op, err := p.Next(now)
				if err != nil {
					t.Fatal(err)
				}
				if op.Kind == sim.OpWaitUntil {
					now = op.At
					continue
				}
				if op.Kind == sim.OpBegin {
					at = op.At
				}
				if op.Kind == sim.OpKernel {
					durs = append(durs, fmt.Sprint(op.Dur))
				}
				if op.Kind == sim.OpEnd {
					break
				}
			}
			if _, dup := out[at]; dup {
				t.Fatalf("request at %d served twice", at)
			}
			out[at] = strings.Join(durs, ",")
		}
		return out
	}
	one := serve(func(int) int { return 0 })
	rr := serve(func(i int) int { return i % 3 })
	for at, d := range one {
		if rr[at] != d {
			t.Fatalf("request at %d: %s on one replica, %s round-robin", at, d, rr[at])
		}
	}
}

// TestUniformArrivals: inter-arrival times of process uniform stay
// between min and max and average their midpoint.
func TestUniformArrivals(t *testing.T) {
	g := newArrivals(&Arrival{Process: "uniform", Min: Duration(17 * time.Millisecond), Max: Duration(49 * time.Millisecond)}, nil, newRand(3))
	prev, n := uint64(0), 0
	for ; n < 2000; n++ {
		a, _ := g.next()
		if d := a - prev; n > 0 && (d < uint64(17*time.Millisecond) || d > uint64(49*time.Millisecond)) {
			t.Fatalf("interval %v", time.Duration(d))
		}
		prev = a
	}
	if mean := time.Duration(prev / uint64(n)); mean < 32*time.Millisecond || mean > 34*time.Millisecond {
		t.Errorf("mean interval %v, want about 33ms", mean)
	}
}
