// Package yamlsyntax words the syntax errors of go.yaml.in/yaml/v3 for a
// person: with the line the problem is on, where the decoder's message
// names another.
//
// The decoder names the line where the construct it was reading began (a
// block mapping, a flow sequence, a plain scalar), or, for one that began
// on the first line, the line of the token it failed at, and counts those
// of its parser's errors, as opposed to its scanner's, from 0: an unclosed
// "{" on line 7 is reported at "line 6", a key out of place on line 4 of
// a mapping that begins on line 2 at "line 1", a tab that breaks the
// indentation on line 5 at the line of the scalar before it.
//
// The line a person must fix is the first by which the document is
// broken: the shortest run of its first lines that fails to decode with
// the same problem. Message finds it by decoding longer and longer runs of
// the document's first lines, which costs nothing until a file fails, and
// little then: specs and configurations are short (past 64 MiB decoded,
// it keeps the decoder's line). A flow collection whose items continue
// on the next line with the comma there (`[1` then `, 2]`) looks broken
// when cut after its first line: an error later with the same wording is
// then placed on that line.
//
// The errors of go.yaml.in/yaml/v2 (through sigs.k8s.io/yaml) name their
// problems in the same words, so Message places them the same way.
package yamlsyntax

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is a syntax error of the decoder, worded by Message; Unwrap
// returns the decoder's own.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

// Wrap returns err, the decoder's error about data, as an *Error.
func Wrap(err error, data []byte) error { return &Error{msg: Message(err, data), err: err} }

// maxScanBytes bounds the bytes Message decodes again, over all the runs
// of lines it tries: beyond, it keeps the decoder's line.
const maxScanBytes = 64 << 20

var lineRE = regexp.MustCompile(`^line (\d+): (.*)$`)

// Message returns the decoder's error err about data without its "yaml: "
// prefix, naming the first line by which data is broken ("line N: ...").
func Message(err error, data []byte) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	problem := msg
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		problem = m[2]
	}
	if line := firstBroken(data, problem); line > 0 {
		return "line " + strconv.Itoa(line) + ": " + problem
	}
	return msg
}

// firstBroken returns the smallest k such that the first k lines of data
// fail to decode with problem, 0 if none does within maxScanBytes. (The
// decoder's own line is no bound: for a construct begun on the first line
// it names the token it failed at, which for one left open is past the
// end.)
func firstBroken(data []byte, problem string) int {
	budget := maxScanBytes
	for k, end := range lineEnds(data) {
		if budget -= end; budget < 0 {
			return 0
		}
		var n yaml.Node
		err := yaml.NewDecoder(bytes.NewReader(data[:end])).Decode(&n)
		if err == nil {
			continue
		}
		got := strings.TrimPrefix(err.Error(), "yaml: ")
		if m := lineRE.FindStringSubmatch(got); m != nil {
			got = m[2]
		}
		if got == problem {
			return k + 1
		}
	}
	return 0
}

// lineEnds returns, for each line of data, the offset just past it (its
// newline included).
func lineEnds(data []byte) []int {
	var ends []int
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}
