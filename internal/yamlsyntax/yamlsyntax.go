// Package yamlsyntax words the syntax errors of go.yaml.in/yaml/v3 for a
// person: with the line a problem is on, where the decoder's message
// names another.
//
// The decoder names the line where the construct it was reading began (a
// flow mapping, a plain scalar), and for the errors of its parser, as
// opposed to its scanner, counts lines from 0: an unclosed "{" on line 7
// is reported at "line 6", a tab that breaks the indentation on line 5 at
// the line of the scalar before it.
package yamlsyntax

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// parserProblems are the messages of the decoder's parser errors, whose
// line numbers count from 0 (its scanner's count from 1).
var parserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

var lineRE = regexp.MustCompile(`^line (\d+): (.*)$`)

// Message returns the decoder's error err about data without its "yaml: "
// prefix, with the line corrected: the line where the construct that
// failed begins for a parser error, the line of the offending tab for a
// tab in the indentation.
func Message(err error, data []byte) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, convErr := strconv.Atoi(m[1])
	if convErr != nil {
		return msg
	}
	problem := m[2]
	switch {
	case parserProblems[problem]:
		line++
	case strings.Contains(problem, "tab character"):
		if l := tabIndented(data, line); l > 0 {
			line = l
		}
	}
	return "line " + strconv.Itoa(line) + ": " + problem
}

// tabIndented returns the first line from line on (counting from 1) whose
// indentation holds a tab, 0 if none does.
func tabIndented(data []byte, from int) int {
	for i, l := range bytes.Split(data, []byte("\n")) {
		if i+1 < from {
			continue
		}
		indent := l[:len(l)-len(bytes.TrimLeft(l, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 {
			return i + 1
		}
	}
	return 0
}
