package irvm

import (
	"maps"
	"slices"
)

// flow is what the compiler knows, at one statement of a function, of
// the values at input and data paths that its locals hold. It serves two
// ends: lookups of a path known to be in a local share a cache slot
// (must), and the part of the input a program can see is what is read of
// the paths its locals may hold (may).
//
// A lookup with a constant key in a local known to hold a path stores the
// value at the extended path; any other write replaces what the local
// held. Where ways through the code join (after a nested block that may
// have been cut short, around a loop body, between a function's blocks),
// a local is known only if no way wrote it, and may hold whatever any way
// left in it.
type flow struct {
	must map[int]int   // the local holds the value at this path
	may  map[int][]int // the local may hold the value at one of these paths
}

func newFlow() flow { return flow{must: map[int]int{}, may: map[int][]int{}} }

func (f flow) clone() flow {
	may := make(map[int][]int, len(f.may))
	for l, ids := range f.may {
		may[l] = slices.Clone(ids)
	}
	return flow{must: maps.Clone(f.must), may: may}
}

// join adds what writes logged elsewhere may have left: those locals are
// no longer known, and may also hold what was written to them.
func (f flow) join(written writeLog) {
	for l, ids := range written {
		delete(f.must, l)
		f.may[l] = union(f.may[l], ids)
	}
}

// writeLog records, for each local written in a stretch of code, every
// path a write there may have stored in it (none for a value that is not
// at a path).
type writeLog map[int][]int

func (w writeLog) add(other writeLog) {
	for l, ids := range other {
		w[l] = union(w[l], ids)
	}
}

func union(a, b []int) []int {
	for _, x := range b {
		if !slices.Contains(a, x) {
			a = append(a, x)
		}
	}
	if a == nil {
		a = []int{} // logged, even with no path: the local was written
	}
	return a
}

// assign records a write of local l: the value at path id (-1: a value at
// no known path).
func (c *compiler) assign(l, id int) {
	var ids []int
	if id >= 0 {
		c.flow.must[l] = id
		ids = []int{id}
	} else {
		delete(c.flow.must, l)
	}
	c.flow.may[l] = ids
	for _, w := range c.logs {
		w[l] = union(w[l], ids)
	}
}

// logged compiles with a fresh write log and returns what it recorded;
// enclosing logs record the writes too.
func (c *compiler) logged(compile func() error) (writeLog, error) {
	w := writeLog{}
	c.logs = append(c.logs, w)
	err := compile()
	c.logs = c.logs[:len(c.logs)-1]
	return w, err
}

// read records a use of local l as a whole value: whatever input path it
// holds, or may hold, must be in the input whole.
func (c *compiler) read(l int) {
	if id, ok := c.flow.must[l]; ok {
		c.whole(id)
		return
	}
	for _, id := range c.flow.may[l] {
		c.whole(id)
	}
}

func (c *compiler) whole(id int) {
	c.wholeRead[id] = true
	if n := c.need(id); n != nil {
		n.Whole = true
	}
}

// keyed records lookups by run-time keys in the value at path id: an
// input built for the program must carry all of it, but a source is asked
// field by field.
func (c *compiler) keyed(id int) {
	if n := c.need(id); n != nil {
		n.Whole = true
	}
}
