package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
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

// TestUsageErrors: every command given the wrong arguments, an unknown
// flag or no required flag names its usage line and fails; a command
// group refuses a command it does not have instead of printing its help
// and succeeding; asked for nothing, a group prints its help.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // the error's text; "" for success
	}{
		{[]string{"policy", "eval"}, "arbiter policy eval: name the policy (DIR or BUNDLE)\nusage: arbiter policy eval DIR|BUNDLE --input FILE [flags]"},
		{[]string{"policy", "test"}, "arbiter policy test: requires at least 1 arg(s), only received 0\nusage: arbiter policy test DIR|BUNDLE... [flags]"},
		{[]string{"policy", "check"}, "usage: arbiter policy check DIR|BUNDLE... [flags]"},
		{[]string{"trace", "x"}, "unknown command \"x\" for \"arbiter trace\"\nusage: arbiter trace [flags]"},
		{[]string{"version", "x"}, "usage: arbiter version [flags]"},
		{[]string{"sim"}, "arbiter sim: required flag(s) \"workload\" not set\nusage: arbiter sim --workload FILE"},
		{[]string{"status", "--bogus"}, "unknown flag: --bogus\nusage: arbiter status"},
		{[]string{"policy", "x"}, "arbiter policy: unknown command \"x\"\nusage: arbiter policy COMMAND"},
		{[]string{"completion", "a", "b"}, "arbiter completion: unknown command \"a\""},
		{[]string{"channels", "x"}, "arbiter channels: unknown command \"x\"\nusage: arbiter channels [flags]"},
		{[]string{"channels", "lst"}, "arbiter channels: unknown command \"lst\", did you mean list?"},
		{[]string{"policy", "chek"}, "arbiter policy: unknown command \"chek\", did you mean check?"},
		{[]string{"policy"}, ""},
	} {
		root := newRootCmd("test")
		var out, errOut strings.Builder
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(c.args)
		err := root.Execute()
		switch {
		case c.want == "" && (err != nil || !strings.Contains(out.String(), "Available Commands")):
			t.Errorf("%v: %v, output %q; want the help", c.args, err, out.String())
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v\nwant %q", c.args, err, c.want)
		}
	}
}

// TestRootErrors: main prints a command's error once prefixed with the
// program's name, names the root's usage where the root was given a flag
// or command it does not have, and ends a command used wrongly with exit
// status 2 and its usage line (1 is a command that ran and failed);
// --version prints what version does.
func TestRootErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // what main prints: errorText of the error, or the output
		code int
	}{
		{[]string{"sim"}, "arbiter sim: required flag(s) \"workload\" not set\nusage: arbiter sim --workload FILE", 2},
		{[]string{"bogus"}, "arbiter: unknown command \"bogus\" for \"arbiter\"\nusage: arbiter COMMAND (arbiter --help lists them)", 2},
		{[]string{"--bogus"}, "arbiter: unknown flag: --bogus\nusage: arbiter COMMAND (arbiter --help lists them)", 2},
		{[]string{"policy", "check"}, "arbiter policy check: requires at least 1 arg(s)", 2},
		{[]string{"policy", "bogus"}, "arbiter policy: unknown command \"bogus\"", 2},
		{[]string{"ps", "--format", "xml"}, "arbiter: --format \"xml\": want table or json\nusage: arbiter ps [flags]", 2},
		{[]string{"sim", "--workload", "x.yaml", "--duration", "-1s"}, "arbiter: --duration -1s: must not be negative\nusage: arbiter sim --workload FILE", 2},
		{[]string{"policy", "eval", "x"}, "arbiter: --input FILE is required\nusage: arbiter policy eval DIR|BUNDLE --input FILE [flags]", 2},
		{[]string{"policy", "schema", "bogus"}, "arbiter: unknown schema \"bogus\": want input, decision or victims\nusage: arbiter policy schema", 2},
		{[]string{"policy", "eval", "x", "--input", "/nonexistent.json"}, "arbiter: --input: open /nonexistent.json: no such file or directory", 2},
		{[]string{"sim", "--workload", "x.yaml", "--baselines", "nope"}, "arbiter: --baselines: unknown baseline \"nope\"", 2},
		{[]string{"channels", "suspend"}, "arbiter channels suspend: accepts 1 arg(s), received 0", 2},
		{[]string{"channels", "suspend", "x"}, "arbiter: PID \"x\": want a positive process id", 2},
		{[]string{"trace", "--comm", ""}, "arbiter: --comm: empty process name", 2},
		{[]string{"trace", "--replay", "x.arbt", "--lib", "/lib/x.so"}, "arbiter: --lib applies to live tracing, not to --replay", 2},
		{[]string{"sim", "--workload", "x.yaml", "--baselines", "arbiter"}, "arbiter: --baselines arbiter: the arbiter baseline needs a policy", 2},
		{[]string{"sim", "--workload", "/nonexistent.yaml"}, "arbiter: read workload: open /nonexistent.yaml", 1},
		{[]string{"--version"}, "arbiter test\n", 0},
	} {
		root := newRootCmd("test")
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(c.args)
		got, code := "", 0
		var lastErr error
		if cmd, err := root.ExecuteC(); err != nil {
			err = withUsage(rootError(err), cmd)
			lastErr = err
			got, code = errorText(err), 1
			var ec exitCoder
			if errors.As(err, &ec) {
				code = ec.ExitCode()
			}
		} else {
			got = out.String()
		}
		// A usage error names its usage once; eval's wrong input (exit 2
		// too) is not a usage error, and has none.
		usage := 0
		if _, ok := errors.AsType[*usageError](lastErr); ok {
			usage = 1
		}
		if !strings.HasPrefix(got, c.want) || strings.Contains(got, "arbiter: arbiter") || code != c.code || strings.Count(got, "usage: ") != usage {
			t.Errorf("%v: exit %d, %q; want exit %d, %q", c.args, code, got, c.code, c.want)
		}
	}
}

