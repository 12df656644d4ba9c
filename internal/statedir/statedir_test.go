package statedir

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testID = Identity{Granularity: "FIVE_MINUTES", Organizations: []string{"org-b", "org-a"}, Shard: "0/1"}

func mustOpen(t *testing.T, path string, id Identity) *Dir {
	t.Helper()
	d, err := Open(path, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSaveAndOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	d := mustOpen(t, path, testID)
	if !d.Fresh() || len(d.TakeStates()) != 0 {
		t.Fatal("a new directory is not fresh")
	}
	payload := []byte("payload with\nnewlines\x00and bytes")
	for _, p := range [][]byte{[]byte("first"), payload} {
		if err := d.Save("edge_errors", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Save("origin_usage", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Save("../escape", []byte("x")); err == nil {
		t.Error("saved a dataset name that is a path")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// The same exporter, its organizations listed in another order.
	d = mustOpen(t, path, Identity{Granularity: "FIVE_MINUTES", Organizations: []string{"org-a", "org-b"}, Shard: "1/2"})
	defer d.Close()
	if d.Fresh() {
		t.Error("a directory with states is fresh")
	}
	if got := d.TakeStates(); len(got) != 2 || !bytes.Equal(got["edge_errors"], payload) || len(got["origin_usage"]) != 0 {
		t.Errorf("states %q", got)
	}
	if d.TakeStates() != nil || d.Fresh() {
		t.Error("states kept after they were taken, or the directory became fresh")
	}
	entries, _ := os.ReadDir(path)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), tmpSuffix) {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestLock(t *testing.T) {
	path := t.TempDir()
	d := mustOpen(t, path, testID)
	if _, err := Open(path, testID); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	d.Close()
	mustOpen(t, path, testID).Close()
}

// TestInterruptedSave: a crash while saving leaves a temporary file beside
// the previous state: Open removes it and reads the previous state.
func TestInterruptedSave(t *testing.T) {
	path := t.TempDir()
	d := mustOpen(t, path, testID)
	if err := d.Save("edge_errors", []byte("good")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	tmp := filepath.Join(path, "edge_errors.123"+tmpSuffix)
	if err := os.WriteFile(tmp, []byte(magic+" 1\n{\"dataset\":"), 0o600); err != nil {
		t.Fatal(err)
	}
	d = mustOpen(t, path, testID)
	defer d.Close()
	if got := d.TakeStates()["edge_errors"]; string(got) != "good" {
		t.Errorf("state %q after an interrupted save", got)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("temporary file still there: %v", err)
	}
}

// TestRefused: damaged, unknown and foreign files are refused with an error
// naming the file, and nothing is used.
func TestRefused(t *testing.T) {
	write := func(t *testing.T, id Identity, dataset string, payload []byte) (string, []byte) {
		path := t.TempDir()
		d := mustOpen(t, path, id)
		if err := d.Save(dataset, payload); err != nil {
			t.Fatal(err)
		}
		if err := d.Save("other", []byte("fine")); err != nil {
			t.Fatal(err)
		}
		d.Close()
		file := filepath.Join(path, dataset+Suffix)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return file, b
	}
	for _, tc := range []struct {
		name   string
		id     Identity // of the writer; the reader is testID
		modify func(file string, b []byte) error
		want   string
	}{
		{"flipped payload byte", testID, func(f string, b []byte) error { b[len(b)-3] ^= 1; return os.WriteFile(f, b, 0o600) }, "checksum mismatch"},
		{"truncated", testID, func(f string, b []byte) error { return os.WriteFile(f, b[:len(b)-5], 0o600) }, "bytes of payload"},
		{"not a state file", testID, func(f string, _ []byte) error { return os.WriteFile(f, []byte("hello\n"), 0o600) }, "not an edgepipe exporter state file"},
		{"empty", testID, func(f string, _ []byte) error { return os.WriteFile(f, nil, 0o600) }, "no format line"},
		{"newer format", testID, func(f string, b []byte) error {
			return os.WriteFile(f, bytes.Replace(b, []byte(magic+" 1"), []byte(magic+" 2"), 1), 0o600)
		}, `format "2"`},
		{"damaged header", testID, func(f string, b []byte) error {
			return os.WriteFile(f, bytes.Replace(b, []byte(`"dataset"`), []byte(`"dataset`), 1), 0o600)
		}, "damaged header"},
		{"renamed", testID, func(f string, _ []byte) error {
			return os.Rename(f, filepath.Join(filepath.Dir(f), "origin_errors"+Suffix))
		}, `holds the state of dataset "edge_errors"`},
		{"another granularity", Identity{Granularity: "HOUR", Organizations: []string{"org-a"}}, func(string, []byte) error { return nil }, "granularity HOUR"},
		{"another organization", Identity{Granularity: "FIVE_MINUTES", Organizations: []string{"org-c"}}, func(string, []byte) error { return nil }, "nothing in common"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, b := write(t, tc.id, "edge_errors", []byte("the state of edge_errors"))
			if err := tc.modify(file, b); err != nil {
				t.Fatal(err)
			}
			d, err := Open(filepath.Dir(file), testID)
			if err == nil {
				d.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Dir(file)) {
				t.Fatalf("Open = %v, want ErrRefused naming the file and %q", err, tc.want)
			}
			// The lock was released: the directory is usable once fixed.
			if _, err := Open(filepath.Dir(file), testID); errors.Is(err, ErrLocked) {
				t.Fatal("a refused Open kept the lock")
			}
		})
	}
	// An overlapping selection is the same exporter reconfigured.
	file, _ := write(t, Identity{Granularity: "FIVE_MINUTES", Organizations: []string{"org-a"}, Environments: []string{"env-1"}}, "edge_errors", []byte("x"))
	d, err := Open(filepath.Dir(file), Identity{Granularity: "FIVE_MINUTES", Environments: []string{"env-1", "env-2"}})
	if err != nil {
		t.Fatalf("overlapping selection refused: %v", err)
	}
	d.Close()
}
