package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-arbiter/arbiter/internal/yamlsyntax"
)

// Resolve returns the configuration the daemon starts from, before flags:
// the file at path when path is not empty (it must exist), else
// DefaultPath when that file exists, else Default(). used is the file read,
// or "" when none was.
func Resolve(path string) (cfg Config, used string, err error) {
	if path != "" {
		cfg, err := Load(path)
		return cfg, path, err
	}
	cfg, err = Load(DefaultPath)
	if errors.Is(err, fs.ErrNotExist) {
		return Default(), "", nil
	}
	return cfg, DefaultPath, err
}

// Load reads the YAML file at path over Default(): keys it sets replace
// the default, keys it leaves out keep it. Every problem in the file is
// reported at once, each as FILE:LINE: what is wrong. A missing file is an
// error that matches fs.ErrNotExist.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: read %s: %w", path, err)
	}
	return Parse(path, b)
}

// Parse decodes a configuration file's contents over Default(); name is
// the file's name in error messages.
func Parse(name string, data []byte) (Config, error) {
	cfg := Default()
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, nil // an empty file, or one of comments only
		}
		return Config{}, fmt.Errorf("config: %s: not valid YAML: %w", name, yamlsyntax.Wrap(err, data))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Config{}, fmt.Errorf("config: %s:%d: a second YAML document; the file holds one mapping of settings", name, extra.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return cfg, nil
	}
	if root.Kind != yaml.MappingNode {
		return Config{}, fmt.Errorf("config: %s:%d: the file must be a mapping of settings (key: value), not a %s", name, root.Line, kindName(root))
	}
	var errs []error
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if err := apply(&cfg, k, v, seen); err != nil {
			errs = append(errs, fmt.Errorf("config: %s:%d: %w", name, k.Line, err))
		}
	}
	if len(errs) > 0 {
		return Config{}, several(name, errs)
	}
	return cfg, nil
}

// several puts the errors found in one place (a file, the settings)
// together: one as it is, more under a line that counts them, each on a
// line of its own, indented, so that every one is read as part of the
// same failure.
func several(where string, errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %s: %d errors:", where, len(errs))
	for _, e := range errs {
		b.WriteString("\n  ")
		b.WriteString(strings.TrimPrefix(e.Error(), "config: "))
	}
	return &joined{msg: b.String(), errs: errs}
}

// joined is several errors under one message; errors.Is and As see each.
type joined struct {
	msg  string
	errs []error
}

func (j *joined) Error() string   { return j.msg }
func (j *joined) Unwrap() []error { return j.errs }

// apply sets the setting named by key node k to value node v.
func apply(cfg *Config, k, v *yaml.Node, seen map[string]int) error {
	if k.Kind != yaml.ScalarNode {
		return fmt.Errorf("a key must be a name, not a %s", kindName(k))
	}
	s, ok := lookup(k.Value)
	if !ok {
		msg := fmt.Sprintf("unknown key %q", k.Value)
		if near := nearest(k.Value, keys()); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		}
		return fmt.Errorf("%s; known keys: %s", msg, strings.Join(keys(), ", "))
	}
	if line, dup := seen[k.Value]; dup {
		return fmt.Errorf("key %q set twice (first on line %d)", k.Value, line)
	}
	seen[k.Value] = k.Line
	if v.Kind != yaml.ScalarNode {
		return fmt.Errorf("%s: want a single value, not a %s", k.Value, kindName(v))
	}
	if v.Tag == "!!null" {
		return fmt.Errorf("%s: no value; remove the line to keep the default (%q)", k.Value, s.Get(ptr(Default())))
	}
	if s.Bool && v.Tag != "!!bool" {
		return fmt.Errorf("%s: %q is not true or false", k.Value, v.Value)
	}
	if err := s.set(cfg, v.Value); err != nil {
		return fmt.Errorf("%s: %w", k.Value, err)
	}
	return nil
}

func ptr(c Config) *Config { return &c }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	case yaml.ScalarNode:
		return "single value"
	}
	return "YAML node"
}

// nearest returns the key within two edits of s, if there is one.
func nearest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