// TestJSONErrors: a command run with --format json that fails before it
// writes anything writes its error to stdout as one JSON object, with the
// exit status it ends with, and on stderr as text; one that wrote its
// JSON output and then fails writes nothing more to stdout.
func TestJSONErrors(t *testing.T) {
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		code, stdout, stderr = runArgv(t, append([]string{os.Args[0]}, args...)...)
		return stdout, stderr, code
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"ps", "--format", "json", "--socket", filepath.Join(t.TempDir(), "none.sock")}, "no arbiter daemon answers on", 1},
		{[]string{"sim", "--format", "json", "--workload", missing}, "missing.yaml: no such file or directory", 1},
		{[]string{"doctor", "--format", "json", "--root", missing}, "--root " + missing, 2},
	} {
		stdout, stderr, code := run(c.args...)
		var je jsonError
		dec := json.NewDecoder(strings.NewReader(stdout))
		if err := dec.Decode(&je); err != nil || dec.More() || code != c.code || je.ExitCode != code || !strings.Contains(je.Error, c.want) ||
			!strings.HasPrefix(stderr, "arbiter: ") || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stdout %q (%v), stderr %q; want one JSON error saying %q, exit %d", c.args, code, stdout, err, stderr, c.want, c.code)
		}
	}
	// A deprecated flag's notice goes to stderr, not ahead of the JSON;
	// a trace recorded to stdout gets no JSON error in it.
	dir := t.TempDir()
	out, stderr, _ := run("recover", "--gate-pin-dir", dir, "--state-dir", dir, "--format", "json")
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&map[string]any{}); err != nil || !strings.Contains(stderr, "deprecated") {
		t.Errorf("recover with a deprecated flag: stdout %q (%v), stderr %q", out, err, stderr)
	}
	if stdout, _, code := run("trace", "--format", "json", "--record", "-", "--replay", missing); code != 1 || stdout != "" {
		t.Errorf("trace --record - that fails: exit %d, stdout %q; want nothing on it", code, stdout)
	}
	// Its JSON written, a failed check writes no second document.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "p.rego"), []byte("package arbiter\n\nclassify := {\"class\": }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, code := run("policy", "check", "--format", "json", bad)
	var res map[string]any
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&res); err != nil || dec.More() || code != 1 || res["ok"] != false {
		t.Errorf("policy check of a bad policy: exit %d, stdout %q (%v); want its one result, not ok", code, stdout, err)
	}
}
