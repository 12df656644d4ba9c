package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestClickHouseQueriesOn26 runs the reconciliation's own reads and writes
// on ClickHouse 26.x (chDB, over HTTP) with rows whose answers are known:
//   - counts, access_logs (the modern layout: timestamp DateTime64(6))
//     under FINAL per environment and FIVE_MINUTES bucket in [from, to):
//     microseconds on either side of a bound, a record stored twice (two
//     INSERTs, other insert_version), an environment not asked for;
//   - progress after report, log_delivery_progress under FINAL: each
//     replica's newest row, seconds exact, stopped kept;
//   - writeRows into log_completeness, read back under FINAL: a bucket
//     written again (late records) keeps its newest row.
func TestClickHouseQueriesOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	const db = "reconcile26"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	c := newCHClient(ClickHouseConfig{DSN: srv.DSN(db)}, "rx-0", log)
	t.Cleanup(func() { _ = c.Close() })
	conn, err := c.conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := conn.Version(); !v.AtLeast(26, 1) {
		t.Fatalf("chDB is ClickHouse %s, want 26.x", v)
	}
	spec, err := logtable.TableSpec(conn.Version(), accesslog.Fields(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.conn(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if typ := srv.QueryString(t, "SELECT type FROM system.columns WHERE database = '"+db+"' AND table = 'access_logs' AND name = 'timestamp'"); typ != "DateTime64(6)" {
		t.Fatalf("access_logs.timestamp is %s, want DateTime64(6)", typ)
	}

	from := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	to := from.Add(10 * time.Minute)
	type rec struct {
		env string
		at  time.Duration // after from
		seq int
	}
	recs := []rec{
		{"env-a", -time.Microsecond, 1}, // before from
		{"env-a", 0, 2},
		{"env-a", 5*time.Minute - time.Microsecond, 3}, // the first bucket's last microsecond
		{"env-a", 5 * time.Minute, 4},
		{"env-a", 10*time.Minute - 500*time.Millisecond, 5},
		{"env-a", 10 * time.Minute, 6}, // at to: the next comparison's
		{"env-b", 301 * time.Second, 1},
		{"env-b", 302 * time.Second, 2},
		{"env-b", 303 * time.Second, 3},
		{"env-c", 10 * time.Second, 1}, // not asked for
	}
	insert := func(version int, recs []rec) {
		t.Helper()
		vals := make([]string, len(recs))
		for i, r := range recs {
			vals[i] = fmt.Sprintf("('%s', 'ag', '20261127', %d, '', 0, fromUnixTimestamp64Micro(%d), %d)", r.env, r.seq, from.Add(r.at).UnixMicro(), version)
		}
		srv.Exec(t, "INSERT INTO "+db+".access_logs (environment_id, agent_id, datestamp, seq_num, record_key, record_index, `timestamp`, insert_version) VALUES "+
			strings.Join(vals, ", "))
	}
	insert(1, recs)
	insert(2, []rec{recs[3], recs[7]}) // delivered again: the same records
	if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs"); n != uint64(len(recs)+2) {
		t.Fatalf("%d rows stored, want %d (a second copy of two records)", n, len(recs)+2)
	}
	got, err := c.counts(ctx, []string{"env-a", "env-b"}, from.Unix(), to.Unix())
	if err != nil {
		t.Fatal(err)
	}
	b0, b5 := from.Unix(), from.Add(5*time.Minute).Unix()
	want := map[string]map[int64]int64{"env-a": {b0: 2, b5: 2}, "env-b": {b5: 3}}
	if !maps.EqualFunc(got, want, maps.Equal) {
		t.Errorf("counts = %v, want %v", got, want)
	}

	// Delivery progress: two replicas, the first reporting twice in one
	// second (the version still grows), the second stopped.
	c2 := newCHClient(ClickHouseConfig{DSN: srv.DSN(db)}, "rx-1", log)
	t.Cleanup(func() { _ = c2.Close() })
	now := time.Date(2026, 11, 27, 12, 30, 0, 0, time.UTC)
	for _, r := range []struct {
		c           *chClient
		through, at time.Time
		stopped     bool
	}{
		{c, now.Add(-90 * time.Second), now, false},
		{c, now.Add(-1500 * time.Millisecond), now, false},
		{c2, now.Add(-time.Hour), now.Add(-time.Hour), true},
	} {
		if err := r.c.report(ctx, r.through, r.at, r.stopped); err != nil {
			t.Fatal(err)
		}
	}
	prog, err := c.progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gotProg := map[string]string{}
	for _, p := range prog {
		gotProg[p.replica] = fmt.Sprintf("through %s reported %s stopped %v", p.through.UTC().Format(time.TimeOnly), p.reported.UTC().Format(time.TimeOnly), p.stopped)
	}
	wantProg := map[string]string{
		"rx-0": "through 12:29:58 reported 12:30:01 stopped false",
		"rx-1": "through 11:30:00 reported 11:30:00 stopped true",
	}
	if !maps.Equal(gotProg, wantProg) {
		t.Errorf("progress = %v, want %v", gotProg, wantProg)
	}

	// log_completeness: a bucket written again with late records.
	rows := []completenessRow{
		{env: "env-a", start: b0, expected: 2, records: 2, share: 1, at: now.Unix()},
		{env: "env-a", start: b5, expected: 3, records: 1, share: 1, at: now.Unix()},
		{env: "env-a", start: b5, expected: 3, records: 2, share: 1, at: now.Unix() + 60},
	}
	for i := range rows {
		if err := c.writeRows(ctx, rows[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	var stored []string
	r, err := srv.Conn(t).Query(ctx, "SELECT environment_id, toUInt32(`time`), api_requests, log_records, toUInt32(reconciled_at) FROM "+db+".log_completeness FINAL ORDER BY `time`")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for r.Next() {
		var env string
		var start, at uint32
		var api, logs uint64
		if err := r.Scan(&env, &start, &api, &logs, &at); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, fmt.Sprintf("%s %d %d/%d at %d", env, int64(start)-b0, logs, api, int64(at)-now.Unix()))
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"env-a 0 2/2 at 0", "env-a 300 2/3 at 60"}; strings.Join(stored, "; ") != strings.Join(want, "; ") {
		t.Errorf("log_completeness FINAL = %q, want %q", stored, want)
	}
}
