package clickhouse

import (
	"context"
	"sync"
)

// Writer is the lifecycle of a sink's writer goroutine, the one goroutine
// that writes what the sink queued: Start runs it, Wake tells it there is
// work, and Stop lets it finish within a deadline. The sink keeps its queue
// and its closing flag under its own lock; its writer function returns once
// the sink is closing and nothing is left to write, or once Context ends.
type Writer struct {
	wake chan struct{}
	done chan struct{}
	ctx  context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	started bool
}

// NewWriter returns a writer that is not started.
func NewWriter() *Writer {
	ctx, stop := context.WithCancel(context.Background())
	return &Writer{wake: make(chan struct{}, 1), done: make(chan struct{}), ctx: ctx, stop: stop}
}

// Start runs write in a goroutine of its own; it does nothing when the
// writer was started before.
func (w *Writer) Start(write func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return
	}
	w.started = true
	go func() {
		defer close(w.done)
		write()
	}()
}

// Wake tells the writer to look for work. It never blocks: wakes the
// writer has not seen yet count as one.
func (w *Writer) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Woken receives after Wake.
func (w *Writer) Woken() <-chan struct{} { return w.wake }

// Context ends when Stop gives up waiting for the writer, and once it
// returned; the writer's operations run under it.
func (w *Writer) Context() context.Context { return w.ctx }

// Stop wakes the writer and waits until its function returns or ctx ends,
// then ends Context and waits for the function to return. Mark the sink
// closing first, so that the writer returns once everything is written.
// Stop returns at once when the writer was never started.
func (w *Writer) Stop(ctx context.Context) {
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if !started {
		return
	}
	w.Wake()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.stop()
		<-w.done
	}
	w.stop()
}
