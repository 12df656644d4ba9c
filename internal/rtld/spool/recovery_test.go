package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// placed is where an entry sits on disk.
type placed struct {
	path     string
	from, to int64
	index    uint64
	data     string
}

// layout lists every entry of the spool in dir, in index order, as written
// (read before any damage is done).
func layout(t testing.TB, dir string) []placed {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sort.Strings(paths)
	var out []placed
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		sf := segmentFile{r: f, version: formatVersion, start: segHeaderSize}
		for off := int64(segHeaderSize); off < st.Size(); {
			fr, err := sf.readFrame(off, st.Size(), 0, readOpts{alloc: true})
			if err != nil {
				t.Fatalf("layout of %s at %d: %v", p, off, err)
			}
			out = append(out, placed{p, off, fr.end, fr.index, string(fr.data)})
			off = fr.end
		}
		f.Close()
	}
	return out
}

func fill(t testing.TB, s *Spool, n int, format string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := s.Append(context.Background(), []byte(fmt.Sprintf(format, i))); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll reads every entry from the reader's position to the end of the
// log.
func readAll(t testing.TB, r *Reader) []Entry {
	t.Helper()
	var out []Entry
	for !caughtUp(r) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		e, err := r.Next(ctx, 1000, 1<<30)
		cancel()
		// Next may skip damage at the end and then wait for more.
		if err != nil && !(errors.Is(err, context.DeadlineExceeded) && caughtUp(r)) {
			t.Fatalf("reading from %+v: %v", r.read, err)
		}
		out = append(out, e...)
	}
	return out
}

// caughtUp reports whether no entry is left after the reader's position.
func caughtUp(r *Reader) bool {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	for _, seg := range r.s.segments {
		switch {
		case seg.first == r.read.Segment && r.read.Offset < seg.size:
			return false
		case seg.first > r.read.Segment && seg.size > seg.start():
			return false
		}
	}
	return true
}

func writeAt(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func corruptFiles(_ testing.TB, dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "*.corrupt"))
	return m
}

