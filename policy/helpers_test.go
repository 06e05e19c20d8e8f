package policy

import (
	"io/fs"

	"encoding/json"
	"github.com/gpu-arbiter/arbiter/rego"
	"testing"
)

// equalJSON compares two values by their JSON encoding.
func equalJSON(t testing.TB, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(ja) != string(jb) {
		t.Logf("got  %s\nwant %s", ja, jb)
		return false
	}
	return true
}

func defaultPolicyFS() fs.FS { return rego.Default() }
