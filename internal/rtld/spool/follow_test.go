package spool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestFollowHandsEveryBatchAndCheckpointsAtTheEnd follows a real spool's
// reader: every entry appended reaches handle in order, and the end (the
// context's, or the spool's close) makes a last checkpoint and returns nil,
// while any other read error is returned without one.
func TestFollowHandsEveryBatchAndCheckpointsAtTheEnd(t *testing.T) {
	errBroken := errors.New("broken")
	for _, tc := range []struct {
		name            string
		stop            func(cancel context.CancelFunc, s *Spool)
		readErr         error // returned by next once the entries are read
		wantErr         error
		wantCheckpoints int // at the end (the interval is too long to tick)
	}{
		{name: "context ends", stop: func(cancel context.CancelFunc, _ *Spool) { cancel() }, wantCheckpoints: 1},
		{name: "spool closed", stop: func(_ context.CancelFunc, s *Spool) { s.Close() }, wantCheckpoints: 1},
		{name: "read error", readErr: errBroken, wantErr: errBroken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, t.TempDir(), Options{})
			for _, p := range []string{"one", "two", "three"} {
				if err := s.Append(context.Background(), []byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			r, err := s.Reader("a")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var got []string
			checkpoints := 0
			read := 0 // entries next returned, in Follow's goroutine
			next := func(ctx context.Context) ([]Entry, error) {
				if read == 3 && tc.readErr != nil {
					return nil, tc.readErr
				}
				es, err := r.Next(ctx, 1, 1<<20)
				read += len(es)
				return es, err
			}
			handle := func(es []Entry) {
				for _, e := range es {
					got = append(got, string(e.Data))
				}
				if len(got) == 3 && tc.stop != nil {
					tc.stop(cancel, s)
				}
			}
			err = Follow(ctx, next, time.Hour, handle, func() { checkpoints++ })
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Follow = %v, want %v", err, tc.wantErr)
			}
			if len(got) != 3 || got[0] != "one" || got[1] != "two" || got[2] != "three" {
				t.Errorf("handled %q, want one, two, three", got)
			}
			if checkpoints != tc.wantCheckpoints {
				t.Errorf("%d checkpoints, want %d", checkpoints, tc.wantCheckpoints)
			}
		})
	}
}

// TestFollowCheckpointsEveryInterval checks the periodic checkpoint while
// nothing is appended.
func TestFollowCheckpointsEveryInterval(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	r, err := s.Reader("a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	checkpoints := 0
	next := func(ctx context.Context) ([]Entry, error) { return r.Next(ctx, 1, 1<<20) }
	err = Follow(ctx, next, time.Millisecond, func([]Entry) {}, func() {
		if checkpoints++; checkpoints == 3 {
			cancel()
		}
	})
	if err != nil || checkpoints < 4 { // three ticks, then the last one
		t.Fatalf("Follow = %v after %d checkpoints, want nil after at least 4", err, checkpoints)
	}
}