// TestCorruptionIsQuarantinedNotTakenForATornTail damages entries in
// several ways and places (not only at the tail of the newest segment) and
// checks that recovery delivers every other entry, keeps the damaged bytes
// in a .corrupt file, counts them, and that a restart neither loses more
// nor counts the same damage again.
func TestCorruptionIsQuarantinedNotTakenForATornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		// damage harms the spool and returns the indexes it destroyed.
		damage func(t *testing.T, l []placed) []uint64
	}{
		{"flipped payload byte in the first segment", func(t *testing.T, l []placed) []uint64 {
			e := l[3]
			flipByte(t, e.path, (e.from+e.to)/2)
			return []uint64{e.index}
		}},
		{"length field of an entry in the first segment", func(t *testing.T, l []placed) []uint64 {
			e := l[5]
			writeAt(t, e.path, e.from+4, []byte{0xff, 0xff, 0xff, 0x0f})
			return []uint64{e.index}
		}},
		{"zeroed run across two entries", func(t *testing.T, l []placed) []uint64 {
			e := l[10]
			writeAt(t, e.path, e.to-5, make([]byte, 10))
			return []uint64{l[10].index, l[11].index}
		}},
		{"segment header of a middle segment", func(t *testing.T, l []placed) []uint64 {
			flipByte(t, l[40].path, 3)
			return nil
		}},
		{"middle of the newest segment", func(t *testing.T, l []placed) []uint64 {
			e := l[len(l)-3]
			flipByte(t, e.path, e.from+entryHeaderLen+1)
			return []uint64{e.index}
		}},
		{"end of an older segment cut off", func(t *testing.T, l []placed) []uint64 {
			// The last two entries of the first segment.
			var last int
			for i, e := range l {
				if e.path == l[0].path {
					last = i
				}
			}
			if err := os.Truncate(l[0].path, l[last-1].from+7); err != nil {
				t.Fatal(err)
			}
			return []uint64{l[last-1].index, l[last].index}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"a"}})
			fill(t, s, 100, "acknowledged batch %03d with some payload")
			s.Close()
			l := layout(t, dir)
			if len(l) != 100 || l[0].path == l[len(l)-1].path {
				t.Fatalf("layout: %d entries, want 100 over several segments", len(l))
			}
			lost := map[uint64]bool{}
			for _, i := range tc.damage(t, l) {
				lost[i] = true
			}

			s2 := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"a"}})
			r, _ := s2.Reader("a")
			got := readAll(t, r)
			want := 100 - len(lost)
			if len(got) != want {
				t.Fatalf("delivered %d entries, want %d", len(got), want)
			}
			for _, e := range got {
				if lost[e.Index] || string(e.Data) != l[e.Index].data {
					t.Fatalf("entry %d = %q, want %q (lost %v)", e.Index, e.Data, l[e.Index].data, lost[e.Index])
				}
			}
			st := s2.Stats()
			if len(corruptFiles(t, dir)) == 0 || st.CorruptBytes <= 0 || st.CorruptEntries != int64(len(lost)) {
				t.Fatalf("quarantine files %v, corrupt bytes %d, entries %d (want %d)", corruptFiles(t, dir), st.CorruptBytes, st.CorruptEntries, len(lost))
			}
			// Appends go on after the damage.
			if err := s2.Append(context.Background(), []byte("after")); err != nil {
				t.Fatal(err)
			}
			if e := readAll(t, r); len(e) != 1 || string(e[0].Data) != "after" || e[0].Index != 100 {
				t.Fatalf("after recovery: %v", e)
			}
			s2.Close()

			// A restart skips the same damage without counting it again.
			s3 := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"b"}})
			rb, _ := s3.Reader("b")
			if got := readAll(t, rb); len(got) != want+1 {
				t.Fatalf("after a restart: %d entries, want %d", len(got), want+1)
			}
			if st := s3.Stats(); st.CorruptBytes != 0 {
				t.Fatalf("known damage counted again: %d bytes", st.CorruptBytes)
			}
		})
	}
}

func TestTornTailOfTheNewestSegmentIsCut(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"a"}})
	fill(t, s, 30, "entry %02d")
	s.Close()
	l := layout(t, dir)
	last := l[len(l)-1]
	// A write torn by a crash: a partial entry, then nothing.
	if err := os.Truncate(last.path, last.to-3); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"a"}})
	r, _ := s2.Reader("a")
	if got := readAll(t, r); len(got) != 29 {
		t.Fatalf("%d entries after a torn tail, want 29", len(got))
	}
	if st, _ := os.Stat(last.path); st.Size() != last.from {
		t.Fatalf("newest segment is %d bytes, want it cut to %d", st.Size(), last.from)
	}
	if c := corruptFiles(t, dir); len(c) != 0 || s2.Stats().CorruptBytes != 0 {
		t.Fatalf("a torn tail counted as corruption: %v", c)
	}
	if err := s2.Append(context.Background(), []byte("next")); err != nil {
		t.Fatal(err)
	}
	if e := readAll(t, r); len(e) != 1 || e[0].Index != 29 {
		t.Fatalf("append after the cut: %v", e)
	}
}

// TestReaderQuarantinesDamageFoundWhileRunning: bytes that rot after Open
// are found by the reader, skipped and counted once for all readers.
func TestReaderQuarantinesDamageFoundWhileRunning(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 2000, Readers: []string{"a", "b"}})
	fill(t, s, 40, "entry %02d xxxxxxxxxxxxxxxxxxxxxxxxxx")
	l := layout(t, dir)
	flipByte(t, l[7].path, l[7].from+entryHeaderLen+2)
	for _, name := range []string{"a", "b"} {
		r, _ := s.Reader(name)
		got := readAll(t, r)
		if len(got) != 39 {
			t.Fatalf("reader %s: %d entries, want 39", name, len(got))
		}
		for _, e := range got {
			if e.Index == 7 {
				t.Fatalf("reader %s got the damaged entry", name)
			}
		}
	}
	if st := s.Stats(); st.CorruptEntries != 1 || st.CorruptBytes != l[7].to-l[7].from || len(corruptFiles(t, dir)) != 1 {
		t.Fatalf("stats %+v, quarantine %v", st, corruptFiles(t, dir))
	}
	q, _ := os.ReadFile(corruptFiles(t, dir)[0])
	if int64(len(q)) != l[7].to-l[7].from || !strings.Contains(string(q), "xxxx") {
		t.Fatalf("quarantine file holds %q", q)
	}
}

