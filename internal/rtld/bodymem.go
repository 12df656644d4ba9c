package rtld

import (
	"context"
	"errors"
	"math/bits"
	"sync"
	"time"
)

// errNoMemory is returned when a request's body does not fit the memory
// budget within the brief wait; ingest answers 503 with Retry-After.
var errNoMemory = errors.New("ingest memory budget exhausted")

// minBufferClass is log2 of the smallest buffer bodyMemory hands out (64
// KiB: the chunk a body is received in).
const minBufferClass = 16

// bodyMemory hands out the buffers request bodies are received and
// decompressed into, within a byte budget (--ingest.max-memory-bytes).
// Buffers come in a few sizes (classes) and are kept for reuse when given
// back; kept buffers still count against the budget and are dropped when
// a request needs their room. So the memory of bodies in flight never
// exceeds the budget, and steady traffic reuses the same buffers instead
// of making garbage for the collector.
type bodyMemory struct {
	limit int64

	mu      sync.Mutex
	used    int64            // bytes of buffers handed out or kept
	idle    map[int][][]byte // kept buffers by class
	freed   chan struct{}    // closed and replaced whenever room may have appeared
	inUse   int64            // bytes handed out, for the metric
	biggest int              // largest class ever handed out
}

func newBodyMemory(limit int64) *bodyMemory {
	return &bodyMemory{limit: limit, idle: map[int][][]byte{}, freed: make(chan struct{})}
}

// Buffer classes step by a quarter of a power of two from 64 KiB up, so a
// buffer is at most a quarter bigger than asked for.
func classSize(c int) int64 {
	k := c/4 + minBufferClass
	return int64(1)<<k + int64(c%4)*(int64(1)<<k)/4
}

// classOf returns the smallest class holding n bytes.
func classOf(n int64) int {
	if n <= 1<<minBufferClass {
		return 0
	}
	k := bits.Len64(uint64(n-1)) - 1 // 2^k < n <= 2^(k+1)
	step := int64(1) << k / 4
	sub := int((n - int64(1)<<k + step - 1) / step)
	return (k-minBufferClass)*4 + sub
}

// get returns a buffer of length 0 and capacity at least n. When the
// budget is exhausted it waits up to wait (or until ctx ends) for another
// request to give memory back, then fails with errNoMemory.
func (m *bodyMemory) get(ctx context.Context, n int64, wait time.Duration) ([]byte, error) {
	c := classOf(n)
	size := classSize(c)
	if size > m.limit {
		return nil, errNoMemory
	}
	var deadline <-chan time.Time
	for {
		m.mu.Lock()
		if free := m.idle[c]; len(free) > 0 {
			buf := free[len(free)-1]
			free[len(free)-1] = nil
			m.idle[c] = free[:len(free)-1]
			m.inUse += size
			m.mu.Unlock()
			return buf[:0], nil
		}
		// Drop kept buffers of other sizes to make room.
		for k := m.biggest; m.used+size > m.limit && k >= 0; k-- {
			for free := m.idle[k]; len(free) > 0 && m.used+size > m.limit; free = m.idle[k] {
				free[len(free)-1] = nil // garbage now, not held by the list
				m.idle[k] = free[:len(free)-1]
				m.used -= classSize(k)
			}
		}
		if m.used+size <= m.limit {
			m.used += size
			m.inUse += size
			m.biggest = max(m.biggest, c)
			m.mu.Unlock()
			return make([]byte, 0, size), nil
		}
		freed := m.freed
		m.mu.Unlock()
		if deadline == nil {
			if wait <= 0 {
				return nil, errNoMemory
			}
			t := time.NewTimer(wait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-freed:
		case <-deadline:
			return nil, errNoMemory
		case <-ctx.Done():
			return nil, errNoMemory
		}
	}
}

// put gives a buffer from get back for reuse.
func (m *bodyMemory) put(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	c := classOf(int64(cap(buf)))
	m.mu.Lock()
	m.idle[c] = append(m.idle[c], buf[:0])
	m.inUse -= classSize(c)
	close(m.freed)
	m.freed = make(chan struct{})
	m.mu.Unlock()
}

// inFlight returns the bytes of buffers handed out and not given back.
func (m *bodyMemory) inFlight() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inUse
}
