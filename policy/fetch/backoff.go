package fetch

import (
	"math/rand/v2"
	"time"
)

// pollDelay is the wait until the next poll: poll plus up to half again,
// at random, so that the nodes of a fleet spread their polls (as OPA's
// min_delay_seconds and max_delay_seconds do).
func pollDelay(poll time.Duration) time.Duration {
	return poll + time.Duration(rand.Int64N(int64(poll/2)+1))
}

// backoff is the wait after the n-th failed fetch in a row (n >= 1):
// first doubled n-1 times, capped at most, then a random point in its
// upper half, so that nodes that lost the server together do not retry
// together.
func backoff(n int, first, most time.Duration) time.Duration {
	d := first
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
