package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/schema"
	"github.com/gpu-arbiter/arbiter/rego"
)

// policyExit is an error that sets the exit status: 1 when a policy is
// broken or its tests fail, 2 when eval's input document is wrong (a
// command used wrongly is a usageError).
type policyExit struct {
	code int
	err  error
}

func (e *policyExit) Error() string { return e.err.Error() }
func (e *policyExit) Unwrap() error { return e.err }
func (e *policyExit) ExitCode() int { return e.code }

// newPolicyCmd builds `arbiter policy`: check, test, eval, schema and lib.
func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Check, test and evaluate Rego policies",
		Long: `Work with Arbiter's Rego policies. A policy is a directory (or an OPA
bundle, .tar.gz) with package arbiter defining classify and default_decision
(and optionally victims), _test.rego files, and optional data.json/data.yaml.
The helper library (package arbiter.lib) is added unless the policy has its
own. See docs/policy.md.`,
	}
	cmd.AddCommand(newPolicyCheckCmd(), newPolicyTestCmd(), newPolicyEvalCmd(), newPolicySchemaCmd(), newPolicyLibCmd())
	return cmd
}

func policyFormatFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVar(format, "format", "text", "output format: text or json (human is text's older name)")
}

func policyEvaluatorFlag(cmd *cobra.Command, ev *string) {
	cmd.Flags().StringVar(ev, "evaluator", "auto", "how to evaluate: auto (the compiled plan when the policy can be planned), plan or topdown")
}

// policyOptions are the load options the evaluator flag asks for.
func policyOptions(ev string, o *policy.Options) (*policy.Options, error) {
	e, err := policy.ParseEvaluator(ev)
	if err != nil {
		return nil, usageErrorf("--evaluator: %w", err)
	}
	if o == nil {
		o = &policy.Options{}
	}
	o.Evaluator = e
	return o, nil
}

// policyEvaluator describes how a loaded policy is evaluated.
func policyEvaluator(p *policy.Policy) (name, note string) {
	e, why := p.Evaluator()
	if why != nil {
		note = why.Error()
	}
	return string(e), note
}

func policyCheckFormat(format string) error {
	if format != "text" && format != "human" && format != "json" {
		return usageErrorf("--format %q: want text or json", format)
	}
	return nil
}

func policyWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newPolicyCheckCmd is `arbiter policy check`, like `opa check --strict`
// plus Arbiter's entry-point and schema checks. Each argument is one
// policy, checked as the daemon would load it: a directory is ONE policy
// with all its subdirectories, so a directory holding several policies is
// an error that names them, and they are checked by naming each.
func newPolicyCheckCmd() *cobra.Command {
	var format, evaluator string
	cmd := &cobra.Command{
		Use:   "check DIR|BUNDLE...",
		Short: "Load and check policies: syntax, strict compile, input schema, decisions",
		Long: `Load and check each policy named, as the daemon would load it: syntax,
strict compilation, input references against the input schema, entry points,
literal decisions against the decision schema, and the default decision.

A directory is ONE policy, read with all its subdirectories (data files and
helper modules may sit anywhere below it). To check several policies, name
each one: arbiter policy check rego/default rego/examples/*. With --format
json, one policy gives one object and several give an array of them.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := policyCheckFormat(format); err != nil {
				return err
			}
			opts, err := policyOptions(evaluator, nil)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var results []policyCheckResult
			var failed []string
			for _, path := range args {
				res := policyCheck(cmd.Context(), path, opts)
				if !res.OK {
					failed = append(failed, fmt.Sprintf("%s has %s", path, counted(len(res.Errors), "error", "errors")))
				}
				if format == "json" {
					results = append(results, res)
					continue
				}
				if err := res.writeHuman(out); err != nil {
					return err
				}
			}
			if format == "json" {
				var doc any = results
				if len(results) == 1 {
					doc = results[0]
				}
				if err := policyWriteJSON(out, doc); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return &policyExit{1, fmt.Errorf("policy %s", strings.Join(failed, "; policy "))}
			}
			return nil
		},
	}
	policyFormatFlag(cmd, &format)
	policyEvaluatorFlag(cmd, &evaluator)
	return cmd
}

// policyCheckResult is what `arbiter policy check` says about one policy;
// its JSON is the --format json output.
type policyCheckResult struct {
	Path          string              `json:"path"`
	OK            bool                `json:"ok"`
	Revision      string              `json:"revision,omitempty"`
	Files         []string            `json:"files,omitempty"`   // the policy's own Rego files
	Library       string              `json:"library,omitempty"` // where arbiter.lib comes from: embedded, own or none
	Default       *policy.Decision    `json:"default_decision,omitempty"`
	Victims       bool                `json:"victims,omitempty"`
	Evaluator     string              `json:"evaluator,omitempty"`
	EvaluatorNote string              `json:"evaluator_note,omitempty"`
	Errors        []policy.Diagnostic `json:"errors,omitempty"`
}

// policyCheck loads and checks the policy at path.
func policyCheck(ctx context.Context, path string, opts *policy.Options) policyCheckResult {
	p, err := policy.Load(ctx, path, opts)
	res := policyCheckResult{Path: path, OK: err == nil, Errors: policy.Diagnostics(err)}
	if p != nil {
		d := p.Default()
		res.Revision, res.Default, res.Victims = p.Revision(), &d, p.HasVictims()
		res.Files, res.Library = p.Source().Files(), string(p.Source().Library)
		res.Evaluator, res.EvaluatorNote = policyEvaluator(p)
	}
	return res
}

// writeHuman prints the policy's errors, one a line, or one line saying
// what was loaded.
func (r *policyCheckResult) writeHuman(out io.Writer) error {
	if !r.OK {
		for _, d := range r.Errors {
			if _, err := fmt.Fprintln(out, d); err != nil {
				return err
			}
		}
		return nil
	}
	victims := "no victims rule"
	if r.Victims {
		victims = "victims rule"
	}
	evaluated := "evaluated by its compiled plan"
	if r.Evaluator != string(policy.EvaluatorPlan) {
		evaluated = "evaluated by topdown: " + r.EvaluatorNote
	}
	_, err := fmt.Fprintf(out, "ok: %s revision %s, %s, default class %q, %s, %s\n", r.Path, r.Revision, r.filesText(), r.Default.Class, victims, evaluated)
	return err
}

// filesText counts the policy's own files and names its library apart:
// "2 files (1 test file) + the embedded library arbiter.lib".
func (r *policyCheckResult) filesText() string {
	tests := 0
	for _, f := range r.Files {
		if strings.HasSuffix(f, "_test.rego") {
			tests++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d file", len(r.Files))
	if len(r.Files) != 1 {
		b.WriteString("s")
	}
	switch tests {
	case 0:
	case 1:
		b.WriteString(" (1 test file)")
	default:
		fmt.Fprintf(&b, " (%d test files)", tests)
	}
	switch policy.LibraryOrigin(r.Library) {
	case policy.LibraryEmbedded:
		b.WriteString(" + the embedded library arbiter.lib")
	case policy.LibraryOwn:
		b.WriteString(", with its own arbiter.lib")
	case policy.LibraryNone:
		b.WriteString(", no helper library")
	}
	return b.String()
}

// newPolicyTestCmd is `arbiter policy test`, like `opa test`.
func newPolicyTestCmd() *cobra.Command {
	var (
		format  string
		verbose bool
		run     string
	)
	cmd := &cobra.Command{
		Use:   "test DIR|BUNDLE...",
		Short: "Run a policy's Rego tests (test_* rules) and report coverage",
		Long: `Run the Rego tests (test_* rules) of each policy named and report their
outcomes and the policy's coverage. A directory is ONE policy; to test
several, name each one: arbiter policy test rego/default rego/examples/*.
With --format json, one policy gives one report and several give an array
of them, each with its path. Exit status 1 when a test of any policy fails,
a policy has none, or one does not load.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := policyCheckFormat(format); err != nil {
				return err
			}
			if _, err := regexp.Compile(run); err != nil {
				return usageErrorf("--run %q: %v", run, err)
			}
			out := cmd.OutOrStdout()
			var results []policyTestResult
			var failed []string
			for _, path := range args {
				res := policyTest(cmd.Context(), path, &policy.TestOptions{Run: run, Coverage: true, Trace: verbose})
				if why := res.failure(); why != "" {
					failed = append(failed, path+why)
				}
				if format == "json" {
					results = append(results, res)
					continue
				}
				if len(args) > 1 {
					fmt.Fprintf(out, "== %s\n", path)
				}
				if res.TestReport == nil {
					for _, d := range res.Errors {
						fmt.Fprintln(out, d)
					}
					continue
				}
				policyPrintTests(out, res.TestReport, verbose)
			}
			if format == "json" {
				var doc any = results
				if len(results) == 1 {
					// One policy keeps the shape it always had: the report,
					// or ok and the errors where it did not load.
					if r := results[0]; r.TestReport != nil {
						doc = r.TestReport
					} else {
						doc = struct {
							OK     bool                `json:"ok"`
							Errors []policy.Diagnostic `json:"errors"`
						}{false, r.Errors}
					}
				}
				if err := policyWriteJSON(out, doc); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return &policyExit{1, fmt.Errorf("policy %s", strings.Join(failed, "; policy "))}
			}
			return nil
		},
	}
	policyFormatFlag(cmd, &format)
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "list every test, print() output, and traces of failures")
	cmd.Flags().StringVarP(&run, "run", "r", "", "run only tests whose name matches this regular expression")
	return cmd
}

// policyTestResult is what `arbiter policy test` says about one policy;
// in a --format json array (several policies), each element.
type policyTestResult struct {
	Path string `json:"path"`
	OK   bool   `json:"ok"`
	// Errors are why the policy did not load (its tests did not run).
	Errors []policy.Diagnostic `json:"errors,omitempty"`
	*policy.TestReport
}

// policyTest runs the tests of the policy at path.
func policyTest(ctx context.Context, path string, opts *policy.TestOptions) policyTestResult {
	res := policyTestResult{Path: path}
	src, err := policy.Read(path, nil)
	if err == nil {
		res.TestReport, err = policy.Test(ctx, src, opts)
	}
	if err != nil {
		res.TestReport, res.Errors = nil, policy.Diagnostics(err)
		return res
	}
	res.OK = res.TestReport.OK()
	return res
}

// failure says, after the policy's path, why it failed its tests (" has 2
// errors", ": no tests ran"), "" if it passed them.
func (r policyTestResult) failure() string {
	switch rep := r.TestReport; {
	case rep == nil:
		return " has " + counted(len(r.Errors), "error", "errors")
	case rep.OK():
		return ""
	case rep.Passed+rep.Failed+rep.Errored == 0:
		return ": no tests ran"
	default:
		return fmt.Sprintf(": %d of %d tests failed", rep.Failed+rep.Errored, rep.Passed+rep.Failed+rep.Errored)
	}
}

func policyPrintTests(out io.Writer, rep *policy.TestReport, verbose bool) {
	for _, r := range rep.Results {
		if r.Outcome == "pass" && !verbose {
			continue
		}
		fmt.Fprintf(out, "%s:%d: %s.%s: %s (%v)\n", r.File, r.Row, r.Package, r.Name, strings.ToUpper(r.Outcome), r.Duration.Round(1000))
		if r.Error != "" {
			fmt.Fprintf(out, "  %s\n", r.Error)
		}
		if r.Output != "" && (verbose || r.Outcome != "pass") {
			for line := range strings.SplitSeq(strings.TrimRight(r.Output, "\n"), "\n") {
				fmt.Fprintf(out, "  print: %s\n", line)
			}
		}
		if verbose && r.Outcome != "pass" && len(r.Trace) > 0 {
			policy.Explain(out, &policy.EvalResult{Trace: r.Trace})
		}
	}
	total := rep.Passed + rep.Failed + rep.Errored + rep.Skipped
	fmt.Fprintln(out, strings.Repeat("-", 72))
	fmt.Fprintf(out, "PASS: %d/%d", rep.Passed, total)
	if rep.Failed > 0 {
		fmt.Fprintf(out, "  FAIL: %d/%d", rep.Failed, total)
	}
	if rep.Errored > 0 {
		fmt.Fprintf(out, "  ERROR: %d/%d", rep.Errored, total)
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(out, "  SKIPPED: %d/%d", rep.Skipped, total)
	}
	fmt.Fprintln(out)
	if rep.Coverage >= 0 {
		fmt.Fprintf(out, "coverage: %.1f%%\n", rep.Coverage)
		if verbose {
			for _, u := range rep.NotCovered {
				if u.Partial() {
					fmt.Fprintf(out, "  not covered: %s (the rest of row %d is)\n", u, u.Row)
					continue
				}
				fmt.Fprintf(out, "  not covered: %s\n", u)
			}
		}
	}
}

// newPolicyEvalCmd is `arbiter policy eval`.
func newPolicyEvalCmd() *cobra.Command {
	var (
		input, evaluator string
		explain          bool
	)
	cmd := &cobra.Command{
		Use:   "eval DIR|BUNDLE --input FILE",
		Short: "Evaluate a policy on an input document and print the decision",
		Long: `Evaluate classify (input with "process") or victims (input with "state")
on an input document (JSON, "-" for stdin; see arbiter policy schema input)
and print, as JSON, the value the policy returned and the decision the engine
would apply, with the reason when the policy's value was not usable, and
which evaluator ran. With --explain, print the evaluation trace with file and
row first (a trace needs topdown, so --explain always evaluates with it).`,
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return usageErrorf("name the policy (DIR or BUNDLE)")
			case len(args) > 1:
				return usageErrorf("one policy, not %d arguments: the input document goes in --input FILE (%q?)", len(args), args[1])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if input == "" {
				return usageErrorf("--input FILE is required")
			}
			r, err := policyOpenInput(cmd, input)
			if err != nil {
				return &policyExit{2, fmt.Errorf("--input: %w", err)}
			}
			defer r.Close()
			doc, err := policy.DecodeInput(r)
			if err != nil {
				name := input
				if name == "-" {
					name = "standard input"
				}
				msg := strings.TrimPrefix(err.Error(), "input: ")
				if !strings.Contains(msg, "arbiter policy schema input") {
					msg += " (arbiter policy schema input prints what it must be)"
				}
				return &policyExit{2, fmt.Errorf("--input %s: %s", name, msg)}
			}
			out := cmd.OutOrStdout()
			opts, err := policyOptions(evaluator, &policy.Options{Print: func(pr policy.Print) {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s:%d: %s\n", pr.File, pr.Row, pr.Message)
			}})
			if err != nil {
				return err
			}
			p, err := policy.Load(cmd.Context(), args[0], opts)
			if err != nil {
				for _, d := range policy.Diagnostics(err) {
					fmt.Fprintln(out, d)
				}
				return &policyExit{1, fmt.Errorf("policy %s does not load", args[0])}
			}
			res, err := p.Eval(cmd.Context(), doc, explain)
			if err != nil {
				return &policyExit{2, err}
			}
			if explain {
				policy.Explain(out, res)
				fmt.Fprintln(out)
			}
			if err := policyWriteJSON(out, res); err != nil {
				return err
			}
			if res.Error != "" {
				return &policyExit{1, errors.New(res.Error)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&input, "input", "i", "", "input document (JSON), - for stdin")
	cmd.Flags().BoolVar(&explain, "explain", false, "print the evaluation trace")
	policyEvaluatorFlag(cmd, &evaluator)
	return cmd
}

func policyOpenInput(cmd *cobra.Command, name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(cmd.InOrStdin()), nil
	}
	return os.Open(name)
}

// newPolicySchemaCmd is `arbiter policy schema`.
func newPolicySchemaCmd() *cobra.Command {
	return &cobra.Command{
		Use:       "schema [input|decision|victims]",
		Short:     "Print the JSON Schemas of the policy input and decisions",
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{schema.Input, schema.Decision, schema.Victims},
		RunE: func(cmd *cobra.Command, args []string) error {
			names := []string{schema.Input, schema.Decision, schema.Victims}
			if len(args) == 1 {
				names = args
			}
			for _, n := range names {
				b, err := schema.JSON(n)
				if err != nil {
					return usageErrorf("%w", err)
				}
				if _, err := cmd.OutOrStdout().Write(b); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// newPolicyLibCmd is `arbiter policy lib`.
func newPolicyLibCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "lib",
		Short: "Print the helper library (package arbiter.lib), for bundles built with opa build",
		Long: `Print the helper library, package arbiter.lib, that the loader adds to a
policy without its own. A bundle built with opa build must carry it, since
opa build compiles the bundle on its own and refuses calls to functions it
does not have:

  arbiter policy lib > policy/arbiter_lib.rego
  opa build -b policy --revision "$(git rev-parse --short HEAD)" --signing-key key.pem -o bundle.tar.gz

A policy that carries the library uses its own copy; keep it with the
version of arbiter the fleet runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lib := rego.Library()
			files, err := fs.Glob(lib, "*.rego")
			if err != nil {
				return err
			}
			for _, f := range files {
				if strings.HasSuffix(f, "_test.rego") {
					continue
				}
				b, err := fs.ReadFile(lib, f)
				if err != nil {
					return err
				}
				if _, err := cmd.OutOrStdout().Write(b); err != nil {
					return err
				}
			}
			return nil
		},
	}
}