func TestOpenRefusesASizeBoundThatCannotWork(t *testing.T) {
	_, err := Open(Options{Dir: t.TempDir(), MaxBytes: 45 << 20, SegmentBytes: 64 << 20, MaxEntryBytes: 32 << 20})
	if err == nil || !strings.Contains(err.Error(), "cannot work") {
		t.Fatalf("45 MiB bound with 64 MiB segments: %v", err)
	}
	// Derived segments make a small bound work when entries fit.
	s, err := Open(Options{Dir: t.TempDir(), MaxBytes: 45 << 20, MaxEntryBytes: 8 << 20, noSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.opts.SegmentBytes != SegmentBytesFor(45<<20) || s.opts.SegmentBytes > 45<<20/8 {
		t.Fatalf("segment bytes %d", s.opts.SegmentBytes)
	}
}

// TestSmallSpoolNeverWedges: a spool whose readers keep up accepts entries
// forever, however small its bound (the wedge of a bound below a segment).
func TestSmallSpoolNeverWedges(t *testing.T) {
	const entry = 100 << 10
	maxBytes := MinMaxBytes(SegmentBytesFor(4<<20), entry)
	s := open(t, t.TempDir(), Options{MaxBytes: maxBytes, MaxEntryBytes: entry, Readers: []string{"a", "b"}})
	ra, _ := s.Reader("a")
	rb, _ := s.Reader("b")
	payload := make([]byte, entry)
	for i := 0; i < 200; i++ {
		if err := s.Append(context.Background(), payload); err != nil {
			t.Fatalf("append %d with every reader caught up: %v (stats %+v)", i, err, s.Stats())
		}
		for _, r := range []*Reader{ra, rb} {
			e := readAll(t, r)
			if err := r.Commit(e[len(e)-1].Next); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := s.Stats(); st.Bytes > maxBytes {
		t.Fatalf("spool holds %d bytes, bound %d", st.Bytes, maxBytes)
	}
}

// TestFormatV1SpoolIsReadAfterUpgrade opens a spool written by the
// previous release (testdata/v1: 20 entries in 3 segments; reader a had
// committed 7 of them, reader b none) and checks nothing acknowledged is
// lost: both readers resume where they were, new entries go to a segment
// of the current format, and the legacy cursor is converted.
func TestFormatV1SpoolIsReadAfterUpgrade(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, "testdata/v1", dir)
	s := open(t, dir, Options{SegmentBytes: 300, Readers: []string{"a", "b"}})
	fill(t, s, 3, "new-entry-%d")
	ra, _ := s.Reader("a")
	rb, _ := s.Reader("b")
	a, b := readAll(t, ra), readAll(t, rb)
	if len(a) != 16 || a[0].Index != 7 || len(b) != 23 || b[0].Index != 0 {
		t.Fatalf("reader a got %d entries from %d, b %d", len(a), a[0].Index, len(b))
	}
	for i, e := range b {
		want := fmt.Sprintf("v1-entry-%03d-payload", i)
		if i >= 20 {
			want = fmt.Sprintf("new-entry-%d", i-20)
		}
		if e.Index != uint64(i) || string(e.Data) != want {
			t.Fatalf("entry %d: index %d %q, want %q", i, e.Index, e.Data, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "cursor-a.json")); !os.IsNotExist(err) {
		t.Fatalf("legacy cursor still there: %v", err)
	}
	if err := ra.Commit(a[len(a)-1].Next); err != nil {
		t.Fatal(err)
	}
	if err := rb.Commit(b[len(b)-1].Next); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Every legacy segment was delivered and deleted; the new one has a
	// header.
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) != 1 || filepath.Base(segs[0]) != "00000000000000000020.seg" {
		t.Fatalf("segments after delivery: %v", segs)
	}
	h := make([]byte, segHeaderSize)
	f, err := os.Open(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadFull(f, h)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if first, v, ok := segmentHeader(h); !ok || first != 20 || v != formatVersion {
		t.Fatalf("new segment header: first %d version %d ok %v", first, v, ok)
	}
}

func TestFormatV1CorruptionQuarantinesTheRestOfTheSegment(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, "testdata/v1", dir)
	// Entry 2 of the first legacy segment (36 bytes per entry).
	flipByte(t, filepath.Join(dir, "00000000000000000000.seg"), 2*36+20)
	s := open(t, dir, Options{SegmentBytes: 300, Readers: []string{"b"}})
	rb, _ := s.Reader("b")
	got := readAll(t, rb)
	// Entries 2-7 are behind damage a legacy segment cannot resync past.
	if len(got) != 14 || got[1].Index != 1 || got[2].Index != 8 {
		t.Fatalf("%d entries, then index %d", len(got), got[2].Index)
	}
	if st := s.Stats(); st.CorruptEntries != 6 || len(corruptFiles(t, dir)) != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func copyDir(t testing.TB, from, to string) {
	t.Helper()
	des, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(from, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, de.Name()), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNextPrefixesChecksWholeEntries: a reader of prefixes gets the first
// bytes of each entry, and damage beyond the prefix still counts.
func TestNextPrefixesChecksWholeEntries(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{Readers: []string{"a", "b"}})
	big := strings.Repeat("0123456789", 300_000) // 3 MB
	fill(t, s, 3, "%d"+big)
	ra, _ := s.Reader("a")
	e, err := ra.NextPrefixes(context.Background(), 10, 100)
	if err != nil || len(e) != 3 {
		t.Fatalf("%d entries, %v", len(e), err)
	}
	for i, en := range e {
		if string(en.Data) != strconv.Itoa(i)+big[:99] {
			t.Fatalf("entry %d prefix %q", i, en.Data[:20])
		}
	}
	l := layout(t, dir)
	flipByte(t, l[1].path, l[1].to-100) // far beyond the prefix
	rb, _ := s.Reader("b")
	e, err = rb.NextPrefixes(context.Background(), 10, 100)
	if err != nil || len(e) != 2 || e[0].Index != 0 || e[1].Index != 2 {
		t.Fatalf("after damage past the prefix: %d entries %v", len(e), err)
	}
	if s.Stats().CorruptEntries != 1 {
		t.Fatalf("damage past the prefix not counted: %+v", s.Stats())
	}
}

// TestNextStopsBeforePassingMaxBytes: a group grows past maxBytes only by
// its first entry.
func TestNextStopsBeforePassingMaxBytes(t *testing.T) {
	s := open(t, t.TempDir(), Options{SegmentBytes: 10 << 10, Readers: []string{"a"}})
	for _, n := range []int{3000, 3000, 3000, 5000, 1000} { // across segments too
		if err := s.Append(context.Background(), make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := s.Reader("a")
	var sizes [][]int
	for len(sizes) < 10 && !caughtUp(r) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		e, err := r.Next(ctx, 100, 7000)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var g []int
		for _, en := range e {
			g = append(g, len(en.Data))
		}
		sizes = append(sizes, g)
		// 7000 bytes per read: 3000+3000, 3000, 5000+1000.
	}
	if fmt.Sprint(sizes) != "[[3000 3000] [3000] [5000 1000]]" {
		t.Fatalf("groups %v", sizes)
	}
}
