package schema

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

//go:embed *.json
var files embed.FS

// Names of the published schemas, as JSON accepts them.
const (
	Input    = "input"
	Decision = "decision"
	Victims  = "victims"
)

// JSON returns the published JSON Schema (draft-07) of the input
// document, the classification decision or the victim decision.
func JSON(name string) ([]byte, error) {
	b, err := files.ReadFile(name + ".json")
	if err != nil {
		return nil, fmt.Errorf("unknown schema %q: want %s, %s or %s", name, Input, Decision, Victims)
	}
	return b, nil
}

// Set is the published schemas, compiled.
type Set struct {
	Input, Decision, Victims *Schema
	// AST reads documents in OPA's AST, with every property name of the
	// schemas ready as a term.
	AST ASTDoc
}

// Load compiles the published schemas.
func Load() (*Set, error) {
	var s Set
	for _, x := range []struct {
		name string
		dst  **Schema
	}{{Input, &s.Input}, {Decision, &s.Decision}, {Victims, &s.Victims}} {
		b, err := JSON(x.name)
		if err != nil {
			return nil, err
		}
		n, err := Compile(b)
		if err != nil {
			return nil, fmt.Errorf("schema %s: %w", x.name, err)
		}
		*x.dst = n
	}
	s.AST = ASTDoc{names: map[string]*ast.Term{}}
	for _, n := range []*Schema{s.Input, s.Decision, s.Victims} {
		n.propertyTerms(s.AST.names)
	}
	return &s, nil
}

// Schema is one compiled JSON Schema. Only the keywords the published
// schemas use are supported; Compile rejects any other, so a schema edit
// can never be silently ignored by the validator.
type Schema struct {
	types        []string
	properties   map[string]*Schema
	propOrder    []string // sorted property names
	required     []string
	additional   *Schema // nil: anything
	noAdditional bool
	items        *Schema
	enum         []string
	min, max     *float64
	exclusiveMin *float64
	maxItems     int // -1: none
	maxLength    int // -1: none
	uniqueItems  bool
	pattern      *regexp.Regexp
	ref          string
	defs         map[string]*Schema // root only
	root         *Schema
}

var ignoredKeywords = map[string]bool{"$schema": true, "$id": true, "title": true, "description": true, "examples": true, "definitions": true}

