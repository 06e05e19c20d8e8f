package policy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/cover"
)

// Uncovered is a line, or part of one, that no test evaluated.
type Uncovered struct {
	File string
	Row  int
	// FromCol and ToCol (inclusive) bound the part not evaluated when the
	// rest of the row was: a one-line rule whose else branch ran and
	// whose first branch did not. Zero when the whole row was not.
	FromCol, ToCol int
}

// String spells the place as file:row, or file:row:from-to for a part of
// a row.
func (u Uncovered) String() string {
	if u.FromCol == 0 {
		return fmt.Sprintf("%s:%d", u.File, u.Row)
	}
	if u.ToCol == 0 {
		return fmt.Sprintf("%s:%d:%d-", u.File, u.Row, u.FromCol)
	}
	return fmt.Sprintf("%s:%d:%d-%d", u.File, u.Row, u.FromCol, u.ToCol)
}

// Partial says whether the rest of the row was evaluated.
func (u Uncovered) Partial() bool { return u.FromCol != 0 }

// MarshalText writes the place as String does.
func (u Uncovered) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// OPA's cover package records the range (rows and columns) of every rule
// head that produced a value and every expression evaluated, and reports
// the others as not covered. Counting rows, as `opa test --coverage` does,
// is wrong where one row holds several of them: a one-line
//
//	classify := x if cond else := default_decision
//
// has three (the head, cond, and the else branch), and a test that takes
// the else branch leaves the row both covered and not covered. Here the
// unit is a statement on a row: each outermost range counts once for each
// row it spans. A row of one statement counts once, as before, and a rule
// written on one line counts as it would written over several.

// coverage reports on the operator's own policy files only: test files
// and the embedded library would flatter the figure.
func coverage(cov *cover.Cover, src *Source) (float64, []Uncovered) {
	report := cov.Report(src.Modules)
	covered, total := 0, 0
	var missing []Uncovered
	for file, fr := range report.Files {
		if strings.HasSuffix(file, "_test.rego") || strings.HasPrefix(file, embeddedPrefix) {
			continue
		}
		c, t, m := fileCoverage(file, fr)
		covered, total, missing = covered+c, total+t, append(missing, m...)
	}
	sort.Slice(missing, func(i, j int) bool {
		a, b := missing[i], missing[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Row != b.Row {
			return a.Row < b.Row
		}
		return a.FromCol < b.FromCol
	})
	if total == 0 {
		return 100, nil
	}
	return 100 * float64(covered) / float64(total), missing
}

// statement is an outermost range of a file's report.
type statement struct {
	rng     cover.Range
	covered bool
}

// fileCoverage counts one file's statements by row and lists what was not
// covered.
func fileCoverage(file string, fr *cover.FileReport) (covered, total int, missing []Uncovered) {
	var all []statement
	for _, r := range fr.Covered {
		all = append(all, statement{r, true})
	}
	for _, r := range fr.NotCovered {
		all = append(all, statement{r, false})
	}
	// Outermost first: by start, then the longest. A range is inside
	// another exactly when an earlier one ends at or after its end.
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].rng, all[j].rng
		if c := comparePos(a.Start, b.Start); c != 0 {
			return c < 0
		}
		return comparePos(a.End, b.End) > 0
	})
	rows := map[int][]statement{}
	var end cover.Position
	for i, s := range all {
		if i > 0 && comparePos(end, s.rng.End) >= 0 {
			continue
		}
		end = s.rng.End
		for row := s.rng.Start.Row; row <= s.rng.End.Row; row++ {
			rows[row] = append(rows[row], s)
			total++
			if s.covered {
				covered++
			}
		}
	}
	for row, ss := range rows {
		missing = append(missing, uncoveredOn(file, row, ss)...)
	}
	return covered, total, missing
}

func comparePos(a, b cover.Position) int {
	if a.Row != b.Row {
		return a.Row - b.Row
	}
	return a.Col - b.Col
}

// uncoveredOn lists what is not covered on one row: the row, when none of
// its statements is covered, else the column spans of those that are not,
// joining neighbours with no covered statement between them.
func uncoveredOn(file string, row int, ss []statement) []Uncovered {
	anyCovered, anyMissing := false, false
	for _, s := range ss {
		anyCovered = anyCovered || s.covered
		anyMissing = anyMissing || !s.covered
	}
	switch {
	case !anyMissing:
		return nil
	case !anyCovered:
		return []Uncovered{{File: file, Row: row}}
	}
	// Columns on this row: from 1 for a statement that started above, to
	// the end of the line (0) for one that goes on below. Range ends are
	// exclusive.
	from := func(s statement) int {
		if s.rng.Start.Row < row {
			return 1
		}
		return s.rng.Start.Col
	}
	to := func(s statement) int {
		if s.rng.End.Row > row {
			return 0
		}
		return s.rng.End.Col - 1
	}
	sort.Slice(ss, func(i, j int) bool { return from(ss[i]) < from(ss[j]) })
	var out []Uncovered
	joinable := false
	for _, s := range ss {
		if s.covered {
			joinable = false
			continue
		}
		if joinable {
			out[len(out)-1].ToCol = to(s)
			continue
		}
		out = append(out, Uncovered{File: file, Row: row, FromCol: from(s), ToCol: to(s)})
		joinable = true
	}
	return out
}
