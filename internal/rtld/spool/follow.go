package spool

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Follow hands each batch of entries next returns to handle, in order,
// until ctx ends or the spool is closed, and calls checkpoint every
// interval and once more before it then returns nil. Any other error of
// next ends Follow with that error, without a last checkpoint.
//
// next is a reader's Next or NextPrefixes with the caller's limits. It runs
// in a goroutine of Follow's own, which Follow stops and waits for before
// it returns; handle and checkpoint run in the caller's goroutine, never
// at the same time.
func Follow(ctx context.Context, next func(context.Context) ([]Entry, error), interval time.Duration,
	handle func([]Entry), checkpoint func()) error {
	entries := make(chan []Entry)
	readErr := make(chan error, 1)
	readCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		readErr <- pump(readCtx, next, entries)
	}()
	defer func() { cancel(); wg.Wait() }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case es := <-entries:
			handle(es)
		case <-tick.C:
			checkpoint()
		case err := <-readErr:
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				checkpoint()
				return nil
			}
			return err
		}
	}
}

// pump sends what next reads to entries until next fails or ctx ends, and
// returns why it stopped.
func pump(ctx context.Context, next func(context.Context) ([]Entry, error), entries chan<- []Entry) error {
	for {
		es, err := next(ctx)
		if err != nil {
			return err
		}
		select {
		case entries <- es:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
