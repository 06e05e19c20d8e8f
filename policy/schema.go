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
	return n.check(v, "")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (n *schemaNode) check(v any, path string) *FieldError {
	if n.ref != "" {
		d, ok := n.root.defs[n.ref]
		if !ok {
			return &FieldError{path, "schema refers to unknown definition " + n.ref}
		}
		return d.check(v, path)
	}
	if _, ok := v.(unknownValue); ok {
		return nil
	}
	if len(n.types) > 0 && !slices.ContainsFunc(n.types, func(t string) bool { return hasType(v, t) }) {
		return &FieldError{path, fmt.Sprintf("want %s, got %s", strings.Join(n.types, " or "), typeName(v))}
	}
	switch x := v.(type) {
	case map[string]any:
		for _, r := range n.required {
			if _, ok := x[r]; !ok {
				return &FieldError{join(path, r), "required field missing"}
			}
		}
		// Known properties first, in a fixed order and without sorting the
		// document's keys: this runs on every decision.
		known := 0
		for _, k := range n.propOrder {
			v, ok := x[k]
			if !ok {
				continue
			}
			known++
			if e := n.properties[k].check(v, join(path, k)); e != nil {
				return e
			}
		}
		if known == len(x) {
			break
		}
		keys := make([]string, 0, len(x)-known)
		for k := range x {
			if _, ok := n.properties[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			switch {
			case n.additional != nil:
				if e := n.additional.check(x[k], join(path, k)); e != nil {
					return e
				}
			case n.noAdditional:
				return &FieldError{join(path, k), "unknown field" + n.suggest(k)}
			}
		}
	case []any:
		if n.maxItems >= 0 && len(x) > n.maxItems {
			return &FieldError{path, fmt.Sprintf("%d items, at most %d allowed", len(x), n.maxItems)}
		}
		if n.uniqueItems {
			seen := map[string]bool{}
			for i, e := range x {
				k := fmt.Sprint(e)
				if seen[k] {
					return &FieldError{fmt.Sprintf("%s[%d]", path, i), fmt.Sprintf("duplicate item %v", e)}
				}
				seen[k] = true
			}
		}
		if n.items != nil {
			for i, e := range x {
				if fe := n.items.check(e, fmt.Sprintf("%s[%d]", path, i)); fe != nil {
					return fe
				}
			}
		}
	case string:
		if n.enum != nil && !slices.Contains(n.enum, x) {
			return &FieldError{path, fmt.Sprintf("%q is not one of %s", x, strings.Join(n.enum, "|"))}
		}
		if n.maxLength >= 0 && len([]rune(x)) > n.maxLength {
			return &FieldError{path, fmt.Sprintf("%d characters, at most %d allowed", len([]rune(x)), n.maxLength)}
		}
		if n.pattern != nil && !n.pattern.MatchString(x) {
			return &FieldError{path, fmt.Sprintf("%q does not match %s", x, n.pattern)}
		}
	default:
		if f, ok := number(v); ok {
			if n.min != nil && f < *n.min {
				return &FieldError{path, fmt.Sprintf("%v is below the minimum %v", f, *n.min)}
			}
			if n.exclusiveMin != nil && f <= *n.exclusiveMin {
				return &FieldError{path, fmt.Sprintf("%v must be greater than %v", f, *n.exclusiveMin)}
			}
			if n.max != nil && f > *n.max {
				return &FieldError{path, fmt.Sprintf("%v is above the maximum %v", f, *n.max)}
			}
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

func hasType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := number(v)
		return ok
	case "integer":
		f, ok := number(v)
		return ok && f == math.Trunc(f) && !math.IsInf(f, 0)
	}
	return false
}

func typeName(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("boolean %v", x)
	case nil:
		return "null"
	}
	if f, ok := number(v); ok {
		return fmt.Sprintf("number %v", f)
	}
	return fmt.Sprintf("%T", v)
}
