package workload

// gen is the generator of a key's service times (a BE cycle's, an LC
// request's): SplitMix64 (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014), whose state is a counter
// and whose output is mix of it. It passes BigCrush, its state is one
// word (a mark keeps it in 8 bytes), and consecutive outputs do not
// depend on one another, so a batch of them is computed side by side
// (drawInto); PCG, which it replaced, cost about 5 ns a draw through
// rand.Rand, a third of a log-normal draw.
type gen struct{ s uint64 }

// genGamma is the counter's increment: the odd integer nearest 2^64/φ.
const genGamma = 0x9e3779b97f4a7c15

// seed starts the generator at a state derived from two words, so that
// every (a, b) pair starts a stream of its own.
func (g *gen) seed(a, b uint64) { g.s = mix(a ^ mix(b+genGamma)) }

// Uint64 returns the next 64 uniform bits.
func (g *gen) Uint64() uint64 {
	g.s += genGamma
	return mix(g.s)
}
