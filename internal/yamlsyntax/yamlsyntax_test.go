package yamlsyntax

import (
	"bytes"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestMessageLines: each syntax error names the line a person would fix,
// counted from 1, whatever the decoder's own count.
func TestMessageLines(t *testing.T) {
	for _, c := range []struct {
		name, doc, want string
	}{
		{"unclosed flow mapping", "a: 1\nb: 2\nc: {x: 1, y: 2\nd: 4\n", "line 3: did not find expected ',' or '}'"},
		{"unclosed flow sequence", "a: 1\nb: [1, 2\nc: 3\n", "line 2: did not find expected ',' or ']'"},
		{"tab in the indentation", "a:\n  b: 1\n\tc: 2\n", "line 3: found a tab character that violates indentation"},
		{"mapping value in a scalar", "a: 1\nb: c: d\n", "line 2: mapping values are not allowed in this context"},
		{"bad key on a later line", "a: 1\nb: 2\n- c\n", "line 3: did not find expected key"},
	} {
		var n yaml.Node
		err := yaml.NewDecoder(bytes.NewReader([]byte(c.doc))).Decode(&n)
		if err == nil {
			t.Fatalf("%s: decoded", c.name)
		}
		if got := Message(err, []byte(c.doc)); got != c.want {
			t.Errorf("%s: %q (decoder: %q), want %q", c.name, got, err, c.want)
		}
	}
}
