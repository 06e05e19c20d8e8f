package preflight

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestSchemaIsTheDocsCopy keeps docs/doctor.schema.json the same file as
// the schema doctor embeds and prints.
func TestSchemaIsTheDocsCopy(t *testing.T) {
	docs, err := os.ReadFile("../../docs/doctor.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(docs, Schema()) {
		t.Error("docs/doctor.schema.json differs from internal/preflight/doctor.schema.json: copy the latter over the former")
	}
}

// TestSchemaNamesWhatDoctorReports keeps the schema's lists in step with
// the code: every check in the order they run, every level weakest first,
// and the format version.
func TestSchemaNamesWhatDoctorReports(t *testing.T) {
	var s struct {
		Properties struct {
			FormatVersion struct {
				Const int `json:"const"`
			} `json:"format_version"`
			Levels struct {
				PrefixItems []struct {
					Properties struct {
						Level struct {
							Const Level `json:"const"`
						} `json:"level"`
					} `json:"properties"`
				} `json:"prefixItems"`
			} `json:"levels"`
		} `json:"properties"`
		Defs struct {
			CheckName struct {
				Enum []string `json:"enum"`
			} `json:"checkName"`
			Level struct {
				Enum []Level `json:"enum"`
			} `json:"level"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(Schema(), &s); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range checkers() {
		names = append(names, c.name)
	}
	if !slices.Equal(s.Defs.CheckName.Enum, names) {
		t.Errorf("the schema's check names %v\nthe checks doctor makes %v", s.Defs.CheckName.Enum, names)
	}
	if !slices.Equal(s.Defs.Level.Enum, Levels()) {
		t.Errorf("the schema's levels %v, want %v", s.Defs.Level.Enum, Levels())
	}
	var ordered []Level
	for _, p := range s.Properties.Levels.PrefixItems {
		ordered = append(ordered, p.Properties.Level.Const)
	}
	if !slices.Equal(ordered, Levels()) {
		t.Errorf("the schema's level order %v, want %v", ordered, Levels())
	}
	if s.Properties.FormatVersion.Const != FormatVersion {
		t.Errorf("the schema's format_version %d, want %d", s.Properties.FormatVersion.Const, FormatVersion)
	}
}

// TestDocument checks the document of a report: the format version, the
// checks and levels as they are, and ready from the observe level.
func TestDocument(t *testing.T) {
	checks := []Check{
		{Name: "bpf-permission", Status: Fail, Detail: "d", Fix: "f", NeededBy: allLevels},
		{Name: "nvml", Status: Warn, Detail: "d", Fix: "f", NeededBy: []Level{}},
	}
	r := &Report{Checks: checks, Levels: levelSupport(checks)}
	d := r.Document()
	if d.FormatVersion != FormatVersion || d.Ready || r.Ready() || len(d.Checks) != 2 || len(d.Levels) != 4 {
		t.Errorf("%+v", d)
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(`{"format_version":1,"checks":[`)) || !bytes.Contains(b, []byte(`"name":"nvml","status":"WARN","detail":"d","fix":"f","needed_by":[]}`)) ||
		!bytes.HasSuffix(b, []byte(`,"ready":false}`)) {
		t.Errorf("%s", b)
	}
	r.Levels[0] = LevelSupport{Level: Observe, Supported: true}
	if !r.Ready() || !r.Document().Ready {
		t.Error("ready with observe supported: false")
	}
}
