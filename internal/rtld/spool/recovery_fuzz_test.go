package spool

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// FuzzRecovery damages a spool directory (flipped bytes, overwritten runs,
// truncated files, anywhere in any segment) and checks that recovery never
// fails or panics, never hands out bytes that were not appended, and never
// loses an entry whose bytes are intact.
func FuzzRecovery(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 100, 7})
	f.Add([]byte{1, 1, 0, 0, 1, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 3, 200, 1, 2, 0, 0, 0, 40, 0})
	f.Add([]byte{0, 3, 0, 0, 0, 20, 1, 1, 3, 0, 0, 2, 0, 0, 2, 2, 0, 0, 0, 9, 0xfe})
	f.Fuzz(func(t *testing.T, ops []byte) {
		dir := t.TempDir()
		s, err := Open(Options{Dir: dir, SegmentBytes: 1500, Readers: []string{"a"}, noSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 60; i++ {
			// Sizes vary so entries straddle any given offset differently.
			payload := fmt.Sprintf("entry %02d %s", i, strings.Repeat("x", i%23))
			if err := s.Append(context.Background(), []byte(payload)); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		l := layout(t, dir)
		paths, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
		sort.Strings(paths)

		// Apply the damage: groups of 7 bytes [kind][file][offset u32][value].
		changed := map[string][][2]int64{} // file -> damaged [from, to)
		cut := map[string]int64{}
		for ; len(ops) >= 7; ops = ops[7:] {
			path := paths[int(ops[1])%len(paths)]
			st, err := os.Stat(path)
			if err != nil || st.Size() == 0 {
				continue
			}
			off := int64(binary.LittleEndian.Uint32(ops[2:6])) % st.Size()
			v := ops[6]
			switch ops[0] % 3 {
			case 0:
				flipByte(t, path, off)
				changed[path] = append(changed[path], [2]int64{off, off + 1})
			case 1:
				if err := os.Truncate(path, off); err != nil {
					t.Fatal(err)
				}
				if c, ok := cut[path]; !ok || off < c {
					cut[path] = off
				}
			case 2:
				n := min(int64(v%16)+1, st.Size()-off)
				run := make([]byte, n)
				for i := range run {
					run[i] = v
				}
				writeAt(t, path, off, run)
				changed[path] = append(changed[path], [2]int64{off, off + n})
			}
		}
		intact := func(e placed) bool {
			if c, ok := cut[e.path]; ok && e.to > c {
				return false
			}
			for _, r := range changed[e.path] {
				if r[0] < e.to && r[1] > e.from {
					return false
				}
			}
			return true
		}

		s2, err := Open(Options{Dir: dir, SegmentBytes: 1500, Readers: []string{"a"}, noSync: true})
		if err != nil {
			t.Fatalf("recovery failed: %v", err)
		}
		defer s2.Close()
		r, _ := s2.Reader("a")
		got := map[uint64]bool{}
		var prev uint64
		for i, e := range readAll(t, r) {
			if e.Index >= uint64(len(l)) || string(e.Data) != l[e.Index].data {
				t.Fatalf("entry %d: %q was never appended there", e.Index, e.Data)
			}
			if i > 0 && e.Index <= prev {
				t.Fatalf("entry %d after %d", e.Index, prev)
			}
			prev = e.Index
			got[e.Index] = true
		}
		for _, e := range l {
			if intact(e) && !got[e.index] {
				t.Fatalf("intact entry %d (%s %d-%d) lost; damage %v cut %v", e.index, filepath.Base(e.path), e.from, e.to, changed, cut)
			}
		}
		// The recovered spool takes appends and hands them out.
		if err := s2.Append(context.Background(), []byte("after")); err != nil {
			t.Fatal(err)
		}
		if e := readAll(t, r); len(e) != 1 || string(e[0].Data) != "after" {
			t.Fatalf("append after recovery: %v", e)
		}
	})
}
