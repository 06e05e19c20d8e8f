package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gpu-arbiter/arbiter/internal/preflight"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// doctorSchemaURL is the $id of doctor's schema.
const doctorSchemaURL = "https://arbiter.io/schema/v1/doctor.json"

// doctorSchema compiles the schema doctor prints (docs/doctor.schema.json)
// with a full JSON Schema validator, which first checks it against the
// draft 2020-12 meta-schema.
func doctorSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(preflight.Schema()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(doctorSchemaURL, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(doctorSchemaURL)
	if err != nil {
		t.Fatalf("compile doctor's schema: %v", err)
	}
	if sch.DraftVersion != 2020 {
		t.Fatalf("doctor's schema is draft %d, want 2020-12", sch.DraftVersion)
	}
	return sch
}

// validDoctorJSON checks doctor's JSON output against its schema and
// returns it decoded, refusing fields the document type lacks.
func validDoctorJSON(t *testing.T, sch *jsonschema.Schema, out string) preflight.Document {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("doctor's JSON does not fit its schema: %v\n%s", err, out)
	}
	var doc preflight.Document
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return doc
}

// docCheck returns the check named name of a document.
func docCheck(t *testing.T, doc preflight.Document, name string) preflight.Check {
	t.Helper()
	i := slices.IndexFunc(doc.Checks, func(c preflight.Check) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no check %s in %+v", name, doc.Checks)
	}
	return doc.Checks[i]
}

// TestDoctorJSONOnThisNode runs doctor on this machine as the CLI does,
// with --format json, validates what it prints against the schema, and
// checks what a node without a GPU, an NVIDIA driver or NVML must show:
// the driver check fails with its fix, NVML is not available, and of the
// levels observe and the gate are supported while timeslice and suspend
// are refused for the driver. Where a driver is loaded, an empty --root
// stands for such a node.
func TestDoctorJSONOnThisNode(t *testing.T) {
	sch := doctorSchema(t)
	args := []string{"--format", "json"}
	_, err := os.Stat("/proc/driver/nvidia/version")
	driverHere := err == nil
	if driverHere {
		t.Log("an NVIDIA driver is loaded here: an empty --root stands for a node without one")
		args = append(args, "--root", t.TempDir())
	}
	code, out, errOut := doctorRun(t, nil, args...)
	doc := validDoctorJSON(t, sch, out)
	if doc.FormatVersion != preflight.FormatVersion || doc.Ready != (code == 0) {
		t.Errorf("format_version %d, ready %v, exit %d\n%s", doc.FormatVersion, doc.Ready, code, errOut)
	}
	var names []string
	for _, c := range doc.Checks {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, doctorChecks) {
		t.Errorf("checks %v\nwant %v", names, doctorChecks)
	}
	if c := docCheck(t, doc, "nvidia-driver"); c.Status != preflight.Fail || !strings.HasPrefix(c.Detail, "no NVIDIA driver loaded: neither ") ||
		!strings.HasPrefix(c.Fix, "install the NVIDIA driver and load its kernel module") {
		t.Errorf("nvidia-driver: %+v", c)
	}
	c := docCheck(t, doc, "nvml")
	switch {
	case c.Status != preflight.Warn || len(c.NeededBy) != 0:
		t.Errorf("nvml: %+v; want WARN, needed by no level", c)
	case driverHere && !strings.Contains(c.Detail, "libnvidia-ml.so.1 not found under "):
		t.Errorf("nvml under an empty root: %+v", c)
	case !driverHere && (!strings.HasPrefix(c.Detail, "NVML is not available: ") || !strings.Contains(c.Fix, "arbiter runs with the GPUs it learns from the driver trace")):
		t.Errorf("nvml: %+v; want NVML not available, and the fallback in the fix", c)
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root: the levels' BPF and capability checks pass only as root")
	}
	for _, l := range doc.Levels {
		switch l.Level {
		case preflight.Observe, preflight.Gate:
			if !l.Supported {
				t.Errorf("%s: %+v, want supported", l.Level, l)
			}
		case preflight.Timeslice, preflight.Suspend:
			if l.Supported || !slices.Contains(l.BlockedBy, "nvidia-driver") {
				t.Errorf("%s: %+v, want refused for nvidia-driver", l.Level, l)
			}
		}
	}
	if !doc.Ready || code != 0 {
		t.Errorf("ready %v, exit %d as root\n%s", doc.Ready, code, errOut)
	}
}

