package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/gpu-arbiter/arbiter/policy/schema"
)

// checkEntrypoints reports missing entry points and literal decisions that
// cannot fit their schema, at the offending term, before any evaluation:
// `classify := {"class": "lc", "priority": "high"}` is caught by
// `arbiter policy check`, not by the first process that hits it.
func (p *Policy) checkEntrypoints() []Diagnostic {
	var diags []Diagnostic
	for _, e := range []string{EntryClassify, EntryDefault} {
		if len(p.compiler.GetRules(entryRef(e))) == 0 {
			diags = append(diags, Diagnostic{Code: CodeEntrypoint, File: p.src.Name,
				Message: fmt.Sprintf("no rule data.arbiter.%s: a policy defines classify and default_decision in package arbiter", e)})
		}
	}
	if own := ownPackages(p.src); len(diags) == 2 && !slices.Contains(own, "data.arbiter") {
		msg := "no rule data.arbiter.classify or data.arbiter.default_decision: "
		if slices.Equal(own, []string{libPackage}) {
			// Only the helper library (rego/lib), given where a policy
			// was expected.
			msg += "these files are the helper library (package arbiter.lib), not a policy; " +
				"a policy defines both rules in package arbiter (see rego/default) and gets the library with it"
		} else {
			names := make([]string, len(own))
			for i, pkg := range own {
				names[i] = strings.TrimPrefix(pkg, "data.")
			}
			msg += fmt.Sprintf("the policy's files are in package %s, not package arbiter, where a policy defines both rules (see rego/default)",
				strings.Join(names, ", "))
		}
		diags = []Diagnostic{{Code: CodeEntrypoint, File: p.src.Name, Message: msg}}
	}
	for _, x := range []struct {
		entry  string
		schema *schema.Schema
	}{{EntryClassify, p.schemas.Decision}, {EntryDefault, p.schemas.Decision}, {EntryVictims, p.schemas.Victims}} {
		ref := entryRef(x.entry)
		var rules []*ast.Rule
		for _, r := range p.compiler.GetRules(ref) {
			for ; r != nil; r = r.Else { // else branches are decisions too
				rules = append(rules, r)
			}
		}
		for _, r := range rules {
			if r.Head.Value == nil || r.Head.Key != nil || !r.Head.Ref().Equal(ref[len(ref)-1:]) && !r.Path().Equal(ref) {
				continue // partial or ref-headed rules build the value piecewise
			}
			if _, isFunc := r.Head.Value.Value.(ast.Call); isFunc || len(r.Head.Args) > 0 {
				diags = append(diags, locDiag(r.Location, fmt.Sprintf("data.arbiter.%s must be a value, not a function", x.entry)))
				continue
			}
			locs := map[string]*ast.Location{}
			v := staticValue(r.Head.Value, "", locs)
			if fe := x.schema.Validate(v); fe != nil {
				loc := r.Head.Value.Location
				for f := fe.Field; ; {
					if l, ok := locs[f]; ok && l != nil {
						loc = l
						break
					}
					i := strings.LastIndexAny(f, ".[")
					if i < 0 {
						break
					}
					f = f[:i]
				}
				if loc == nil {
					loc = r.Location
				}
				diags = append(diags, locDiag(loc, fmt.Sprintf("data.arbiter.%s does not fit the %s schema: %s", x.entry, schemaTitle(x.entry), fe.Error())))
			}
		}
	}
	return diags
}

// ownPackages lists the packages of the policy's own files (not of the
// library the loader added), sorted, each once.
func ownPackages(src *Source) []string {
	var out []string
	for name, m := range src.Modules {
		if pkg := m.Package.Path.String(); !strings.HasPrefix(name, embeddedPrefix) && !slices.Contains(out, pkg) {
			out = append(out, pkg)
		}
	}
	slices.Sort(out)
	return out
}

func locDiag(loc *ast.Location, msg string) Diagnostic {
	d := Diagnostic{Code: CodeDecision, Message: msg}
	if loc != nil {
		d.File, d.Row, d.Col = loc.File, loc.Row, loc.Col
	}
	return d
}

// schemaTitle names the schema an entry point's value must fit.
func schemaTitle(entry string) string {
	if entry == EntryVictims {
		return "victims"
	}
	return "decision"
}

// staticValue turns the known parts of a rule's head into a JSON-like value;
// variables, references, calls and comprehensions become schema.Unknown.
func staticValue(t *ast.Term, at string, locs map[string]*ast.Location) any {
	locs[at] = t.Location
	switch v := t.Value.(type) {
	case ast.String:
		return string(v)
	case ast.Number:
		return json.Number(v)
	case ast.Boolean:
		return bool(v)
	case ast.Null:
		return nil
	case *ast.Array:
		out := make([]any, v.Len())
		for i := range v.Len() {
			out[i] = staticValue(v.Elem(i), fmt.Sprintf("%s[%d]", at, i), locs)
		}
		return out
	case ast.Object:
		out := map[string]any{}
		known := true
		v.Foreach(func(k, val *ast.Term) {
			ks, ok := k.Value.(ast.String)
			if !ok {
				known = false
				return
			}
			out[string(ks)] = staticValue(val, schema.JoinField(at, string(ks)), locs)
		})
		if !known {
			return schema.Unknown{}
		}
		return out
	}
	return schema.Unknown{}
}
