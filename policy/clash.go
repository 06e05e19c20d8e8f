package policy

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// A directory is read as ONE policy, with every subdirectory: data files
// and helper modules may sit anywhere below it. Pointing the loader at a
// directory that holds several policies (the repository's rego/, or
// rego/examples) loads them all as one, and their rules clash: OPA then
// reports "package annotation redeclared", "conflicting rules" or a
// conflict while evaluating default_decision, none of which says why.
// Every policy defines data.arbiter.default_decision, so two directories
// that each define it are two policies, and the loader says so instead.

// severalPolicies returns one diagnostic saying that the files under name
// hold several policies, and one at each policy's default_decision, when
// more than one directory defines data.arbiter.default_decision; nil
// otherwise.
func severalPolicies(name string, mods map[string]*ast.Module) []Diagnostic {
	at := map[string]*ast.Location{} // policy directory -> its default_decision
	for file, m := range mods {
		if strings.HasSuffix(file, "_test.rego") || m.Package.Path.String() != "data.arbiter" {
			continue
		}
		for _, r := range m.Rules {
			if r.Head.Ref().String() != EntryDefault {
				continue
			}
			dir := filepath.Dir(file)
			if old, ok := at[dir]; !ok || r.Location.File < old.File || r.Location.File == old.File && r.Location.Row < old.Row {
				at[dir] = r.Location
			}
		}
	}
	if len(at) < 2 {
		return nil
	}
	dirs := make([]string, 0, len(at))
	for d := range at {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	out := []Diagnostic{{Code: CodeLoad, File: name, Message: fmt.Sprintf(
		"%d policies loaded as one: %s each define data.arbiter.default_decision, so their rules clash. "+
			"A directory holds ONE policy, read with all its subdirectories: load each of these directories on its own "+
			"(name each of them: arbiter policy check %s; policy test takes them the same way)",
		len(dirs), andList(dirs), strings.Join(dirs, " "))}}
	for _, d := range dirs {
		loc := at[d]
		out = append(out, Diagnostic{Code: CodeLoad, File: loc.File, Row: loc.Row, Col: loc.Col,
			Message: fmt.Sprintf("the policy in %s defines data.arbiter.default_decision here", d)})
	}
	return out
}

// andList spells names as "a, b and c".
func andList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// annotationClash returns a diagnostic for each package whose METADATA
// block of scope package (or subpackages) appears in more than one file:
// OPA allows one per package and reports only "package annotation
// redeclared". The usual cause is a copy of a policy file left in its
// directory (policy.rego and a backup of it), which a directory, read
// whole, loads too. nil where there is none.
func annotationClash(mods map[string]*ast.Module) []Diagnostic {
	type key struct{ scope, pkg string }
	first := map[key]string{} // the file of the first block
	files := make([]string, 0, len(mods))
	for f := range mods {
		files = append(files, f)
	}
	sort.Strings(files)
	var out []Diagnostic
	for _, f := range files {
		for _, a := range mods[f].Annotations {
			if a.Scope != "package" && a.Scope != "subpackages" {
				continue
			}
			k := key{a.Scope, mods[f].Package.Path.String()}
			prev, ok := first[k]
			if !ok {
				first[k] = f
				continue
			}
			loc := a.Location
			if loc == nil {
				loc = &ast.Location{File: f}
			}
			out = append(out, Diagnostic{Code: CodeLoad, File: loc.File, Row: loc.Row, Col: loc.Col, Message: fmt.Sprintf(
				"a second METADATA block of scope %s for package %s (the first is in %s): OPA allows one per package "+
					"(it says \"%s annotation redeclared\"). Keep it in one file; if one of the two files is a copy left "+
					"in the policy's directory, remove the copy: the directory is read whole, with every subdirectory",
				k.scope, strings.TrimPrefix(k.pkg, "data."), prev, k.scope)})
		}
	}
	return out
}
