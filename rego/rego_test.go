package rego_test

import (
	"bytes"
	"strings"

	"context"
	"github.com/open-policy-agent/opa/v1/format"
	"io/fs"
	"testing"

	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/rego"
)

// TestPolicies runs every embedded policy's Rego tests through the code
// behind `arbiter policy test`, and loads it as the daemon would.
func TestPolicies(t *testing.T) {
	dirs := map[string]fs.FS{"default": rego.Default(), "lib": rego.Library()}
	for _, name := range rego.Examples() {
		f, err := rego.Example(name)
		if err != nil {
			t.Fatal(err)
		}
		dirs["examples/"+name] = f
	}
	if len(dirs) != 6 {
		t.Fatalf("%d policies embedded, want 6: %v", len(dirs), rego.Examples())
	}
	for name, f := range dirs {
		t.Run(name, func(t *testing.T) {
			src, err := policy.ReadFS(f, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := policy.Test(context.Background(), src, &policy.TestOptions{Coverage: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Outcome != "pass" {
					t.Errorf("%s:%d %s: %s %s", r.File, r.Row, r.Name, r.Outcome, r.Error)
				}
			}
			if !rep.OK() || rep.Passed < 5 {
				t.Fatalf("%d passed, %d failed, %d errors", rep.Passed, rep.Failed, rep.Errored)
			}
			if rep.Coverage < 90 {
				t.Errorf("coverage %.1f%% < 90%%, not covered: %v", rep.Coverage, rep.NotCovered)
			}
			if name == "lib" {
				return
			}
			p, err := policy.New(context.Background(), src, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d := p.Default(); d.Class != "best-effort" {
				t.Fatalf("default class %q", d.Class)
			}
		})
	}
}

// TestEveryPolicyHasTests checks that each .rego file has a _test.rego beside it.
func TestEveryPolicyHasTests(t *testing.T) {
	err := fs.WalkDir(rego.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || len(p) < 5 || p[len(p)-5:] != ".rego" || len(p) > 10 && p[len(p)-10:] == "_test.rego" {
			return err
		}
		if _, err := fs.Stat(rego.FS(), p[:len(p)-5]+"_test.rego"); err != nil {
			t.Errorf("%s has no %s_test.rego", p, p[:len(p)-5])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rego.Example("nope"); err == nil {
		t.Fatal("unknown example found")
	}
}

// TestFormatted keeps every Rego file as `opa fmt` writes it.
func TestFormatted(t *testing.T) {
	err := fs.WalkDir(rego.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".rego") {
			return err
		}
		src, err := fs.ReadFile(rego.FS(), p)
		if err != nil {
			return err
		}
		got, err := format.Source(p, src)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, src) {
			t.Errorf("%s is not formatted: run opa fmt -w rego/", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
