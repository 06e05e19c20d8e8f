package gpuvalidate

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriterParseRoundTrip checks that what a Writer writes parses back
// to the same records, whatever its text holds.
func TestWriterParseRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString("META date 2026-11-25T09:00:00Z\nMETA gpu.0 NVIDIA H100 80GB HBM3, 00000000:18:00.0\n")
	w := NewWriter(&buf, "capture cuda")
	w.Check("launches", Pass, "%d captured\nsecond line", 200)
	w.Result("p50 latency", 312.5, "us")
	w.Result("calls", 7, "")
	w.Result("engines", "graphics,copy0", "")
	w.WithPrefix("ptds.").Check("launches", Fail, "missed %d", 3)
	w.Note("the trace said: %s", "x | y")
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("SECTION capture_cuda DONE 35\nRUN capture_cuda $BUNDLE/arbiter trace --pid 42\nATTACH capture_cuda text capture-cuda/trace.log the trace's log\n")
	res, err := Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Malformed) > 0 {
		t.Fatalf("malformed: %q", res.Malformed)
	}
	if res.MetaValue("gpu.0") != "NVIDIA H100 80GB HBM3, 00000000:18:00.0" || res.MetaValue("absent") != "" {
		t.Errorf("meta: %+v", res.Meta)
	}
	s := res.Section("capture_cuda")
	if s == nil || len(res.Sections) != 1 {
		t.Fatalf("sections: %+v", res.Sections)
	}
	if c, ok := s.Check("launches"); !ok || c.Status != Pass || c.Seen != "200 captured / second line" {
		t.Errorf("check: %+v", c)
	}
	if c, ok := s.Check("ptds.launches"); !ok || c.Status != Fail || c.Seen != "missed 3" {
		t.Errorf("prefixed check: %+v", c)
	}
	if v, ok := s.Value("p50_latency"); !ok || !v.IsNum || v.Num != 312.5 || v.Unit != "us" {
		t.Errorf("value: %+v", v)
	}
	if v, _ := s.Value("calls"); v.Unit != "" || v.Num != 7 {
		t.Errorf("unitless value: %+v", v)
	}
	if v, _ := s.Value("engines"); v.IsNum || v.Text != "graphics,copy0" {
		t.Errorf("text value: %+v", v)
	}
	if s.End != Done || s.Seconds != 35 || len(s.Runs) != 1 || len(s.Notes) != 1 || s.Notes[0] != "the trace said: x | y" {
		t.Errorf("section: %+v", s)
	}
	if len(s.Attachments) != 1 || s.Attachments[0] != (Attachment{"text", "capture-cuda/trace.log", "the trace's log"}) {
		t.Errorf("attachments: %+v", s.Attachments)
	}
	if s.Verdict() != Fail {
		t.Errorf("verdict %s, want FAIL (a check failed)", s.Verdict())
	}
}

// TestParseMalformed checks that lines the parser cannot read are kept,
// numbered, and do not stop it.
func TestParseMalformed(t *testing.T) {
	in := strings.Join([]string{
		"# a comment",
		"",
		"CHECK s a PASS fine",
		"CHECK s b MAYBE what",
		"RESULT s",
		"SECTION s DONE soon",
		"SECTION s FINISHED 3",
		"ATTACH s html x.html x",
		"ATTACH s text /etc/passwd x",
		"ATTACH s text ../x x",
		"BOGUS line",
		"META",
		"RUN s",
		"CHECK s c INFO",
	}, "\n")
	res, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Malformed) != 10 {
		t.Errorf("%d malformed lines, want 10:\n%s", len(res.Malformed), strings.Join(res.Malformed, "\n"))
	}
	if !strings.HasPrefix(res.Malformed[0], "line 4: CHECK s b MAYBE what") {
		t.Errorf("first malformed: %q", res.Malformed[0])
	}
	s := res.Section("s")
	if len(s.Checks) != 2 || s.Checks[1].Seen != "" {
		t.Errorf("checks: %+v", s.Checks)
	}
}

// TestVerdict checks how a section is summed up.
func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		end    Status
		checks []Status
		want   Status
	}{
		{Done, []Status{Pass, Info}, Pass},
		{Done, []Status{Pass, Fail, Skip}, Fail},
		{Done, []Status{Info, Skip}, Info},
		{Done, nil, Info},
		{Skip, nil, Skip},
		{Timeout, []Status{Pass}, Timeout},
		{Error, []Status{Pass}, Error},
		{"", []Status{Pass}, Error}, // never said it ended
		{"", []Status{Fail}, Fail},
	} {
		s := &Section{End: tc.end}
		for _, c := range tc.checks {
			s.Checks = append(s.Checks, Check{Status: c})
		}
		if got := s.Verdict(); got != tc.want {
			t.Errorf("end %q checks %v: %s, want %s", tc.end, tc.checks, got, tc.want)
		}
	}
}

// FuzzParse checks that no input makes Parse fail or panic, and that every
// line is either read or reported.
func FuzzParse(f *testing.F) {
	f.Add("CHECK s a PASS seen\nRESULT s v 1.5 us\nSECTION s DONE 3 why\n")
	f.Add("META k v\nATTACH s markdown a/b.md title\nNOTE s x\nRUN s y\n")
	f.Add("SECTION s\x00 TIMEOUT -1\n")
	f.Fuzz(func(t *testing.T, in string) {
		res, err := Parse(strings.NewReader(in))
		if err != nil {
			return // a line over the scanner's limit
		}
		var md bytes.Buffer
		if err := Render(&md, res, nil); err != nil {
			t.Fatal(err)
		}
	})
}
