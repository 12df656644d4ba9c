package rtld

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBufferClasses(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		size int64
	}{
		{1, 64 << 10}, {64 << 10, 64 << 10}, {64<<10 + 1, 80 << 10}, {100 << 10, 112 << 10},
		{128 << 10, 128 << 10}, {3 << 20, 3 << 20}, {3<<20 + 1, 3<<20 + 512<<10}, {32<<20 + 1, 40 << 20},
	} {
		c := classOf(tc.n)
		if classSize(c) != tc.size || (c > 0 && classSize(c-1) >= tc.n) {
			t.Errorf("classOf(%d) = %d of %d bytes, want %d bytes (the smallest class holding it)", tc.n, c, classSize(c), tc.size)
		}
	}
}

func TestBodyMemoryStaysWithinItsBudget(t *testing.T) {
	ctx := context.Background()
	m := newBodyMemory(10 << 20)
	a, err := m.get(ctx, 4<<20, 0)
	if err != nil || cap(a) != 4<<20 {
		t.Fatalf("get 4 MiB: cap %d, %v", cap(a), err)
	}
	b, err := m.get(ctx, 5<<20, 0)
	if err != nil || m.inFlight() != 9<<20 {
		t.Fatalf("get 5 MiB: %v, in flight %d", err, m.inFlight())
	}
	if _, err := m.get(ctx, 2<<20, 0); !errors.Is(err, errNoMemory) {
		t.Fatalf("beyond the budget without waiting: %v", err)
	}
	// A waiting request gets the memory given back meanwhile.
	go func() {
		time.Sleep(50 * time.Millisecond)
		m.put(a)
	}()
	c, err := m.get(ctx, 2<<20, time.Second)
	if err != nil {
		t.Fatalf("waiting for memory: %v", err)
	}
	// The 4 MiB buffer was kept, then dropped to make room for 2 MiB.
	m.put(b)
	m.put(c)
	if m.inFlight() != 0 || m.used > m.limit {
		t.Fatalf("in flight %d, used %d of %d", m.inFlight(), m.used, m.limit)
	}
	// Kept buffers are reused.
	d, _ := m.get(ctx, 5<<20, 0)
	if &d[:1][0] != &b[:1][0] {
		t.Fatal("a kept buffer of the right size was not reused")
	}
	if _, err := m.get(ctx, 11<<20, time.Second); !errors.Is(err, errNoMemory) {
		t.Fatalf("a buffer bigger than the budget: %v", err)
	}
}
