package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

var (
	fencePattern    = regexp.MustCompile("(?ms)^```(\\w*)\\n(.*?)^```")
	linkPattern     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	repoPathPattern = regexp.MustCompile("`((?:cmd|docs|examples|policy|rego|scripts)/[^`\\s]*)`")
)

// TestPolicyDocs holds docs/policy.md to the repository: every file it
// links or names exists, every `arbiter policy` command it shows runs and
// succeeds (./policy standing for a directory holding the guide's own
// minimal policy and test), every input file it names is shipped, and
// the input documents it shows are the ones examples/policy ships.
func TestPolicyDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	fences := fencePattern.FindAllStringSubmatch(doc, -1)
	prose := fencePattern.ReplaceAllString(doc, "")

	for _, m := range linkPattern.FindAllStringSubmatch(prose, -1) {
		target, _, _ := strings.Cut(m[1], "#")
		if target == "" || strings.Contains(target, "://") {
			continue
		}
		if _, err := os.Stat(filepath.Join(repoRoot, "docs", target)); err != nil {
			t.Errorf("docs/policy.md links %s, which the repository does not have", m[1])
		}
	}
	for _, m := range repoPathPattern.FindAllStringSubmatch(prose, -1) {
		if matches, _ := filepath.Glob(filepath.Join(repoRoot, m[1])); len(matches) == 0 {
			t.Errorf("docs/policy.md names %s, which the repository does not have", m[1])
		}
	}

	var policyFiles = map[string]string{}
	var commands []string
	var jsonBlocks []string
	for _, f := range fences {
		switch lang, body := f[1], f[2]; {
		case lang == "rego" && strings.HasPrefix(body, "package arbiter\n") && strings.Contains(body, "classify :="):
			policyFiles["p.rego"] = body
		case lang == "rego" && strings.HasPrefix(body, "package arbiter_test\n"):
			policyFiles["p_test.rego"] = body
		case lang == "json":
			jsonBlocks = append(jsonBlocks, body)
		case lang == "console":
			for line := range strings.SplitSeq(body, "\n") {
				if cmd, ok := strings.CutPrefix(line, "$ "); ok {
					cmd, _, _ = strings.Cut(cmd, " #")
					commands = append(commands, cmd)
				}
			}
		}
	}
	if len(policyFiles) != 2 || len(commands) < 8 {
		t.Fatalf("found the minimal policy and its test %v, and %d commands: the guide's layout changed, update this test", policyFiles, len(commands))
	}
	userPolicy := policyDir(t, policyFiles)

	for _, cmd := range commands {
		fields := strings.Fields(cmd)
		var args []string
		for i, a := range fields[1:] {
			if i > 0 && (fields[i] == "--input" || fields[i] == "-i") {
				if _, err := os.Stat(filepath.Join(repoRoot, a)); err != nil {
					t.Errorf("docs/policy.md: %s: input %s is not in the repository: ship it (examples/policy/) or name one that is", cmd, a)
				}
			}
			args = append(args, docArg(t, a, userPolicy)...)
		}
		switch fields[0] {
		case "arbiter":
			if len(args) == 0 || args[0] != "policy" {
				continue
			}
			if out, code := runPolicy(t, "", args[1:]...); code != 0 {
				t.Errorf("docs/policy.md: %s: exit %d\n%.3000s", cmd, code, out)
			}
		default: // another tool: the repository's paths it names must exist
			for _, a := range fields[1:] {
				if !strings.Contains(a, "/") || a == "./policy" {
					continue
				}
				if matches, _ := filepath.Glob(filepath.Join(repoRoot, a)); len(matches) == 0 {
					t.Errorf("docs/policy.md: %s: %s is not in the repository", cmd, a)
				}
			}
		}
	}

	// The input documents shown are the ones shipped.
	var process, state map[string]any
	readJSON(t, filepath.Join(repoRoot, "examples/policy/process.json"), &process)
	readJSON(t, filepath.Join(repoRoot, "examples/policy/state.json"), &state)
	var shownInput, shownState map[string]any
	for _, j := range jsonBlocks {
		switch {
		case strings.Contains(j, `"apiVersion"`) && strings.Contains(j, `"process"`):
			if err := json.Unmarshal([]byte(j), &shownInput); err != nil {
				t.Fatalf("the input shown: %v", err)
			}
		case strings.HasPrefix(j, `"state":`):
			if err := json.Unmarshal([]byte("{"+j+"}"), &shownState); err != nil {
				t.Fatalf("the state shown: %v", err)
			}
		}
	}
	if !reflect.DeepEqual(shownInput, process) {
		t.Errorf("the input shown in docs/policy.md differs from examples/policy/process.json")
	}
	if shownState == nil || !reflect.DeepEqual(shownState["state"], state["state"]) || !reflect.DeepEqual(state["node"], process["node"]) {
		t.Errorf("the state shown in docs/policy.md differs from examples/policy/state.json's, or its node from process.json's")
	}
}

// docArg maps an argument of a command in the guide to this test's
// directory: ./policy is the guide's own policy, a path in the repository
// (or a pattern matching some) is found from here.
func docArg(t *testing.T, a, userPolicy string) []string {
	t.Helper()
	if a == "./policy" {
		return []string{userPolicy}
	}
	if !strings.Contains(a, "/") {
		return []string{a} // a flag, its value, a subcommand
	}
	matches, _ := filepath.Glob(filepath.Join(repoRoot, a))
	if len(matches) == 0 {
		t.Errorf("docs/policy.md names %s, which the repository does not have", a)
		return []string{a}
	}
	return matches
}

// TestExampleInputsEvaluate evaluates every input in examples/policy on
// the default policy and on every example policy: each must give a
// decision the engine would apply.
func TestExampleInputsEvaluate(t *testing.T) {
	inputs, _ := filepath.Glob(filepath.Join(repoRoot, "examples/policy/*.json"))
	policies, _ := filepath.Glob(filepath.Join(repoRoot, "rego/examples/*"))
	policies = append(policies, filepath.Join(repoRoot, "rego/default"))
	if len(inputs) < 2 || len(policies) < 2 {
		t.Fatalf("inputs %v, policies %v", inputs, policies)
	}
	for _, in := range inputs {
		for _, p := range policies {
			if out, code := runPolicy(t, "", "eval", p, "--input", in); code != 0 || !strings.Contains(out, `"defined": true`) {
				t.Errorf("%s on %s: exit %d\n%.2000s", in, p, code, out)
			}
		}
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
