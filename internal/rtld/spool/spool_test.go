package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func open(t *testing.T, dir string, opts Options) *Spool {
	t.Helper()
	opts.Dir = dir
	opts.noSync = true
	if opts.Readers == nil {
		opts.Readers = []string{"a", "b"}
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func next(t *testing.T, r *Reader, n int) []Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e, err := r.Next(ctx, n, 1<<30)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return e
}

func TestAppendReadCommitAcrossSegmentsAndRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 200})
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := s.Append(ctx, []byte(fmt.Sprintf("entry-%02d-%s", i, "xxxxxxxxxxxxxxxxxxxx"))); err != nil {
			t.Fatal(err)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) < 3 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	ra, _ := s.Reader("a")
	var got []string
	for len(got) < 20 {
		for _, e := range next(t, ra, 3) {
			if e.Index != uint64(len(got)) {
				t.Fatalf("entry index %d, want %d", e.Index, len(got))
			}
			got = append(got, string(e.Data))
			if err := ra.Commit(e.Next); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got[7] != "entry-07-xxxxxxxxxxxxxxxxxxxx" {
		t.Fatalf("entry 7 = %q", got[7])
	}
	// Reader b has not moved: nothing may be deleted.
	if after, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(after) != len(segs) {
		t.Fatalf("segments deleted while reader b lags: %d -> %d", len(segs), len(after))
	}
	rb, _ := s.Reader("b")
	e := next(t, rb, 12)
	if err := rb.Commit(e[len(e)-1].Next); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Readers["b"].Entries != 8 || st.Readers["a"].Entries != 0 || st.Entries != 8 {
		t.Fatalf("stats %+v", st)
	}
	if st.OldestTime.IsZero() {
		t.Fatal("oldest time unknown with a backlog")
	}
	after, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(after) >= len(segs) {
		t.Fatalf("no segment deleted after both readers passed: %d", len(after))
	}
	s.Close()

	// Restart: b resumes at entry 12, a is at the end.
	s2 := open(t, dir, Options{SegmentBytes: 200})
	rb2, _ := s2.Reader("b")
	e = next(t, rb2, 100)
	if e[0].Index != 12 || len(e) == 0 {
		t.Fatalf("b resumed at %d", e[0].Index)
	}
	if err := s2.Append(ctx, []byte("after-restart")); err != nil {
		t.Fatal(err)
	}
	ra2, _ := s2.Reader("a")
	e = next(t, ra2, 100)
	if len(e) != 1 || string(e[0].Data) != "after-restart" || e[0].Index != 20 {
		t.Fatalf("a after restart got %d entries, first %q index %d", len(e), e[0].Data, e[0].Index)
	}
}

func TestRecoveryCutsTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(t *testing.T, path string)
	}{
		{"partial entry", func(t *testing.T, path string) {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()-3); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage header", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write([]byte{0xff, 0xff, 0xff, 0x7f, 1, 2, 3}); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"flipped byte", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{'#'}, st.Size()-1); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{})
			for _, d := range []string{"one", "two", "three"} {
				if err := s.Append(context.Background(), []byte(d)); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			tc.tear(t, segPath(dir, 0))
			s2 := open(t, dir, Options{})
			r, _ := s2.Reader("a")
			e := next(t, r, 10)
			wantN := 3
			if tc.name != "garbage header" {
				wantN = 2
			}
			if len(e) != wantN {
				t.Fatalf("recovered %d entries, want %d", len(e), wantN)
			}
			// Appending after recovery continues cleanly.
			if err := s2.Append(context.Background(), []byte("four")); err != nil {
				t.Fatal(err)
			}
			e = next(t, r, 10)
			if len(e) != 1 || string(e[0].Data) != "four" {
				t.Fatalf("after recovery got %v", e)
			}
		})
	}
}

