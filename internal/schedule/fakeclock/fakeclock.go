// Package fakeclock is a manually advanced clock for deterministic tests of
// time-driven code such as the scheduler's poll loops.
package fakeclock

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock is a clock that only moves when Advance or Set is called. It is safe
// for concurrent use. The zero value is not usable; call New.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter
	changed chan struct{} // closed and replaced whenever waiters change
}

type waiter struct {
	until time.Time
	ch    chan struct{}
}

// New returns a clock that reads t until it is advanced.
func New(t time.Time) *Clock {
	return &Clock{now: t, changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep blocks until the clock has been advanced by at least d or ctx is done.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	if d <= 0 {
		c.mu.Unlock()
		return ctx.Err()
	}
	w := &waiter{until: c.now.Add(d), ch: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	c.notifyLocked()
	c.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		c.removeLocked(w)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Advance moves the clock forward by d and wakes every sleeper whose time
// has come, earliest first.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.setLocked(c.now.Add(d))
	c.mu.Unlock()
}

// Set moves the clock to t (which must not be before Now) and wakes sleepers
// as Advance does.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.setLocked(t)
	c.mu.Unlock()
}

func (c *Clock) setLocked(t time.Time) {
	if t.After(c.now) {
		c.now = t
	}
	sort.SliceStable(c.waiters, func(i, j int) bool { return c.waiters[i].until.Before(c.waiters[j].until) })
	keep := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.until.After(c.now) {
			close(w.ch)
			continue
		}
		keep = append(keep, w)
	}
	clear(c.waiters[len(keep):])
	c.waiters = keep
	c.notifyLocked()
}

func (c *Clock) removeLocked(w *waiter) {
	for i, x := range c.waiters {
		if x == w {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			c.notifyLocked()
			return
		}
	}
}

func (c *Clock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Sleepers returns how many goroutines are blocked in Sleep.
func (c *Clock) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// BlockUntil waits until at least n goroutines are blocked in Sleep, or ctx
// is done (then it returns ctx.Err()).
func (c *Clock) BlockUntil(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.waiters) >= n {
			c.mu.Unlock()
			return nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// NextWake returns the earliest time a sleeper waits for, and false when
// nobody sleeps.
func (c *Clock) NextWake() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.waiters) == 0 {
		return time.Time{}, false
	}
	first := c.waiters[0].until
	for _, w := range c.waiters[1:] {
		if w.until.Before(first) {
			first = w.until
		}
	}
	return first, true
}
