package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestFullDiskRefusesCommitsAndRecovers runs a spool on a real 2 MiB
// tmpfs: appends fail with ErrNoSpace and Full turns true, yet readers go
// on committing (cursors need no new space), their commits delete
// delivered segments, and appends succeed again. Space freed by someone
// else is noticed too. With segments bigger than the disk, the segment
// being written is replaced once every reader passed it.
func TestFullDiskRefusesCommitsAndRecovers(t *testing.T) {
	for _, seg := range []int64{256 << 10, 64 << 20} {
		t.Run(fmt.Sprintf("segments of %d KiB", seg>>10), func(t *testing.T) { testFullDisk(t, seg) })
	}
}

func testFullDisk(t *testing.T, segmentBytes int64) {
	dir := testenv.TmpFS(t, 2<<20)
	s, err := Open(Options{Dir: filepath.Join(dir, "spool"), SegmentBytes: segmentBytes, Readers: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	payload := make([]byte, 60<<10)
	n := 0
	for ; n < 100; n++ {
		err = s.Append(ctx, payload)
		if err != nil {
			break
		}
	}
	if !errors.Is(err, ErrNoSpace) || n < 10 {
		t.Fatalf("after %d appends: %v, want ErrNoSpace", n, err)
	}
	if !s.Full() || !s.Stats().NoSpace {
		t.Fatal("Full is false on a full disk")
	}
	if err := s.Append(ctx, []byte("x")); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("append while full: %v", err)
	}
	// Readers deliver and commit on the full disk; the last commit
	// frees the segments.
	for _, name := range []string{"a", "b"} {
		r, _ := s.Reader(name)
		got := readAll(t, r)
		if len(got) != n {
			t.Fatalf("reader %s read %d of %d entries", name, len(got), n)
		}
		for _, e := range got {
			if err := r.Commit(e.Next); err != nil {
				t.Fatalf("commit on a full disk: %v", err)
			}
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for s.Full() {
		if time.Now().After(deadline) {
			t.Fatalf("still full 3s after every reader passed everything (stats %+v)", s.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Append(ctx, payload); err != nil {
		t.Fatalf("append after delivery freed space: %v", err)
	}

	// Someone else fills the disk, then frees it.
	junk := filepath.Join(dir, "junk")
	f, err := os.Create(junk)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	f.Close()
	for i := 0; ; i++ {
		if err := s.Append(ctx, payload); errors.Is(err, ErrNoSpace) {
			break
		} else if err != nil || i > 100 {
			t.Fatalf("append on a disk filled by another file: %v", err)
		}
	}
	os.Remove(junk)
	deadline = time.Now().Add(5 * time.Second)
	for s.Full() {
		if time.Now().After(deadline) {
			t.Fatal("still full 5s after the space came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := s.Append(ctx, payload); err != nil {
		t.Fatalf("append after the space came back: %v", err)
	}
}