// TestDoctorSchemaRejects checks that the schema refuses what doctor must
// never print, starting each time from a document it accepts.
func TestDoctorSchemaRejects(t *testing.T) {
	sch := doctorSchema(t)
	base := func() map[string]any {
		var checks []preflight.Check
		for _, name := range doctorChecks {
			checks = append(checks, preflight.Check{Name: name, Status: preflight.OK, Detail: "fine", NeededBy: preflight.Levels()})
		}
		checks[1] = preflight.Check{Name: "btf", Status: preflight.Warn, Detail: "odd", Fix: "look", NeededBy: []preflight.Level{}}
		var levels []preflight.LevelSupport
		for _, l := range preflight.Levels() {
			levels = append(levels, preflight.LevelSupport{Level: l, Supported: true, Warnings: []string{"btf"}})
		}
		levels[2] = preflight.LevelSupport{Level: preflight.Suspend, BlockedBy: []string{"nvidia-driver"}}
		b, err := json.Marshal(preflight.Document{FormatVersion: preflight.FormatVersion, Checks: checks, Levels: levels, Ready: true})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	valid := func(m map[string]any) error {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return sch.Validate(inst)
	}
	if err := valid(base()); err != nil {
		t.Fatalf("the base document: %v", err)
	}
	check := func(m map[string]any, i int) map[string]any { return m["checks"].([]any)[i].(map[string]any) }
	level := func(m map[string]any, i int) map[string]any { return m["levels"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name   string
		mutate func(map[string]any)
		at     string // where the validator must find the fault
	}{
		{"format_version 2", func(m map[string]any) { m["format_version"] = 2 }, "/format_version"},
		{"no format_version", func(m map[string]any) { delete(m, "format_version") }, ""},
		{"an unknown field", func(m map[string]any) { m["node"] = "gpu-1" }, ""},
		{"no checks", func(m map[string]any) { m["checks"] = []any{} }, "/checks"},
		{"an unknown status", func(m map[string]any) { check(m, 0)["status"] = "PASS" }, "/checks/0/status"},
		{"an unknown check", func(m map[string]any) { check(m, 0)["name"] = "gpu-count" }, "/checks/0/name"},
		{"an empty detail", func(m map[string]any) { check(m, 0)["detail"] = "" }, "/checks/0/detail"},
		{"OK with a fix", func(m map[string]any) { check(m, 0)["fix"] = "nothing to do" }, "/checks/0"},
		{"WARN without a fix", func(m map[string]any) { delete(check(m, 1), "fix") }, "/checks/1"},
		{"FAIL without a fix", func(m map[string]any) { check(m, 0)["status"] = "FAIL" }, "/checks/0"},
		{"needed_by null", func(m map[string]any) { check(m, 1)["needed_by"] = nil }, "/checks/1/needed_by"},
		{"needed_by an unknown level", func(m map[string]any) { check(m, 0)["needed_by"] = []any{"preempt"} }, "/checks/0/needed_by/0"},
		{"levels out of order", func(m map[string]any) {
			ls := m["levels"].([]any)
			ls[1], ls[2] = ls[2], ls[1]
		}, "/levels/1/level"},
		{"a fifth level", func(m map[string]any) {
			m["levels"] = append(m["levels"].([]any), map[string]any{"level": "gate", "supported": true})
		}, "/levels/4"},
		{"three levels", func(m map[string]any) { m["levels"] = m["levels"].([]any)[:3] }, "/levels"},
		{"refused without blocked_by", func(m map[string]any) { delete(level(m, 2), "blocked_by") }, "/levels/2"},
		{"supported with blocked_by", func(m map[string]any) { level(m, 1)["blocked_by"] = []any{"nvidia-driver"} }, "/levels/1"},
		{"blocked_by an unknown check", func(m map[string]any) { level(m, 2)["blocked_by"] = []any{"driver"} }, "/levels/2/blocked_by/0"},
		{"empty warnings", func(m map[string]any) { level(m, 0)["warnings"] = []any{} }, "/levels/0/warnings"},
		{"ready while observe is refused", func(m map[string]any) {
			level(m, 0)["supported"] = false
			level(m, 0)["blocked_by"] = []any{"bpf-permission"}
		}, "/levels/0/supported"},
		{"not ready while observe is supported", func(m map[string]any) { m["ready"] = false }, "/levels/0/supported"},
	} {
		m := base()
		tc.mutate(m)
		if err := valid(m); err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if !strings.Contains(err.Error(), "- at '"+tc.at+"'") {
			t.Errorf("%s: refused, but not at %s: %v", tc.name, tc.at, err)
		}
	}
}

// TestDoctorPrintsSchema checks that --schema prints the schema, the same
// file as docs/doctor.schema.json, and checks nothing.
func TestDoctorPrintsSchema(t *testing.T) {
	code, out, errOut := doctorRun(t, nil, "--schema")
	if code != 0 || out != string(preflight.Schema()) || errOut != "" {
		t.Errorf("exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	docs, err := os.ReadFile("../../docs/doctor.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(docs) {
		t.Error("--schema prints another schema than docs/doctor.schema.json")
	}
}

// TestDoctorDocsExampleFitsTheSchema keeps the JSON example in
// docs/install.md a document doctor could print.
func TestDoctorDocsExampleFitsTheSchema(t *testing.T) {
	b, err := os.ReadFile("../../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Check the node\n")
	_, rest, ok2 := strings.Cut(rest, "\n```json\n")
	example, _, ok3 := strings.Cut(rest, "\n```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("no JSON example under \"## Check the node\" in docs/install.md")
	}
	if doc := validDoctorJSON(t, doctorSchema(t), example); doc.FormatVersion != preflight.FormatVersion {
		t.Errorf("the example's format_version is %d, want %d", doc.FormatVersion, preflight.FormatVersion)
	}
}
