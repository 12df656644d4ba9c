package reconcile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// batch is a json batch of env from agent with seq_num seq holding records
// at the given Unix seconds.
func batch(env, agent string, seq int64, secs ...int64) *accesslog.Batch {
	b := &accesslog.Batch{EnvironmentID: env, Format: accesslog.FormatJSON, AgentID: agent, Datestamp: "20261123", ProfileID: "7", SeqNum: seq}
	for i, s := range secs {
		b.Records = append(b.Records, []byte(fmt.Sprintf(`{"uuid":"%s-%d-%d","timestamp":%d.%06d,"status_code":200}`, agent, seq, i, s, i)))
	}
	return b
}

func records(s *store, env string, start int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.envs[env].buckets[start]; b != nil {
		return b.Records
	}
	return 0
}

// TestStoreCountsEachBatchOnceAcrossRestarts counts batches, a batch spooled
// twice, a batch without identity, a record without a timestamp and one of
// an environment not served; it saves, reopens (a restart), and replays the
// spool from before the save, as after a crash between save and commit.
func TestStoreCountsEachBatchOnceAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	const b0 = int64(1795600200) // a bucket start (multiple of 300)
	s, lost, err := openStore(dir, []string{"env-a", "env-b"})
	if err != nil || lost {
		t.Fatalf("open: %v, lost %v", err, lost)
	}
	now := time.Unix(b0, 0)
	entries := []*accesslog.Batch{
		batch("env-a", "ag1", 0, b0+1, b0+2, b0+299),
		batch("env-a", "ag1", 1, b0+300),
		batch("env-a", "ag1", 0, b0+1, b0+2, b0+299), // spooled twice
		batch("env-b", "ag1", 0, b0+5),               // another environment, same agent name
		batch("env-c", "ag9", 0, b0+5),               // not served
	}
	noID := batch("env-a", "", -1, b0+10)
	noID.Format = accesslog.FormatJSONLines
	entries = append(entries, noID)
	untimed := batch("env-a", "ag2", 0)
	untimed.Records = append(untimed.Records, []byte(`{"uuid":"x"}`), []byte(`{"timestamp":"1795600201.5"}`))
	entries = append(entries, untimed)
	for i, b := range entries {
		s.countBatch(uint64(i), b, now)
	}
	check := func(s *store, when string) {
		t.Helper()
		if got := records(s, "env-a", b0); got != 5 {
			t.Errorf("%s: env-a bucket 0 has %d records, want 5 (3 + 1 without identity + 1 string timestamp)", when, got)
		}
		if got := records(s, "env-a", b0+300); got != 1 {
			t.Errorf("%s: env-a bucket 1 has %d records, want 1", when, got)
		}
		if got := records(s, "env-b", b0); got != 1 {
			t.Errorf("%s: env-b has %d records, want 1", when, got)
		}
		if _, ok := s.envs["env-c"]; ok {
			t.Errorf("%s: an environment not served is kept", when)
		}
	}
	check(s, "counted")
	if s.untimed != 1 {
		t.Errorf("untimed %d, want 1", s.untimed)
	}
	saved, err := s.save()
	if err != nil || saved != uint64(len(entries)) {
		t.Fatalf("save: %d, %v", saved, err)
	}
	s.Close()

	s, lost, err = openStore(dir, []string{"env-a", "env-b"})
	if err != nil || lost {
		t.Fatalf("reopen: %v, lost %v", err, lost)
	}
	defer s.Close()
	// The spool's reader committed less than the state covers: the same
	// entries come again, and a resend of batch 1 as a new entry.
	for i, b := range entries {
		s.countBatch(uint64(i), b, now)
	}
	if _, gap := s.countBatch(uint64(len(entries)), batch("env-a", "ag1", 1, b0+300), now); gap {
		t.Error("a gap reported for the next index")
	}
	check(s, "after the restart and replay")
	if _, gap := s.countBatch(uint64(len(entries)+3), batch("env-a", "ag1", 2, b0+301), now); !gap {
		t.Error("entries skipped by the spool (damaged) not reported as a gap")
	}
}

// TestStoreDamagedStateIsLost: a state file whose slots are both damaged
// opens empty and says its counts are lost; a missing one is a fresh
// start, and so is one never saved to (a replica killed before its first
// save, or one that does not compare and never saves).
func TestStoreDamagedStateIsLost(t *testing.T) {
	dir := t.TempDir()
	for _, when := range []string{"fresh", "reopened before the first save"} {
		s, lost, err := openStore(dir, []string{"env-a"})
		if err != nil || lost {
			t.Fatalf("%s: %v, lost %v", when, err, lost)
		}
		s.Close()
	}
	s, _, err := openStore(dir, []string{"env-a"})
	if err != nil {
		t.Fatal(err)
	}
	s.countBatch(0, batch("env-a", "ag", 0, 1795600201), time.Now())
	if _, err := s.save(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, StateFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{0x5a}, int(fi.Size())), 0o600); err != nil {
		t.Fatal(err)
	}
	s, lost, err := openStore(dir, []string{"env-a"})
	if err != nil || !lost {
		t.Fatalf("damaged: %v, lost %v; want lost", err, lost)
	}
	defer s.Close()
	if got := records(s, "env-a", 1795600200); got != 0 {
		t.Errorf("%d records after the damage", got)
	}
}

func TestParseSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1523916295.768957", 1523916295, true},
		{`"1523916295.999999"`, 1523916295, true},
		{"1523916295", 1523916295, true},
		{"1.523916295e9", 1523916295, true},
		{"-1.5", -2, true},
		{`"n/a"`, 0, false},
		{"null", 0, false},
		{"+5", 0, false},
	} {
		got, ok := parseSeconds([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseSeconds(%s) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := recordTime([]byte(`{"a":{"timestamp":5},"b":"timestamp"}`)); ok {
		t.Error("a nested timestamp taken for the record's")
	}
	if !strings.Contains(StateFile, "reconcile") {
		t.Error("state file name")
	}
}
