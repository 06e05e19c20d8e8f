package policy

import (
	"embed"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// APIVersion is the version of the input and decision schemas. It is
// carried in input.apiVersion so that a policy can tell which shape it sees.
const APIVersion = "arbiter.io/v1"

//go:embed schema/*.json
var schemaFiles embed.FS

// Schema names accepted by [SchemaJSON].
const (
	SchemaInput    = "input"
	SchemaDecision = "decision"
	SchemaVictims  = "victims"
)

// SchemaJSON returns the published JSON Schema (draft-07) of the input
// document, the classification decision or the victim decision.
func SchemaJSON(name string) ([]byte, error) {
	b, err := schemaFiles.ReadFile("schema/" + name + ".json")
	if err != nil {
		return nil, fmt.Errorf("unknown schema %q: want %s, %s or %s", name, SchemaInput, SchemaDecision, SchemaVictims)
	}
	return b, nil
}

// schemas holds the compiled published schemas; built once per Policy.
type schemas struct {
	input, decision, victims *schemaNode
	// ast reads decisions in OPA's AST, with every property name of the
	// schemas ready as a term.
	ast astDoc
}

func loadSchemas() (*schemas, error) {
	var s schemas
	for _, x := range []struct {
		name string
		dst  **schemaNode
	}{{SchemaInput, &s.input}, {SchemaDecision, &s.decision}, {SchemaVictims, &s.victims}} {
		b, err := SchemaJSON(x.name)
		if err != nil {
			return nil, err
		}
		n, err := compileSchema(b)
		if err != nil {
			return nil, fmt.Errorf("schema %s: %w", x.name, err)
		}
		*x.dst = n
	}
	s.ast = astDoc{names: map[string]*ast.Term{}}
	for _, n := range []*schemaNode{s.input, s.decision, s.victims} {
		n.propertyTerms(s.ast.names)
	}
	return &s, nil
}

// schemaNode is one compiled JSON Schema. Only the keywords our published
// schemas use are supported; compileSchema rejects any other, so a schema
// edit can never be silently ignored by the validator.
type schemaNode struct {
	types        []string
	properties   map[string]*schemaNode
	propOrder    []string // sorted property names
	required     []string
	additional   *schemaNode // nil: anything
	noAdditional bool
	items        *schemaNode
	enum         []string
	min, max     *float64
	exclusiveMin *float64
	maxItems     int // -1: none
	maxLength    int // -1: none
	uniqueItems  bool
	pattern      *regexp.Regexp
	ref          string
	defs         map[string]*schemaNode // root only
	root         *schemaNode
}

var ignoredKeywords = map[string]bool{"$schema": true, "$id": true, "title": true, "description": true, "examples": true, "definitions": true}

func compileSchema(b []byte) (*schemaNode, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	root := &schemaNode{defs: map[string]*schemaNode{}}
	if d, ok := raw["definitions"].(map[string]any); ok {
		for name, v := range d {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("definitions.%s: not an object", name)
			}
			n, err := compileNode(m, root, "definitions."+name)
			if err != nil {
				return nil, err
			}
			root.defs[name] = n
		}
	}
	n, err := compileNode(raw, root, "")
	if err != nil {
		return nil, err
	}
	n.defs, n.root = root.defs, n
	root.defs = n.defs
	return n, nil
}

