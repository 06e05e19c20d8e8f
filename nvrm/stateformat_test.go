package nvrm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
)

// The golden files in testdata/state-v1 are what the last build writing
// format version 1 saved for one process (pid v1PID, started at v1Start)
// with the stand-in's compute channel group (descriptor v1FD) suspended.
const (
	v1PID   = 424242
	v1Start = 515151
	v1FD    = 61
)

// copyV1 copies the version 1 files into a new state directory and returns
// the state file's path.
func copyV1(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"state.json", "suspended.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/state-v1", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "state.json")
}

func v1Options(state, boot string) *RegistryOptions {
	return &RegistryOptions{StatePath: state, BootID: boot, StartTime: func(pid uint32) uint64 {
		if pid == v1PID {
			return v1Start
		}
		return 0
	}}
}

// TestStateVersion1 reads the files of format version 1: the tree and the
// suspension record as they were, saved again as the current version with
// the boot id, which a later boot then drops.
func TestStateVersion1(t *testing.T) {
	state := copyV1(t)
	r, err := NewRegistry(v1Options(state, "boot-a"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(r *Registry, what string) {
		t.Helper()
		g, err := r.Groups(v1PID, 0)
		sus := r.Suspended()
		if err != nil || len(g) != 1 || g[0].Handle != rmstandin.GroupGR || g[0].FD != v1FD || len(r.Refused()) != 0 ||
			len(sus) != 1 || sus[0].PID != v1PID || sus[0].StartTime != v1Start || sus[0].Group.Handle != rmstandin.GroupGR ||
			sus[0].Method != SuspendSchedule {
			t.Fatalf("%s: groups %+v (%v), suspended %+v, refused %v", what, g, err, sus, r.Refused())
		}
	}
	check(r, "version 1")
	if err := r.Save(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	for _, name := range []string{"state.json", "suspended.json"} {
		var h fileHead
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(state), name))
		if err := json.Unmarshal(b, &h); err != nil || h.Version != stateVersion || h.BootID != "boot-a" {
			t.Errorf("%s saved as %+v (%v), want version %d of boot-a", name, h, err, stateVersion)
		}
	}
	r, err = NewRegistry(v1Options(state, "boot-a"))
	if err != nil {
		t.Fatal(err)
	}
	check(r, "saved again")
	r.Close()
	// After a reboot, pid and start time may name an unrelated process:
	// the records of another boot are dropped.
	r, err = NewRegistry(v1Options(state, "boot-b"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Len() != 0 || len(r.Suspended()) != 0 || len(r.Refused()) != 0 {
		t.Errorf("another boot: %d processes, %+v suspended, refused %v", r.Len(), r.Suspended(), r.Refused())
	}
}

// TestStateUnknownVersion: files of a version this build does not read
// (a newer arbiter's, or none) are refused, each named with its version
// and the versions read, without failing the registry; the tree is not
// used, but every suspension record that decodes is kept to be resumed.
func TestStateUnknownVersion(t *testing.T) {
	for _, v := range []int{0, stateVersion + 1} {
		state := copyV1(t)
		dir := filepath.Dir(state)
		rewrite := func(name string, edit func(map[string]any)) {
			p := filepath.Join(dir, name)
			b, _ := os.ReadFile(p)
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			edit(m)
			b, _ = json.Marshal(m)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		setVersion := func(m map[string]any) {
			if v == 0 {
				delete(m, "version")
			} else {
				m["version"] = v
				m["written_by"] = "a later arbiter" // a field this build does not know
			}
		}
		rewrite("state.json", setVersion)
		rewrite("suspended.json", func(m map[string]any) {
			setVersion(m)
			recs := m["suspended"].([]any)
			// A method this build does not know, and a record that does
			// not decode.
			recs[0].(map[string]any)["method"] = "a later method"
			m["suspended"] = append(recs, map[string]any{"pid": "not a number"})
		})
		r, err := NewRegistry(v1Options(state, ""))
		if err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		if r.Len() != 0 {
			t.Errorf("version %d: the tree was used: %+v", v, r.Processes())
		}
		if sus := r.Suspended(); len(sus) != 1 || sus[0].PID != v1PID || sus[0].Group.Handle != rmstandin.GroupGR || sus[0].Group.FD != v1FD ||
			sus[0].Method != SuspendSchedule {
			t.Errorf("version %d: suspended %+v, want the record kept", v, sus)
		}
		refused := r.Refused()
		if len(refused) != 2 {
			t.Fatalf("version %d: refused %v, want both files", v, refused)
		}
		for i, name := range []string{"state.json", "suspended.json"} {
			msg := refused[i].Error()
			for _, want := range []string{filepath.Join(dir, name), "format version " + itoa(v), "reads versions 1 and 2"} {
				if !strings.Contains(msg, want) {
					t.Errorf("version %d: %q does not say %q", v, msg, want)
				}
			}
		}
		if !strings.Contains(refused[1].Error(), "1 suspension record(s) were read") || !strings.Contains(refused[1].Error(), "1 could not be read") {
			t.Errorf("version %d: %v", v, refused[1])
		}
		r.Close()
	}
}

func itoa(v int) string { b, _ := json.Marshal(v); return string(b) }

// TestSalvageRecord: a record of an unknown version with a method this
// build does not know is resumed as its fields allow; one without a
// process or group handles is not a record.
func TestSalvageRecord(t *testing.T) {
	cases := []struct {
		raw    string
		ok     bool
		method SuspendMethod
	}{
		{`{"pid":7,"start_time":9,"group":{"Client":1,"Handle":2},"method":"schedule"}`, true, SuspendSchedule},
		{`{"pid":7,"start_time":9,"group":{"Client":1,"Handle":2},"method":"a later one"}`, true, SuspendSchedule},
		{`{"pid":7,"start_time":9,"group":{"Client":1,"Handle":2},"method":"a later one","subdevice":5}`, true, SuspendDisableChannels},
		{`{"pid":7,"group":{"Client":1}}`, false, 0},
		{`{"pid":"x"}`, false, 0},
	}
	for _, tc := range cases {
		s, ok := salvageRecord(json.RawMessage(tc.raw))
		if ok != tc.ok || (ok && (s.Method != tc.method || s.PID != 7 || s.StartTime != 9 || s.Group.Handle != 2)) {
			t.Errorf("salvageRecord(%s) = %+v, %v; want ok %v, method %v", tc.raw, s, ok, tc.ok, tc.method)
		}
	}
}
