package reconcile

import (
	"sync"
	"time"
)

// PlatformTime follows the platform's clock from the Date headers of its
// API answers (spec section 1: when the request was processed). Buckets are
// the platform's, so whether one has ended and settled, and when the
// receiver's profile was seen in which state, are told in its time, not
// this machine's.
//
// It keeps the greatest Date seen and the local time it was seen at: Now is
// that Date plus the local time elapsed since, a lower bound of the
// platform's time (a Date is truncated to the second, and a platform clock
// that runs fast only makes the bound more cautious). Feed it through
// platform.Config.DateObserver. It is safe for concurrent use.
type PlatformTime struct {
	local func() time.Time

	mu     sync.Mutex
	latest time.Time // greatest Date seen
	seenAt time.Time // local time latest was seen
}

// NewPlatformTime returns a PlatformTime over the local clock local
// (time.Now when nil).
func NewPlatformTime(local func() time.Time) *PlatformTime {
	if local == nil {
		local = time.Now
	}
	return &PlatformTime{local: local}
}

// ObserveDate implements platform.DateObserver.
func (c *PlatformTime) ObserveDate(date time.Time, _ time.Duration) {
	now := c.local()
	c.mu.Lock()
	defer c.mu.Unlock()
	if date.After(c.latest) {
		c.latest, c.seenAt = date, now
	}
}

// Floor returns the greatest Date seen: the platform had reached at least
// this time. False before the first answer.
func (c *PlatformTime) Floor() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latest, !c.latest.IsZero()
}

// Now returns the platform's time as far as it is known: the greatest Date
// seen plus the local time elapsed since. False before the first answer.
func (c *PlatformTime) Now() (time.Time, bool) {
	c.mu.Lock()
	latest, seenAt := c.latest, c.seenAt
	c.mu.Unlock()
	if latest.IsZero() {
		return time.Time{}, false
	}
	return latest.Add(max(c.local().Sub(seenAt), 0)), true
}

// Skew returns the platform's time minus the local clock as Now estimates
// it, and false before the first answer.
func (c *PlatformTime) Skew() (time.Duration, bool) {
	now, ok := c.Now()
	if !ok {
		return 0, false
	}
	return now.Sub(c.local()), true
}
