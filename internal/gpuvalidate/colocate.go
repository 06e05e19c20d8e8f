package gpuvalidate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Scenario is one run of the co-location section: a latency-critical (LC)
// and a best-effort (BE) workload alone or side by side, under one way of
// sharing the GPU.
type Scenario struct {
	// Name is the scenario's name (lc-alone, be-alone, default, …);
	// What says what was applied, Skip why it did not run.
	Name, What, Skip string
	// LC and BE are the workloads' own summaries, nil where one did not
	// run.
	LC, BE *Workload
	// Steps are the control commands applied for the scenario.
	Steps []Step
}

// LoadScenarios reads the co-location section's directory: per scenario,
// in the order of their names' numeric prefixes (01-lc-alone),
// NAME.lc.txt and NAME.be.txt (the workloads' output), NAME.what (what was
// applied), NAME.skip (why it did not run) and NAME.steps (a command log
// of the controls, as ParseSteps reads).
func LoadScenarios(dir string) ([]Scenario, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read co-location results: %w", err)
	}
	var names []string
	for _, e := range entries {
		base, _, ok := strings.Cut(e.Name(), ".")
		if ok && !slices.Contains(names, base) {
			names = append(names, base)
		}
	}
	slices.Sort(names)
	var out []Scenario
	for _, base := range names {
		s := Scenario{Name: base}
		if _, name, ok := strings.Cut(base, "-"); ok && strings.Trim(base[:len(base)-len(name)-1], "0123456789") == "" {
			s.Name = name
		}
		read := func(ext string) (string, bool, error) {
			b, err := os.ReadFile(filepath.Join(dir, base+ext))
			if os.IsNotExist(err) {
				return "", false, nil
			}
			if err != nil {
				return "", false, fmt.Errorf("read co-location results: %w", err)
			}
			return string(b), true, nil
		}
		var text string
		var ok bool
		if text, _, err = read(".what"); err != nil {
			return nil, err
		}
		s.What = strings.TrimSpace(text)
		if text, _, err = read(".skip"); err != nil {
			return nil, err
		}
		s.Skip = strings.TrimSpace(text)
		for _, wl := range []struct {
			ext string
			dst **Workload
		}{{".lc.txt", &s.LC}, {".be.txt", &s.BE}} {
			if text, ok, err = read(wl.ext); err != nil {
				return nil, err
			} else if ok {
				w, err := ParseWorkload(strings.NewReader(text))
				if err != nil {
					return nil, fmt.Errorf("scenario %s: %w", base, err)
				}
				*wl.dst = &w
			}
		}
		if text, ok, err = read(".steps"); err != nil {
			return nil, err
		} else if ok {
			if s.Steps, err = ParseSteps(strings.NewReader(text)); err != nil {
				return nil, fmt.Errorf("scenario %s: %w", base, err)
			}
		}
		if s.LC != nil && s.BE != nil && s.LC.Window[1] > 0 && len(s.BE.Progress) > 0 {
			// Side by side: the BE's rate over the LC's measured window,
			// not over its own run, which starts before the LC and ends
			// after it.
			rate, ok := s.BE.RateIn(s.LC.Window[0], s.LC.Window[1])
			if !ok {
				return nil, fmt.Errorf("scenario %s: the BE's progress does not cover the LC's window", base)
			}
			s.BE.Throughput, s.BE.Rate = true, rate
			s.BE.Seconds = float64(s.LC.Window[1]-s.LC.Window[0]) / 1e9
		}
		out = append(out, s)
	}
	return out, nil
}

// WriteColocate records each scenario's LC latency and BE throughput, and
// both against the workloads run alone.
func WriteColocate(w *Writer, scenarios []Scenario) {
	var lcAlone, beAlone *Workload
	for _, s := range scenarios {
		if s.Skip != "" {
			continue
		}
		if s.LC != nil && s.BE == nil && lcAlone == nil && s.LC.Latency {
			lcAlone = s.LC
		}
		if s.BE != nil && s.LC == nil && beAlone == nil && s.BE.Throughput {
			beAlone = s.BE
		}
	}
	if len(scenarios) == 0 {
		w.Check("scenarios", Fail, "no scenario ran")
		return
	}
	ran, failed, skipped := 0, 0, 0
	for _, s := range scenarios {
		name := "scenario." + s.Name
		if s.Skip != "" {
			skipped++
			w.Check(name, Skip, "%s", s.Skip)
			continue
		}
		ran++
		var seen, bad []string
		if s.What != "" {
			seen = append(seen, s.What)
		}
		for _, st := range s.Steps {
			if st.Exit != 0 {
				bad = append(bad, fmt.Sprintf("%s exit %d: %s", st.Command, st.Exit, summarize(st.Output, 2)))
			}
		}
		if s.LC != nil {
			switch lc := s.LC; {
			case !lc.Latency || lc.Requests == 0:
				bad = append(bad, fmt.Sprintf("LC printed no latencies (%s)", orNone(lc.Other)))
			default:
				w.Result(s.Name+".lc.p50", lc.P50, "us")
				w.Result(s.Name+".lc.p99", lc.P99, "us")
				w.Result(s.Name+".lc.max", lc.MaxLat, "us")
				w.Result(s.Name+".lc.requests", lc.Requests, "requests")
				text := fmt.Sprintf("LC %d requests: p50 %.0f µs, p99 %.0f µs", lc.Requests, lc.P50, lc.P99)
				if lcAlone != nil && lc != lcAlone && lcAlone.P99 > 0 {
					r := lc.P99 / lcAlone.P99
					w.Result(s.Name+".lc.p99_vs_alone", r, "x")
					text += fmt.Sprintf(" (%.2f× alone)", r)
				}
				seen = append(seen, text)
			}
		}
		if s.BE != nil {
			switch be := s.BE; {
			case !be.Throughput:
				bad = append(bad, fmt.Sprintf("BE printed no throughput (%s)", orNone(be.Other)))
			default:
				unit := be.Unit
				if unit == "" {
					unit = "launches"
				}
				w.Result(s.Name+".be.rate", be.Rate, unit+"/s")
				text := fmt.Sprintf("BE %.1f %s/s", be.Rate, unit)
				if beAlone != nil && be != beAlone && beAlone.Rate > 0 {
					r := be.Rate / beAlone.Rate
					w.Result(s.Name+".be.vs_alone", r, "x")
					text += fmt.Sprintf(" (%.0f%% of alone)", 100*r)
				}
				seen = append(seen, text)
			}
		}
		if len(bad) > 0 {
			failed++
			w.Check(name, Fail, "%s", strings.Join(append(bad, seen...), "; "))
			continue
		}
		w.Check(name, Info, "%s", strings.Join(seen, "; "))
	}
	if ran > 0 && failed == 0 {
		w.Check("scenarios", Pass, "%d scenarios ran and reported, %d skipped", ran, skipped)
	}
}
