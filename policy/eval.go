package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/gpu-arbiter/arbiter/policy/schema"
)

// MaxInputDepth bounds the nesting of an input document given to Eval.
const MaxInputDepth = 1000

// MaxInputBytes bounds an input document DecodeInput reads: a real one is
// a few kilobytes.
const MaxInputBytes = 16 << 20

// EvalResult is one evaluation made by Eval, for `arbiter policy eval`.
type EvalResult struct {
	Entrypoint string           `json:"entrypoint"`
	Evaluator  Evaluator        `json:"evaluator"` // plan, or topdown (always with a trace)
	Defined    bool             `json:"defined"`
	Value      any              `json:"value,omitempty"`    // what the policy returned
	Decision   *Decision        `json:"decision,omitempty"` // classify: what the engine would apply
	Victims    *VictimDecision  `json:"victims,omitempty"`  // victims: what the engine would apply
	Error      string           `json:"error,omitempty"`    // why the policy's value was not used
	Trace      []*topdown.Event `json:"-"`
}

// DecodeInput decodes and checks an input document (JSON) against
// schema/input.json, with a clear error for anything it rejects.
func DecodeInput(r io.Reader) (any, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	if len(b) > MaxInputBytes {
		return nil, fmt.Errorf("input: more than %d bytes (16 MiB); an input document is a few kilobytes of JSON", MaxInputBytes)
	}
	if d := jsonDepth(b); d > MaxInputDepth {
		return nil, fmt.Errorf("input: nested %d levels deep, more than %d", d, MaxInputDepth)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("input: empty: an input document is a JSON object (arbiter policy schema input prints its schema; examples/policy has two)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("input: not valid JSON: byte offset %d: %w", se.Offset, err)
		}
		return nil, fmt.Errorf("input: not valid JSON: %w", err)
	}
	s, err := schema.Load()
	if err != nil {
		return nil, err
	}
	if all := s.Input.ValidateAll(v); len(all) > 0 {
		e := &InputError{Fields: make([]schema.FieldError, len(all))}
		for i, fe := range all {
			e.Fields[i] = *fe
		}
		return nil, e
	}
	return v, nil
}

// InputError is an input document that does not fit schema/input.json,
// with every violation: a document written by hand is fixed faster when
// all its mistakes are shown at once.
type InputError struct {
	Fields []schema.FieldError
}

// maxInputErrors bounds the violations an InputError spells out.
const maxInputErrors = 50

// Error lists the violations, at most maxInputErrors of them.
func (e *InputError) Error() string {
	const head = "input does not fit schema/input.json (arbiter policy schema input)"
	if len(e.Fields) == 1 {
		return head + ": " + e.Fields[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d errors:", head, len(e.Fields))
	for i, fe := range e.Fields {
		if i == maxInputErrors {
			fmt.Fprintf(&b, "\n  and %d more", len(e.Fields)-i)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(fe.Error())
	}
	return b.String()
}

// jsonDepth returns the deepest nesting of arrays and objects in b, without
// decoding it (so a hostile document cannot exhaust the stack).
func jsonDepth(b []byte) int {
	depth, max, inStr, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			if depth++; depth > max {
				max = depth
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return max
}

// Eval evaluates an entry point on a decoded input document (see
// DecodeInput). The entry point is victims when the input has a state, else
// classify. With trace, the evaluation's events are kept for explanation.
func (p *Policy) Eval(ctx context.Context, input any, trace bool) (*EvalResult, error) {
	m, _ := input.(map[string]any)
	_, hasState := m["state"]
	_, hasProcess := m["process"]
	if hasState == hasProcess {
		return nil, errors.New("input must have exactly one of process (for classify) and state (for victims)")
	}
	val, err := ast.InterfaceToValue(input)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	res := &EvalResult{Entrypoint: EntryClassify, Evaluator: EvaluatorTopdown}
	if p.planned != nil && !trace {
		res.Evaluator = EvaluatorPlan
	}
	var tracer *topdown.BufferTracer
	if trace {
		tracer = topdown.NewBufferTracer()
	}
	var qt topdown.QueryTracer
	if tracer != nil {
		qt = tracer
	}
	if hasState {
		res.Entrypoint = EntryVictims
		var d VictimDecision
		if p.victims != nil {
			v, defined, err := p.eval(ctx, EntryVictims, val, qt)
			res.Defined, res.Value = defined, jsonValue(v)
			d, err = p.decideVictims(v, defined, err, knownPIDs(m))
			if err != nil {
				res.Error = err.Error()
			}
		}
		res.Victims = &d
	} else {
		v, defined, err := p.eval(ctx, EntryClassify, val, qt)
		res.Defined, res.Value = defined, jsonValue(v)
		proc, _ := m["process"].(map[string]any)
		pid, _ := schema.JSONDoc{}.Num(proc["pid"])
		comm, _ := proc["comm"].(string)
		d, err := p.decide(v, defined, err, int(pid), comm)
		if err != nil {
			res.Error = err.Error()
		}
		res.Decision = &d
	}
	if tracer != nil {
		res.Trace = *tracer
	}
	return res, nil
}

// jsonValue converts what the policy returned for printing; nil when
// undefined.
func jsonValue(v ast.Value) any {
	if v == nil {
		return nil
	}
	j, err := ast.JSON(v)
	if err != nil {
		return v.String()
	}
	return j
}

func knownPIDs(input map[string]any) func(int) bool {
	pids := map[int]bool{}
	st, _ := input["state"].(map[string]any)
	procs, _ := st["processes"].([]any)
	for _, p := range procs {
		pm, _ := p.(map[string]any)
		if f, ok := (schema.JSONDoc{}).Num(pm["pid"]); ok {
			pids[int(f)] = true
		}
	}
	return func(pid int) bool { return pids[pid] }
}

// Explain writes a human reading of a traced evaluation: each step with
// its file and row, as `opa eval --explain full` does.
func Explain(w io.Writer, r *EvalResult) {
	topdown.PrettyTraceWithLocation(w, r.Trace)
}
