package statefile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReopenAndGrow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	f, got, err := Open(path, Options{Capacity: 100})
	if err != nil || got != nil {
		t.Fatalf("new file: %q %v", got, err)
	}
	for i := 0; i < 5; i++ {
		if err := f.Write([]byte(fmt.Sprintf("content %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := os.Stat(path)
	size := st.Size()
	f.Close()
	f, got, err = Open(path, Options{Capacity: 100})
	if err != nil || string(got) != "content 4" {
		t.Fatalf("reopened: %q %v", got, err)
	}
	// Updates that fit never change the file's size (no new space needed).
	for i := 0; i < 10; i++ {
		if err := f.Write(bytes.Repeat([]byte{'x'}, 50+i)); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := os.Stat(path); st.Size() != size {
		t.Fatalf("file grew from %d to %d bytes for content that fits", size, st.Size())
	}
	big := bytes.Repeat([]byte("big"), 1000)
	if err := f.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(append(big, '!')); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, got, _ = Open(path, Options{}); !bytes.Equal(got, append(big, '!')) {
		t.Fatalf("after growing: %d bytes", len(got))
	}
}

func TestTornSlotKeepsThePreviousContent(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(path string, slot int64)
		want string
	}{
		{"newest slot torn", func(path string, slot int64) { flip(t, path, slot+headerSize+1) }, "first"},
		{"older slot torn", func(path string, _ int64) { flip(t, path, 5) }, "second"},
		{"both torn", func(path string, slot int64) { flip(t, path, 5); flip(t, path, slot+5) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state")
			f, _, err := Open(path, Options{Capacity: 64})
			if err != nil {
				t.Fatal(err)
			}
			// Sequence 1 (empty) is in slot 1; "first" is 2 (slot 0),
			// "second" 3 (slot 1).
			if err := f.Write([]byte("first")); err != nil {
				t.Fatal(err)
			}
			if err := f.Write([]byte("second")); err != nil {
				t.Fatal(err)
			}
			slot := f.slot
			f.Close()
			tc.tear(path, slot)
			f, got, err := Open(path, Options{})
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q (%v), want %q", got, err, tc.want)
			}
			// Updating after damage works and is what Open finds next.
			if err := f.Write([]byte("third")); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if _, got, _ := Open(path, Options{}); string(got) != "third" {
				t.Fatalf("after repair: %q", got)
			}
		})
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestDamaged: a file created, or reopened before any write, is empty but
// not damaged; one with both slots damaged, or too short to be a state
// file, is.
func TestDamaged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		harm    func(path string, slot int64)
		damaged bool
	}{
		{"never written", func(string, int64) {}, false},
		{"one slot torn", func(path string, _ int64) { flip(t, path, 5) }, false},
		{"both slots torn", func(path string, slot int64) { flip(t, path, 5); flip(t, path, slot+5) }, true},
		{"cut short", func(path string, _ int64) {
			if err := os.Truncate(path, 10); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state")
			f, _, err := Open(path, Options{Capacity: 64})
			if err != nil {
				t.Fatal(err)
			}
			if f.Damaged() {
				t.Fatal("a file just created is damaged")
			}
			slot := f.slot
			f.Close()
			tc.harm(path, slot)
			f, got, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if got != nil || f.Damaged() != tc.damaged {
				t.Errorf("content %q, damaged %v; want none, damaged %v", got, f.Damaged(), tc.damaged)
			}
		})
	}
}