func compileNode(m map[string]any, root *schemaNode, at string) (*schemaNode, error) {
	n := &schemaNode{maxItems: -1, maxLength: -1, root: root}
	num := func(k string, v any) (*float64, error) {
		f, ok := v.(float64)
		if !ok {
			return nil, fmt.Errorf("%s.%s: not a number", at, k)
		}
		return &f, nil
	}
	var err error
	for k, v := range m {
		switch k {
		case "type":
			switch t := v.(type) {
			case string:
				n.types = []string{t}
			case []any:
				for _, x := range t {
					s, _ := x.(string)
					n.types = append(n.types, s)
				}
			}
		case "properties":
			props, _ := v.(map[string]any)
			n.properties = map[string]*schemaNode{}
			for name, pv := range props {
				pm, ok := pv.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s.properties.%s: not an object", at, name)
				}
				if n.properties[name], err = compileNode(pm, root, at+"."+name); err != nil {
					return nil, err
				}
				n.propOrder = append(n.propOrder, name)
			}
			sort.Strings(n.propOrder)
		case "required":
			for _, x := range v.([]any) {
				n.required = append(n.required, x.(string))
			}
		case "additionalProperties":
			switch a := v.(type) {
			case bool:
				n.noAdditional = !a
			case map[string]any:
				if n.additional, err = compileNode(a, root, at+".additionalProperties"); err != nil {
					return nil, err
				}
			}
		case "items":
			im, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s.items: not an object", at)
			}
			if n.items, err = compileNode(im, root, at+"[]"); err != nil {
				return nil, err
			}
		case "enum":
			for _, x := range v.([]any) {
				s, ok := x.(string)
				if !ok {
					return nil, fmt.Errorf("%s.enum: only string enums are supported", at)
				}
				n.enum = append(n.enum, s)
			}
		case "minimum":
			n.min, err = num(k, v)
		case "maximum":
			n.max, err = num(k, v)
		case "exclusiveMinimum":
			n.exclusiveMin, err = num(k, v)
		case "maxItems", "maxLength":
			var f *float64
			if f, err = num(k, v); err == nil {
				if k == "maxItems" {
					n.maxItems = int(*f)
				} else {
					n.maxLength = int(*f)
				}
			}
		case "uniqueItems":
			n.uniqueItems, _ = v.(bool)
		case "pattern":
			s, _ := v.(string)
			if n.pattern, err = regexp.Compile(s); err != nil {
				return nil, fmt.Errorf("%s.pattern: %w", at, err)
			}
		case "$ref":
			s, _ := v.(string)
			name, ok := strings.CutPrefix(s, "#/definitions/")
			if !ok {
				return nil, fmt.Errorf("%s.$ref: only #/definitions/NAME is supported, got %q", at, s)
			}
			n.ref = name
		default:
			if !ignoredKeywords[k] {
				return nil, fmt.Errorf("%s: unsupported JSON Schema keyword %q", at, k)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return n, nil
}

// propertyTerms adds every property name under n to terms.
func (n *schemaNode) propertyTerms(terms map[string]*ast.Term) {
	if n == nil {
		return
	}
	for name, p := range n.properties {
		if terms[name] == nil {
			terms[name] = ast.StringTerm(name)
		}
		p.propertyTerms(terms)
	}
	for _, d := range n.defs {
		if d != n {
			d.propertyTerms(terms)
		}
	}
	n.items.propertyTerms(terms)
	n.additional.propertyTerms(terms)
}

// unknownValue stands for a part of a decision that is not known before
// evaluation (a variable in a rule's literal head); it matches any schema.
type unknownValue struct{}

// FieldError says which field of a document broke its schema, and how.
type FieldError struct {
	Field   string // dotted path, e.g. preemption.mode or suspend[2].pid
	Message string
}

func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// validate checks v (as decoded by encoding/json with UseNumber, or built
// from OPA's ast.JSON) against n and returns the first violation in a
// deterministic order.
func (n *schemaNode) validate(v any) *FieldError {
	return check(n, jsonDoc{}, v, nil)
}

// validateAll is validate returning every violation, in the same order:
// for documents a person wrote, where fixing one error at a time is slow.
func (n *schemaNode) validateAll(v any) []*FieldError {
	var all []*FieldError
	check(n, jsonDoc{}, v, &all)
	return all
}

// validateAST is validate for a value in OPA's AST, read as ast.JSON
// would convert it.
func (n *schemaNode) validateAST(d astDoc, v ast.Value) *FieldError {
	return check(n, d, v, nil)
}

// join spells a dotted field path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// within puts a violation found in a field or item under its name: the
// path is spelled out only on failure, so a valid document costs no
// allocation.
func within(fe *FieldError, key string, index int) *FieldError {
	if fe == nil {
		return nil
	}
	prefix := key
	if index >= 0 {
		prefix = fmt.Sprintf("[%d]", index)
	}
	switch {
	case fe.Field == "":
		fe.Field = prefix
	case strings.HasPrefix(fe.Field, "["):
		fe.Field = prefix + fe.Field
	default:
		fe.Field = prefix + "." + fe.Field
	}
	return fe
}

// report hands a violation back: as check's result when all is nil (the
// first violation ends the check), else appended to *all, and the check
// goes on.
func report(all *[]*FieldError, fe *FieldError) *FieldError {
	if all == nil {
		return fe
	}
	*all = append(*all, fe)
	return nil
}

// checkWithin checks a field or item of v: its violations are put under
// its name, the one returned as those appended to *all since it began.
func checkWithin[V any, D document[V]](n *schemaNode, d D, v V, all *[]*FieldError, key string, index int) *FieldError {
	if all == nil {
		return within(check(n, d, v, nil), key, index)
	}
	from := len(*all)
	check(n, d, v, all)
	for _, fe := range (*all)[from:] {
		within(fe, key, index)
	}
	return nil
}

// check validates v against n; a violation's Field is relative to v. With
// all nil it returns the first violation; otherwise it appends every one
// to *all and returns nil. A value of the wrong type is one violation:
// what lies inside it is not checked.
func check[V any, D document[V]](n *schemaNode, d D, v V, all *[]*FieldError) *FieldError {
	if n.ref != "" {
		def, ok := n.root.defs[n.ref]
		if !ok {
			return report(all, &FieldError{"", "schema refers to unknown definition " + n.ref})
		}
		return check(def, d, v, all)
	}
	k := d.kind(v)
	if k == kindUnknown {
		return nil
	}
	if len(n.types) > 0 && !hasType(n, d, v, k) {
		return report(all, &FieldError{"", fmt.Sprintf("want %s, got %s", strings.Join(n.types, " or "), typeName(d, v, k))})
	}
	switch k {
	case kindObject:
		for _, r := range n.required {
			if _, ok := d.field(v, r); !ok {
				if fe := report(all, &FieldError{r, "required field missing"}); fe != nil {
					return fe
				}
			}
		}
		// Known properties first, in a fixed order and without sorting the
		// document's keys: this runs on every decision.
		known := 0
		for _, key := range n.propOrder {
			fv, ok := d.field(v, key)
			if !ok {
				continue
			}
			known++
			if e := checkWithin(n.properties[key], d, fv, all, key, -1); e != nil {
				return e
			}
		}
		if known == d.size(v) {
			break
		}
		for _, key := range d.keys(v) {
			if _, ok := n.properties[key]; ok {
				continue
			}
			switch {
			case n.additional != nil:
				fv, _ := d.field(v, key)
				if e := checkWithin(n.additional, d, fv, all, key, -1); e != nil {
					return e
				}
			case n.noAdditional:
				if fe := report(all, &FieldError{key, "unknown field" + n.suggest(key)}); fe != nil {
					return fe
				}
			}
		}
	case kindArray:
		size := d.size(v)
		if n.maxItems >= 0 && size > n.maxItems {
			if fe := report(all, &FieldError{"", fmt.Sprintf("%d items, at most %d allowed", size, n.maxItems)}); fe != nil {
				return fe
			}
		}
		if n.uniqueItems {
			seen := map[string]bool{}
			for i := range size {
				t := d.text(d.item(v, i))
				if seen[t] {
					if fe := report(all, within(&FieldError{"", "duplicate item " + t}, "", i)); fe != nil {
						return fe
					}
				}
				seen[t] = true
			}
		}
		if n.items != nil {
			for i := range size {
				if fe := checkWithin(n.items, d, d.item(v, i), all, "", i); fe != nil {
					return fe
				}
			}
		}
	case kindString:
		x := d.str(v)
		if n.enum != nil && !slices.Contains(n.enum, x) {
			return report(all, &FieldError{"", fmt.Sprintf("%q is not one of %s", x, strings.Join(n.enum, "|"))})
		}
		if n.maxLength >= 0 && utf8.RuneCountInString(x) > n.maxLength {
			return report(all, &FieldError{"", fmt.Sprintf("%d characters, at most %d allowed", utf8.RuneCountInString(x), n.maxLength)})
		}
		if n.pattern != nil && !n.pattern.MatchString(x) {
			return report(all, &FieldError{"", fmt.Sprintf("%q does not match %s", x, n.pattern)})
		}
	case kindNumber:
		f, _ := d.num(v)
		if n.min != nil && f < *n.min {
			return report(all, &FieldError{"", fmt.Sprintf("%v is below the minimum %v", f, *n.min)})
		}
		if n.exclusiveMin != nil && f <= *n.exclusiveMin {
			return report(all, &FieldError{"", fmt.Sprintf("%v must be greater than %v", f, *n.exclusiveMin)})
		}
		if n.max != nil && f > *n.max {
			return report(all, &FieldError{"", fmt.Sprintf("%v is above the maximum %v", f, *n.max)})
		}
	}
	return nil
}

// suggest names the closest allowed field, for typos such as timeslice_ms.
func (n *schemaNode) suggest(k string) string {
	names := make([]string, 0, len(n.properties))
	for p := range n.properties {
		names = append(names, p)
	}
	sort.Strings(names)
	best, bestScore := "", 0
	for _, p := range names {
		s := commonPrefix(p, k)
		if s > bestScore {
			best, bestScore = p, s
		}
	}
	if bestScore >= 3 {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return fmt.Sprintf(" (allowed: %s)", strings.Join(names, ", "))
}

func commonPrefix(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	}
	return 0, false
}

// hasType says whether v, of kind k, has one of n's types.
func hasType[V any, D document[V]](n *schemaNode, d D, v V, k kind) bool {
	for _, t := range n.types {
		if kindIs(k, t) {
			return true
		}
		if t == "integer" && k == kindNumber {
			if f, ok := d.num(v); ok && f == math.Trunc(f) && !math.IsInf(f, 0) {
				return true
			}
		}
	}
	return false
}

func kindIs(k kind, t string) bool {
	switch t {
	case "object":
		return k == kindObject
	case "array":
		return k == kindArray
	case "string":
		return k == kindString
	case "boolean":
		return k == kindBool
	case "null":
		return k == kindNull
	case "number":
		return k == kindNumber
	}
	return false
}

func typeName[V any, D document[V]](d D, v V, k kind) string {
	switch k {
	case kindObject:
		return "object"
	case kindArray:
		return "array"
	case kindString:
		return fmt.Sprintf("string %q", d.str(v))
	case kindBool:
		return fmt.Sprintf("boolean %v", d.boolean(v))
	case kindNull:
		return "null"
	case kindNumber:
		f, _ := d.num(v)
		return fmt.Sprintf("number %v", f)
	}
	return fmt.Sprintf("%T", v)
}
