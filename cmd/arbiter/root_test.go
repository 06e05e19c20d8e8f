package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeCommands holds the README's command table to the binary: a
// command it lists either exists or says plainly that it is not in this
// build yet.
func TestReadmeCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, c := range newRootCmd("test").Commands() {
		have[c.Name()] = true
	}
	row := regexp.MustCompile("(?m)^\\| `arbiter ([a-z]+)` \\| (.*) \\|$")
	rows := row.FindAllStringSubmatch(string(readme), -1)
	if len(rows) < 5 {
		t.Fatalf("found %d command rows in README.md: has the table moved?", len(rows))
	}
	for _, r := range rows {
		name, what := r[1], r[2]
		absent := strings.HasPrefix(what, "**not in this build yet**")
		switch {
		case !have[name] && !absent:
			t.Errorf("README lists `arbiter %s` as if it existed; this build has no such command: say \"**not in this build yet**\"", name)
		case have[name] && absent:
			t.Errorf("README says `arbiter %s` is not in this build, but it is", name)
		}
	}
}