// Compile compiles a JSON Schema document (draft-07), with the keywords
// the published schemas use.
func Compile(b []byte) (*Schema, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	root := &Schema{defs: map[string]*Schema{}}
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

func compileNode(m map[string]any, root *Schema, at string) (*Schema, error) {
	n := &Schema{maxItems: -1, maxLength: -1, root: root}
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
			n.properties = map[string]*Schema{}
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
func (n *Schema) propertyTerms(terms map[string]*ast.Term) {
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

// Unknown stands for a part of a document that is not known before
// evaluation (a variable in a rule's literal head); it matches any schema.
type Unknown struct{}

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

// Validate checks v (as decoded by encoding/json with UseNumber, or built
// from OPA's ast.JSON; Unknown matches anything) against n and returns the
// first violation in a deterministic order.
func (n *Schema) Validate(v any) *FieldError {
	return check(n, JSONDoc{}, v, nil)
}

// ValidateAll is Validate returning every violation, in the same order:
// for documents a person wrote, where fixing one error at a time is slow.
func (n *Schema) ValidateAll(v any) []*FieldError {
	var all []*FieldError
	check(n, JSONDoc{}, v, &all)
	return all
}

// ValidateAST is Validate for a value in OPA's AST, read as ast.JSON
// would convert it, through d (Set.AST).
func (n *Schema) ValidateAST(d ASTDoc, v ast.Value) *FieldError {
	return check(n, d, v, nil)
}

// JoinField spells the path of field key of the field at path, as
// FieldError.Field spells it.
func JoinField(path, key string) string {
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
func checkWithin[V any, D Document[V]](n *Schema, d D, v V, all *[]*FieldError, key string, index int) *FieldError {
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
func check[V any, D Document[V]](n *Schema, d D, v V, all *[]*FieldError) *FieldError {
	if n.ref != "" {
		def, ok := n.root.defs[n.ref]
		if !ok {
			return report(all, &FieldError{"", "schema refers to unknown definition " + n.ref})
		}
		return check(def, d, v, all)
	}
	k := d.Kind(v)
	if k == KindUnknown {
		return nil
	}
	if len(n.types) > 0 && !hasType(n, d, v, k) {
		return report(all, &FieldError{"", fmt.Sprintf("want %s, got %s", strings.Join(n.types, " or "), typeName(d, v, k))})
	}
	switch k {
	case KindObject:
		for _, r := range n.required {
			if _, ok := d.Field(v, r); !ok {
				if fe := report(all, &FieldError{r, "required field missing"}); fe != nil {
					return fe
				}
			}
		}
		// Known properties first, in a fixed order and without sorting the
		// document's keys: this runs on every decision.
		known := 0
		for _, key := range n.propOrder {
			fv, ok := d.Field(v, key)
			if !ok {
				continue
			}
			known++
			if e := checkWithin(n.properties[key], d, fv, all, key, -1); e != nil {
				return e
			}
		}
		if known == d.Size(v) {
			break
		}
		for _, key := range d.Keys(v) {
			if _, ok := n.properties[key]; ok {
				continue
			}
			switch {
			case n.additional != nil:
				fv, _ := d.Field(v, key)
				if e := checkWithin(n.additional, d, fv, all, key, -1); e != nil {
					return e
				}
			case n.noAdditional:
				if fe := report(all, &FieldError{key, "unknown field" + n.suggest(key)}); fe != nil {
					return fe
				}
			}
		}
	case KindArray:
		size := d.Size(v)
		if n.maxItems >= 0 && size > n.maxItems {
			if fe := report(all, &FieldError{"", fmt.Sprintf("%d items, at most %d allowed", size, n.maxItems)}); fe != nil {
				return fe
			}
		}
		if n.uniqueItems {
			seen := map[string]bool{}
			for i := range size {
				t := d.Text(d.Item(v, i))
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
				if fe := checkWithin(n.items, d, d.Item(v, i), all, "", i); fe != nil {
					return fe
				}
			}
		}
	case KindString:
		x := d.Str(v)
		if n.enum != nil && !slices.Contains(n.enum, x) {
			return report(all, &FieldError{"", fmt.Sprintf("%q is not one of %s", x, strings.Join(n.enum, "|"))})
		}
		if n.maxLength >= 0 && utf8.RuneCountInString(x) > n.maxLength {
			return report(all, &FieldError{"", fmt.Sprintf("%d characters, at most %d allowed", utf8.RuneCountInString(x), n.maxLength)})
		}
		if n.pattern != nil && !n.pattern.MatchString(x) {
			return report(all, &FieldError{"", fmt.Sprintf("%q does not match %s", x, n.pattern)})
		}
	case KindNumber:
		f, _ := d.Num(v)
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
func (n *Schema) suggest(k string) string {
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

// number reads a decoded JSON number.
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
func hasType[V any, D Document[V]](n *Schema, d D, v V, k Kind) bool {
	for _, t := range n.types {
		if kindIs(k, t) {
			return true
		}
		if t == "integer" && k == KindNumber {
			if f, ok := d.Num(v); ok && f == math.Trunc(f) && !math.IsInf(f, 0) {
				return true
			}
		}
	}
	return false
}

func kindIs(k Kind, t string) bool {
	switch t {
	case "object":
		return k == KindObject
	case "array":
		return k == KindArray
	case "string":
		return k == KindString
	case "boolean":
		return k == KindBool
	case "null":
		return k == KindNull
	case "number":
		return k == KindNumber
	}
	return false
}

// TypeName names the JSON type of a decoded value, with the value where
// it is short, for messages such as "want object, got string "x"".
func TypeName(v any) string { return typeName(JSONDoc{}, v, JSONDoc{}.Kind(v)) }

func typeName[V any, D Document[V]](d D, v V, k Kind) string {
	switch k {
	case KindObject:
		return "object"
	case KindArray:
		return "array"
	case KindString:
		return fmt.Sprintf("string %q", d.Str(v))
	case KindBool:
		return fmt.Sprintf("boolean %v", d.Bool(v))
	case KindNull:
		return "null"
	case KindNumber:
		f, _ := d.Num(v)
		return fmt.Sprintf("number %v", f)
	}
	return fmt.Sprintf("%T", v)
}
