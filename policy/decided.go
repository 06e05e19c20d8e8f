package policy

import (
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// decisionCache remembers the distinct decision values a policy has
// returned and what they decoded to. Processes of one class mostly get
// the same value, and recognising it (its hash is kept by the value, then
// one comparison) costs less than checking it against the schema and
// decoding it again. It holds at most maxDecided values: a policy that
// builds a different decision for every process (a reason naming the pid)
// simply stops gaining from it. Safe for concurrent use.
type decisionCache struct {
	entries atomic.Pointer[[]decided]
}

type decided struct {
	v ast.Value
	d Decision
}

const maxDecided = 64

func (c *decisionCache) get(v ast.Value) (Decision, bool) {
	es := c.entries.Load()
	if es == nil {
		return Decision{}, false
	}
	h := v.Hash()
	for i := range *es {
		e := &(*es)[i]
		if e.v.Hash() == h && e.v.Compare(v) == 0 {
			return e.d, true
		}
	}
	return Decision{}, false
}

// put adds a value that passed the schema; when full, or when another
// goroutine adds at the same time, the value is just not kept.
func (c *decisionCache) put(v ast.Value, d Decision) {
	old := c.entries.Load()
	var es []decided
	if old != nil {
		if len(*old) >= maxDecided {
			return
		}
		es = append(make([]decided, 0, len(*old)+1), *old...)
	}
	es = append(es, decided{v, d})
	c.entries.CompareAndSwap(old, &es)
}
