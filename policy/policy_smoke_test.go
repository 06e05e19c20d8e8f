package policy

import (
	"context"
	"testing"
	"io/fs"

	"github.com/gpu-arbiter/arbiter/rego"
)

func TestSmokeEmbedded(t *testing.T) {
	dirs := map[string]fs.FS{"default": rego.Default(), "lib": rego.Library()}
	for _, n := range rego.Examples() {
		f, _ := rego.Example(n)
		dirs[n] = f
	}
	for name, f := range dirs {
		src, err := ReadFS(f, name, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rep, err := Test(context.Background(), src, &TestOptions{Coverage: true})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, r := range rep.Results {
			if r.Outcome != "pass" {
				t.Errorf("%s: %s %s:%d %s %s %s", name, r.Name, r.File, r.Row, r.Outcome, r.Error, r.Output)
			}
		}
		t.Logf("%s: %d passed coverage %.1f %v", name, rep.Passed, rep.Coverage, rep.NotCovered)
		if name != "lib" {
			if _, err := New(context.Background(), src, nil); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}
