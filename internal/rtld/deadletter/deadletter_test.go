package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

func rejection(b *accesslog.Batch, i int, reason string) delivery.Rejection {
	return delivery.Rejection{Batch: b.Select(i), Reason: reason, Err: errors.New(reason + " error text")}
}

func testBatches() (*accesslog.Batch, *accesslog.Batch) {
	withID := &accesslog.Batch{EnvironmentID: "env-1", ReceivedUnixNano: 1763856000123456789, Format: accesslog.FormatJSON,
		AccountNumber: "ACME", AgentID: "agent-7", Datestamp: "20261123", Platform: "delivery", ProfileID: "42", SeqNum: 9,
		Records: []json.RawMessage{json.RawMessage(`{"a":0}`), json.RawMessage("{ \"a\" :\n 1 }"), json.RawMessage(`{"a":2}`)}}
	lines := &accesslog.Batch{EnvironmentID: "env-2", ReceivedUnixNano: 1763856000000000001, Format: accesslog.FormatJSONLines,
		SeqNum: accesslog.NoSeqNum, Records: []json.RawMessage{json.RawMessage(`{"b":0}`), json.RawMessage("{\"b\":\"\xff\"}")}}
	return withID, lines
}

func gauge(t *testing.T, reg *prometheus.Registry, name, sink string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == sink {
					return m.GetGauge().GetValue()
				}
			}
			if sink == "" {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func TestAddWritesSelfDescribingLettersDurably(t *testing.T) {
	dir := filepath.Join(t.TempDir(), DirName)
	if err := os.MkdirAll(filepath.Join(dir, "kafka"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kafka", ".tmp-crashed.json"), []byte("[{"), 0o640); err != nil { // a crash mid-write
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collectors()...)
	if _, err := os.Stat(filepath.Join(dir, "kafka", ".tmp-crashed.json")); !os.IsNotExist(err) {
		t.Fatalf("temporary file left by a crash was not removed: %v", err)
	}
	withID, lines := testBatches()
	if err := s.Add("kafka", []delivery.Rejection{rejection(withID, 1, "message_too_large"), rejection(lines, 1, "message_too_large")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("clickhouse", []delivery.Rejection{rejection(lines, 0, "code_395")}); err != nil {
		t.Fatal(err)
	}
	files, err := s.Files("kafka")
	if err != nil || len(files) != 1 || files[0].Records != 2 {
		t.Fatalf("kafka files %+v, %v", files, err)
	}
	letters, err := ReadLetters(files[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	l := letters[0]
	if l.Sink != "kafka" || l.Reason != "message_too_large" || l.Error != "message_too_large error text" || time.Since(l.Time) > time.Minute ||
		l.EnvironmentID != "env-1" || l.AgentID != "agent-7" || l.ProfileID != "42" || l.Datestamp != "20261123" || l.SeqNum != 9 ||
		l.RecordIndex != 1 || l.AccountNumber != "ACME" || l.Format != "json" || l.ReceivedAt.UnixNano() != withID.ReceivedUnixNano {
		t.Fatalf("letter %+v", l)
	}
	if string(l.Record) != "{ \"a\" :\n 1 }" {
		t.Fatalf("record bytes changed: %q", l.Record)
	}
	if b := l.Batch(); b.RecordIndex(0) != 1 || b.SeqNum != 9 || string(b.Records[0]) != string(withID.Records[1]) || b.ReceivedUnixNano != withID.ReceivedUnixNano {
		t.Fatalf("rebuilt batch %+v", b)
	}
	// Not UTF-8: kept byte for byte in base64; identity by batch hash.
	l = letters[1]
	if string(l.RecordBase64) != "{\"b\":\"\xff\"}" || l.Record != nil || l.BatchHash != lines.ContentHash() || l.SeqNum != accesslog.NoSeqNum {
		t.Fatalf("letter %+v", l)
	}
	if b := l.Batch(); b.ContentHash() != lines.ContentHash() || b.RecordIndex(0) != 1 {
		t.Fatalf("rebuilt batch without identity: hash %s index %d", b.ContentHash(), b.RecordIndex(0))
	}
	// The file is a JSON array a human or jq can read.
	raw, _ := os.ReadFile(files[0].Path)
	if !json.Valid(raw) || !strings.HasPrefix(string(raw), "[\n{") {
		t.Fatalf("file is not a JSON array:\n%s", raw)
	}
	if v := testutil.ToFloat64(s.stored.WithLabelValues("kafka", "message_too_large")); v != 2 {
		t.Errorf("records_total{kafka} = %v", v)
	}
	if v := gauge(t, reg, "edgepipe_rtld_dead_letter_stored_records", "kafka"); v != 2 {
		t.Errorf("stored_records{kafka} = %v", v)
	}
	if v := gauge(t, reg, "edgepipe_rtld_dead_letter_bytes", "clickhouse"); v <= 0 {
		t.Errorf("bytes{clickhouse} = %v", v)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "edgepipe_rtld_dead_letter_dropped_records_total"); err != nil {
		t.Error(err)
	}
}

func TestAddWhenFullDropsAndCounts(t *testing.T) {
	withID, _ := testBatches()
	probe := t.TempDir()
	p, _ := Open(Options{Dir: probe})
	if err := p.Add("kafka", []delivery.Rejection{rejection(withID, 0, "r")}); err != nil {
		t.Fatal(err)
	}
	files, _ := p.Files("kafka")
	one := files[0].Bytes // one letter's file

	s, err := Open(Options{Dir: t.TempDir(), MaxBytes: 2*one + 10})
	if err != nil {
		t.Fatal(err)
	}
	// Two separate adds fit, the third does not.
	for i := 0; i < 3; i++ {
		if err := s.Add("kafka", []delivery.Rejection{rejection(withID, 0, "r")}); err != nil {
			t.Fatalf("Add %d: %v (a full store must not fail the worker)", i, err)
		}
	}
	if v := testutil.ToFloat64(s.dropped.WithLabelValues("kafka", "r")); v != 1 {
		t.Fatalf("dropped = %v, want 1", v)
	}
	if v := testutil.ToFloat64(s.stored.WithLabelValues("kafka", "r")); v != 2 {
		t.Fatalf("stored = %v, want 2", v)
	}
	// Another process (a replay) frees space: the next Add notices.
	files, _ = s.Files("kafka")
	os.Remove(files[0].Path)
	if err := s.Add("kafka", []delivery.Rejection{rejection(withID, 0, "r")}); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(s.stored.WithLabelValues("kafka", "r")); v != 3 {
		t.Fatalf("stored after space was freed = %v, want 3", v)
	}
	// One Add of many: what fits is kept, the rest dropped.
	s2, _ := Open(Options{Dir: t.TempDir(), MaxBytes: 3 * one})
	if err := s2.Add("clickhouse", []delivery.Rejection{rejection(withID, 0, "x"), rejection(withID, 1, "x"), rejection(withID, 2, "x"), rejection(withID, 0, "x")}); err != nil {
		t.Fatal(err)
	}
	kept := testutil.ToFloat64(s2.stored.WithLabelValues("clickhouse", "x"))
	dropped := testutil.ToFloat64(s2.dropped.WithLabelValues("clickhouse", "x"))
	if kept+dropped != 4 || kept < 2 || dropped < 1 {
		t.Fatalf("kept %v, dropped %v of 4", kept, dropped)
	}
}

// refusingSink refuses (exactly) records containing "bad" and records the
// batches it acknowledged.
type refusingSink struct {
	mu   sync.Mutex
	got  []*accesslog.Batch
	down int
}

func (r *refusingSink) Deliver(_ context.Context, bs []*accesslog.Batch) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down > 0 {
		r.down--
		return errors.New("connection refused")
	}
	var bad []delivery.RecordRef
	for i, b := range bs {
		for j, rec := range b.Records {
			if strings.Contains(string(rec), "bad") {
				bad = append(bad, delivery.RecordRef{Batch: i, Record: j})
			} else {
				r.got = append(r.got, b.Select(j))
			}
		}
	}
	if bad != nil {
		return &delivery.RejectedError{Records: bad, Each: true, Reason: "still_bad", Err: errors.New("still refused")}
	}
	return nil
}

func TestReplayDeliversAndKeepsWhatIsRejectedAgain(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	withID, lines := testBatches()
	bad := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSONArray, SeqNum: accesslog.NoSeqNum,
		Records: []json.RawMessage{json.RawMessage(`{"bad":true}`)}}
	if err := s.Add("kafka", []delivery.Rejection{rejection(withID, 2, "message_too_large"), rejection(bad, 0, "message_too_large")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("kafka", []delivery.Rejection{rejection(lines, 0, "message_too_large")}); err != nil {
		t.Fatal(err)
	}
	sink := &refusingSink{down: 2}
	d := &delivery.Deliverer{Sink: sink, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}

	// A second replay of the same sink at once is refused.
	unlock, err := lockReplay(filepath.Join(s.Dir(), "kafka"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Replay(context.Background(), "kafka", d); err == nil || !strings.Contains(err.Error(), "another dead-letter replay") {
		t.Fatalf("concurrent replay: %v", err)
	}
	unlock()

	rep, err := s.Replay(context.Background(), "kafka", d)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 2 || rep.Delivered != 2 || rep.Rejected != 1 {
		t.Fatalf("report %+v", rep)
	}
	if len(sink.got) != 2 || sink.got[0].RecordIndex(0) != 2 || sink.got[0].SeqNum != 9 || sink.got[1].ContentHash() != lines.ContentHash() {
		t.Fatalf("delivered %d records without their identity", len(sink.got))
	}
	files, _ := s.Files("kafka")
	if len(files) != 1 || files[0].Records != 1 {
		t.Fatalf("files after replay: %+v", files)
	}
	letters, _ := ReadLetters(files[0].Path)
	if l := letters[0]; string(l.Record) != `{"bad":true}` || l.Replays != 1 || l.Reason != "still_bad" || l.Error != "still refused" {
		t.Fatalf("letter kept after replay: %+v", l)
	}
	// A replay that cannot reach the sink stops when its context ends and
	// keeps everything.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	sink.down = 1 << 30
	if _, err := s.Replay(ctx, "kafka", d); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("replay against a down sink: %v", err)
	}
	if files, _ := s.Files("kafka"); len(files) != 1 {
		t.Fatalf("files after a failed replay: %+v", files)
	}
}

func TestAddOfManyRecordsWritesSeveralFiles(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rec := json.RawMessage(`{"pad":"` + strings.Repeat("x", 1<<20) + `"}`)
	b := &accesslog.Batch{EnvironmentID: "e", Format: accesslog.FormatJSONArray, SeqNum: accesslog.NoSeqNum}
	for i := 0; i < 40; i++ {
		b.Records = append(b.Records, rec)
	}
	var rejected []delivery.Rejection
	for i := range b.Records {
		rejected = append(rejected, rejection(b, i, "r"))
	}
	if err := s.Add("kafka", rejected); err != nil {
		t.Fatal(err)
	}
	files, _ := s.Files("kafka")
	total := 0
	for _, f := range files {
		letters, err := ReadLetters(f.Path)
		if err != nil || len(letters) != f.Records {
			t.Fatalf("%s: %d letters (name says %d), %v", f.Path, len(letters), f.Records, err)
		}
		if f.Bytes > maxFileBytes+int64(len(rec))+1024 {
			t.Errorf("%s is %d bytes", f.Path, f.Bytes)
		}
		for _, l := range letters {
			if l.RecordIndex != total {
				t.Fatalf("letter %d has record_index %d", total, l.RecordIndex)
			}
			total++
		}
	}
	if len(files) < 3 || total != 40 {
		t.Fatalf("%d files holding %d letters, want ≥3 files and 40", len(files), total)
	}
}

// TestSizeOfConfiguredSinksFromTheStart checks that an empty store reports
// its size, 0, for every sink it was told about, so that dashboards and
// alerts have the series before the first dead letter.
func TestSizeOfConfiguredSinksFromTheStart(t *testing.T) {
	s, err := Open(Options{Dir: filepath.Join(t.TempDir(), DirName), Sinks: []string{"kafka", "clickhouse"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collectors()...)
	want := `# HELP edgepipe_rtld_dead_letter_bytes Bytes in the dead-letter store, by sink.
# TYPE edgepipe_rtld_dead_letter_bytes gauge
edgepipe_rtld_dead_letter_bytes{sink="clickhouse"} 0
edgepipe_rtld_dead_letter_bytes{sink="kafka"} 0
# HELP edgepipe_rtld_dead_letter_stored_records Records in the dead-letter store, by sink.
# TYPE edgepipe_rtld_dead_letter_stored_records gauge
edgepipe_rtld_dead_letter_stored_records{sink="clickhouse"} 0
edgepipe_rtld_dead_letter_stored_records{sink="kafka"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "edgepipe_rtld_dead_letter_bytes", "edgepipe_rtld_dead_letter_stored_records"); err != nil {
		t.Error(err)
	}
}
