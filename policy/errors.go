package policy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Error codes Arbiter adds to OPA's own (rego_parse_error,
// rego_compile_error, rego_type_error, rego_unsafe_var_error,
// rego_recursion_error, ...).
const (
	CodeLoad       = "arbiter_load_error"
	CodeData       = "arbiter_data_error"
	CodeEntrypoint = "arbiter_entrypoint_error"
	CodeDecision   = "arbiter_decision_error"
	CodeTest       = "arbiter_test_failure"
)

// Diagnostic is one problem found in a policy, at a file position when
// one is known.
type Diagnostic struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	File    string `json:"file,omitempty"`
	Row     int    `json:"row,omitempty"`
	Col     int    `json:"col,omitempty"`
}

func (d Diagnostic) String() string {
	var b strings.Builder
	if d.File != "" {
		b.WriteString(d.File)
		if d.Row > 0 {
			fmt.Fprintf(&b, ":%d", d.Row)
			if d.Col > 0 {
				fmt.Fprintf(&b, ":%d", d.Col)
			}
		}
		b.WriteString(": ")
	}
	b.WriteString(d.Code)
	b.WriteString(": ")
	b.WriteString(d.Message)
	return b.String()
}

// Error is a policy that could not be loaded, checked or tested: every
// problem found, each with its location and code.
type Error struct {
	Source string
	// Revision identifies the rejected content, when it was read.
	Revision    string
	Diagnostics []Diagnostic
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		fmt.Fprintf(&b, "policy %s: ", e.Source)
	}
	if len(e.Diagnostics) == 1 {
		b.WriteString(e.Diagnostics[0].String())
		return b.String()
	}
	fmt.Fprintf(&b, "%d errors:", len(e.Diagnostics))
	for _, d := range e.Diagnostics {
		b.WriteString("\n  ")
		b.WriteString(d.String())
	}
	return b.String()
}

// Diagnostics returns the diagnostics an error carries: those of an *Error
// or of OPA's errors, else one diagnostic with the error's text.
func Diagnostics(err error) []Diagnostic { return diagnostics(err) }

func diagnostics(err error) []Diagnostic {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Diagnostics
	}
	var errs ast.Errors
	if errors.As(err, &errs) {
		out := make([]Diagnostic, 0, len(errs))
		for _, e := range errs {
			out = append(out, fromAST(e))
		}
		return out
	}
	var one *ast.Error
	if errors.As(err, &one) {
		return []Diagnostic{fromAST(one)}
	}
	return []Diagnostic{{Code: CodeLoad, Message: err.Error()}}
}

func fromAST(e *ast.Error) Diagnostic {
	d := Diagnostic{Code: e.Code, Message: e.Message}
	if e.Location != nil {
		d.File, d.Row, d.Col = e.Location.File, e.Location.Row, e.Location.Col
	}
	return d
}

// diagnose wraps err into an *Error for source.
func diagnose(source string, err error) error {
	return &Error{Source: source, Diagnostics: diagnostics(err)}
}

// DecisionError is a decision that could not be used: evaluation failed,
// timed out, or the value does not fit its schema. The caller got the
// policy's default decision (classify) or no victims (victims) instead.
type DecisionError struct {
	Entrypoint string // "classify" or "victims"
	PID        int    // the process concerned; 0 for victims
	Comm       string
	Field      string // the offending field, when the schema check failed
	Fallback   string // the class used instead, for classify
	Err        error
}

func (e *DecisionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %s", e.Entrypoint)
	if e.PID != 0 {
		fmt.Fprintf(&b, " for pid %d (comm %q)", e.PID, e.Comm)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": decision field %s", e.Field)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if e.Fallback != "" {
		fmt.Fprintf(&b, "; using default class %q", e.Fallback)
	}
	return b.String()
}

func (e *DecisionError) Unwrap() error { return e.Err }
