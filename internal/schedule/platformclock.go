package schedule

import (
	"context"
	"slices"
	"sync"
	"time"
)

// dateSamples is how many recent Date samples the skew estimate is the
// median of: one wrong Date (a proxy's, a cached answer's) cannot move it,
// while a real change of the platform's clock is followed after three.
const dateSamples = 5

// PlatformClock is the scheduler's clock when the platform's clock is the
// one that counts: which buckets have ended, how far a high-water mark may
// move and when polls are due are decided in the platform's time, not this
// machine's. It learns the platform's time from the Date header of the
// API's answers (spec section 1: the time the request was processed), fed
// in through ObserveDate (it implements platform.DateObserver), and applies
// the skew to the local clock: Now returns local time plus the median of the
// recent skew samples. Until the first answer it is the local clock.
//
// Its state is a handful of samples, kept in memory only: after a restart
// the first answer re-learns the skew. It is safe for concurrent use.
type PlatformClock struct {
	local Clock

	mu      sync.Mutex
	samples []time.Duration // ring of recent skews, platform − local
	next    int
	skew    time.Duration // median of samples
	known   bool
	// latest is the Date of the most recent answer: the platform had
	// reached at least this time when it answered.
	latest time.Time
}

// NewPlatformClock returns a PlatformClock on top of local (RealClock when
// nil), which it sleeps with and falls back to.
func NewPlatformClock(local Clock) *PlatformClock {
	if local == nil {
		local = RealClock{}
	}
	return &PlatformClock{local: local, samples: make([]time.Duration, 0, dateSamples)}
}

// ObserveDate records one answer's Date header and how long the exchange
// took. The platform processed the request somewhere in the round trip and
// its Date is truncated to the second, so the sample is Date + 0.5 s against
// the local time in the middle of the round trip.
func (c *PlatformClock) ObserveDate(date time.Time, roundTrip time.Duration) {
	now := c.local.Now()
	skew := date.Add(500 * time.Millisecond).Sub(now.Add(-roundTrip / 2))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.samples) < dateSamples {
		c.samples = append(c.samples, skew)
	} else {
		c.samples[c.next] = skew
		c.next = (c.next + 1) % dateSamples
	}
	sorted := slices.Clone(c.samples)
	slices.Sort(sorted)
	c.skew = sorted[len(sorted)/2]
	c.known = true
	c.latest = date
}

// Now returns the platform's current time as estimated: the local time plus
// the skew (the local time before the first answer).
func (c *PlatformClock) Now() time.Time {
	c.mu.Lock()
	skew := c.skew
	c.mu.Unlock()
	return c.local.Now().Add(skew)
}

// Sleep waits for d on the local clock.
func (c *PlatformClock) Sleep(ctx context.Context, d time.Duration) error {
	return c.local.Sleep(ctx, d)
}

// Skew returns the platform's clock minus the local clock (the smoothed
// estimate), and false before the first answer.
func (c *PlatformClock) Skew() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.skew, c.known
}

// Latest returns the Date of the most recent answer, and false before the
// first: the platform had reached at least this time. A bucket that ends
// after it may still be in progress on the platform, whatever Now says.
func (c *PlatformClock) Latest() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latest, c.known
}