func TestFullRejectsWithoutWritingAndRecovers(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{MaxBytes: 1000, SegmentBytes: 300, Readers: []string{"a"}})
	ctx := context.Background()
	// 100 bytes on disk with the entry's header and trailer; 2 entries
	// and a segment header per segment: 8 entries fill 928 of 1000 bytes.
	payload := make([]byte, 100-entryOverhead)
	n := 0
	for {
		err := s.Append(ctx, payload)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if n > 20 {
			t.Fatal("spool never filled up")
		}
	}
	if n != 8 || !s.Full() {
		t.Fatalf("accepted %d entries (full=%v), want 8", n, s.Full())
	}
	if st := s.Stats(); st.Bytes > 1000 {
		t.Fatalf("spool holds %d bytes, bound 1000", st.Bytes)
	}
	r, _ := s.Reader("a")
	e := next(t, r, 100)
	if len(e) != n {
		t.Fatalf("read %d of %d entries", len(e), n)
	}
	if err := r.Commit(e[len(e)-1].Next); err != nil {
		t.Fatal(err)
	}
	if s.Full() {
		t.Fatal("still full after the reader passed every segment")
	}
	if err := s.Append(ctx, payload); err != nil {
		t.Fatalf("append after draining: %v", err)
	}
}

func TestConcurrentAppendsShareFsyncAndKeepEverything(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 4096, Readers: []string{"a"}})
	var wg sync.WaitGroup
	const writers, each = 16, 50
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := s.Append(context.Background(), []byte(fmt.Sprintf("%d/%d", w, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r, _ := s.Reader("a")
	seen := map[string]bool{}
	for len(seen) < writers*each {
		for _, e := range next(t, r, 1000) {
			if seen[string(e.Data)] {
				t.Fatalf("duplicate %s", e.Data)
			}
			seen[string(e.Data)] = true
		}
	}
}

func TestNextWaitsForAppend(t *testing.T) {
	s := open(t, t.TempDir(), Options{Readers: []string{"a"}})
	r, _ := s.Reader("a")
	got := make(chan []Entry, 1)
	go func() {
		e, _ := r.Next(context.Background(), 10, 1<<20)
		got <- e
	}()
	time.Sleep(20 * time.Millisecond)
	if err := s.Append(context.Background(), []byte("late")); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if len(e) != 1 || string(e[0].Data) != "late" {
			t.Fatalf("got %v", e)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Next did not wake up")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Next(ctx, 10, 1<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next on a cancelled context: %v", err)
	}
}

func TestOldestPendingFollowsOneReadersCommits(t *testing.T) {
	s := open(t, t.TempDir(), Options{SegmentBytes: 200})
	ctx := context.Background()
	if _, ok := s.OldestPending("a"); ok {
		t.Fatal("an empty spool has an entry pending")
	}
	before := time.Now()
	for i := 0; i < 6; i++ {
		if err := s.Append(ctx, []byte(fmt.Sprintf("entry-%02d-xxxxxxxxxxxxxxxxxxxx", i))); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()
	at, ok := s.OldestPending("a")
	if !ok || at.Before(before.Add(-time.Second)) || at.After(after) {
		t.Fatalf("OldestPending(a) = %v, %v; want a time between %v and %v", at, ok, before, after)
	}
	ra, _ := s.Reader("a")
	es := next(t, ra, 6)
	if err := ra.Commit(es[2].Next); err != nil {
		t.Fatal(err)
	}
	if mid, ok := s.OldestPending("a"); !ok || mid.Before(at) {
		t.Fatalf("after committing 3 of 6: OldestPending(a) = %v, %v; want one at or after %v", mid, ok, at)
	}
	if err := ra.Commit(es[len(es)-1].Next); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.OldestPending("a"); ok {
		t.Fatal("reader a committed everything, yet an entry is pending")
	}
	if _, ok := s.OldestPending("b"); !ok {
		t.Fatal("reader b committed nothing, yet nothing is pending for it")
	}
	if _, ok := s.OldestPending("nobody"); ok {
		t.Fatal("an unknown reader has entries pending")
	}
}
