package fakeclock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleepersWakeInOrderAndOnCancel(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(t0)
	ctx := context.Background()
	woke := make(chan time.Duration, 3)
	for _, d := range []time.Duration{3 * time.Second, time.Second} {
		go func() {
			if err := c.Sleep(ctx, d); err == nil {
				woke <- d
			}
		}()
	}
	cctx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error)
	go func() { cancelled <- c.Sleep(cctx, time.Hour) }()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := c.BlockUntil(wctx, 3); err != nil {
		t.Fatal(err)
	}
	if next, ok := c.NextWake(); !ok || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next wake %s %v", next, ok)
	}
	c.Advance(2 * time.Second)
	if d := <-woke; d != time.Second {
		t.Fatalf("woke %v first", d)
	}
	if c.Sleepers() != 2 {
		t.Fatalf("%d sleepers after the first woke, want 2", c.Sleepers())
	}
	c.Set(t0.Add(3 * time.Second))
	if d := <-woke; d != 3*time.Second {
		t.Fatalf("woke %v", d)
	}
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep returned %v", err)
	}
	if c.Sleepers() != 0 || !c.Now().Equal(t0.Add(3*time.Second)) {
		t.Fatalf("sleepers %d now %s", c.Sleepers(), c.Now())
	}
}
