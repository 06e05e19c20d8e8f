package yamlsyntax

import (
	"bytes"
	"errors"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestMessageLines: each syntax error names the line a person would fix,
// counted from 1, whatever the decoder's own count and wherever the
// construct around the problem begins.
func TestMessageLines(t *testing.T) {
	for _, c := range []struct {
		name, doc, want string
	}{
		{"unclosed flow mapping", "a: 1\nb: 2\nc: {x: 1, y: 2\nd: 4\n", "line 3: did not find expected ',' or '}'"},
		{"unclosed flow sequence", "a: 1\nb: [1, 2\nc: 3\n", "line 2: did not find expected ',' or ']'"},
		{"unclosed flow mapping on the only line", "a: {x: 1", "line 1: did not find expected ',' or '}'"},
		{"unclosed JSON object, blank lines after", "{\"x\": 1\n\n\n\n", "line 1: did not find expected ',' or '}'"},
		{"tab in the indentation", "a:\n  b: 1\n\tc: 2\n", "line 3: found a tab character that violates indentation"},
		{"mapping value in a scalar", "a: 1\nb: c: d\n", "line 2: mapping values are not allowed in this context"},
		{"mapping value on the first line", "a: b: c\n", "line 1: mapping values are not allowed in this context"},
		{"bad key on a later line", "a: 1\nb: 2\n- c\n", "line 3: did not find expected key"},
		{"bad key in a nested mapping", "x:\n  a: 1\n  b: 2\n  - c\n", "line 4: did not find expected key"},
		{"misindented key under a list item", "lc:\n  - name: a\n    gpu: 0\n   slo: 1\n", "line 4: did not find expected '-' indicator"},
		{"a document that ends where it breaks", "a: 1\nb: [1,\n", "line 2: did not find expected node content"},
	} {
		var n yaml.Node
		err := yaml.NewDecoder(bytes.NewReader([]byte(c.doc))).Decode(&n)
		if err == nil {
			t.Fatalf("%s: decoded", c.name)
		}
		if got := Message(err, []byte(c.doc)); got != c.want {
			t.Errorf("%s: %q (decoder: %q), want %q", c.name, got, err, c.want)
		}
		if w := Wrap(err, []byte(c.doc)); !errors.Is(w, err) || w.Error() != Message(err, []byte(c.doc)) {
			t.Errorf("%s: Wrap gives %q, unwrapping to the decoder's error %v", c.name, w, errors.Is(w, err))
		}
	}
}
