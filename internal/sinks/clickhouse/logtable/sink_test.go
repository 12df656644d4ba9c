package logtable

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestParseTimestamp(t *testing.T) {
	for _, tc := range []struct {
		in  string
		sec int64
		us  uint32
		ok  bool
	}{
		{"1523916295.768957", 1523916295, 768957, true},
		{"1523916295.7", 1523916295, 700000, true},
		{"1523916295", 1523916295, 0, true},
		{`"1523916295.5"`, 1523916295, 500000, true},
		{"1.523916295768957e9", 1523916295, 768957, true},
		{"1523916295.1234567", 1523916295, 123456, true},
		{"5000000000.5", 5000000000, 500000, true},
		{"-5", -5, 0, true},
		{"-5.25", -6, 750000, true},
		{"-2.5e0", -3, 500000, true},
		{`"yesterday"`, 0, 0, false},
		{"--5", 0, 0, false},
		{"+5", 0, 0, false},
		{"1e300", 0, 0, false},
	} {
		sec, us, ok := parseTimestamp(tc.in)
		if sec != tc.sec || ok != tc.ok || (ok && absDiff(us, tc.us) > 1) {
			t.Errorf("parseTimestamp(%s) = %d, %d, %v; want %d, %d, %v", tc.in, sec, us, ok, tc.sec, tc.us, tc.ok)
		}
	}
}

func absDiff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}

func record(i int, extra string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"timestamp":1763856000.%06d,"uuid":"u-%d","status_code":%d,"total_time":0.25,"host":"h\"x","req_hdr_x_test":"v","environment_id":"env-1"%s}`, i, i, 200+i%3, extra))
}

func TestAccessLogsExactlyOnceUnderFinal(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	now := time.Now().UnixNano()
	withID := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSON, AgentID: "agent-1", Datestamp: "20261123", SeqNum: 4, ProfileID: "7", ReceivedUnixNano: now}
	for i := 0; i < 5; i++ {
		withID.Records = append(withID.Records, record(i, ""))
	}
	lines := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum, ReceivedUnixNano: now,
		Records: []json.RawMessage{record(100, ""), record(101, ""), json.RawMessage(`{"status_code":"oops","a":1}`), json.RawMessage(`{"status_code":"oops","a":1}`)}}
	for attempt := 0; attempt < 3; attempt++ {
		// Deliver, then redeliver (a retry after a crash, a platform retry).
		if err := sink.Deliver(ctx, []*accesslog.Batch{withID, lines}); err != nil {
			t.Fatalf("Deliver attempt %d: %v", attempt, err)
		}
	}
	conn := srv.Conn(t)
	var total, final, uuids uint64
	q := func(sql string, dst ...any) {
		t.Helper()
		if err := conn.QueryRow(ctx, sql).Scan(dst...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	q("SELECT count() FROM `"+db+"`.access_logs", &total)
	q("SELECT count() FROM `"+db+"`.access_logs FINAL", &final)
	q("SELECT uniqExact(uuid) FROM `"+db+"`.access_logs FINAL WHERE uuid != ''", &uuids)
	if total != 27 || final != 9 || uuids != 7 {
		t.Fatalf("rows: %d in total, %d under FINAL, %d uuids; want 27, 9, 7", total, final, uuids)
	}
	var status int64
	var host, extra string
	var ts time.Time
	var us uint32
	q("SELECT status_code, host, extra, timestamp, timestamp_us FROM `"+db+"`.access_logs FINAL WHERE uuid = 'u-2'", &status, &host, &extra, &ts, &us)
	if status != 202 || host != `h"x` || extra != `{"req_hdr_x_test":"v"}` || ts.Unix() != 1763856000 || us != 2 {
		t.Fatalf("typed row: status %d host %q extra %q ts %v us %d", status, host, extra, ts, us)
	}
	q("SELECT extra FROM `"+db+"`.access_logs FINAL WHERE uuid = '' LIMIT 1", &extra)
	if extra != `{"a":1,"status_code":"oops"}` {
		t.Fatalf("mistyped value not kept in extra: %q", extra)
	}

	// A second sink (a restart) finds the table and adds a new field's column.
	sink2 := newSink(t, Config{DSN: srv.DSN(db), Fields: append(accesslog.Fields(), accesslog.Field{Code: "new_field", Type: accesslog.TypeInteger})})
	t.Cleanup(func() { sink2.Close() })
	b := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSON, AgentID: "agent-1", Datestamp: "20261123", SeqNum: 5, ReceivedUnixNano: now,
		Records: []json.RawMessage{json.RawMessage(`{"uuid":"n","new_field":42}`)}}
	if err := sink2.Deliver(ctx, []*accesslog.Batch{b}); err != nil {
		t.Fatalf("Deliver with a new column: %v", err)
	}
	var nf int64
	q("SELECT new_field FROM `"+db+"`.access_logs FINAL WHERE uuid = 'n'", &nf)
	if nf != 42 {
		t.Fatalf("new_field = %d", nf)
	}
}

func TestSplitBatches(t *testing.T) {
	mk := func(sizes ...int) []*accesslog.Batch {
		var out []*accesslog.Batch
		for _, n := range sizes {
			out = append(out, &accesslog.Batch{Records: make([]json.RawMessage, n)})
		}
		return out
	}
	for _, tc := range []struct {
		sizes []int
		n     int
		want  []int // batches per group
	}{
		{[]int{500, 500, 500, 500}, 2, []int{2, 2}},
		{[]int{500, 500, 500, 500}, 1, []int{4}},
		{[]int{10, 10}, 2, []int{2}}, // too small to split
		{[]int{3000}, 4, []int{1}},
		{[]int{1000, 1000, 1000}, 2, []int{2, 1}},
	} {
		groups := splitBatches(mk(tc.sizes...), tc.n)
		var got []int
		total := 0
		for _, g := range groups {
			got = append(got, len(g))
			total += len(g)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || total != len(tc.sizes) {
			t.Errorf("splitBatches(%v, %d) = %v, want %v", tc.sizes, tc.n, got, tc.want)
		}
	}
}

func TestBuildColumnsValues(t *testing.T) {
	fields := []accesslog.Field{
		{Code: "host", Type: accesslog.TypeString},
		{Code: "status_code", Type: accesslog.TypeInteger},
		{Code: "total_time", Type: accesslog.TypeFloat},
		{Code: "timestamp", Type: accesslog.TypeTimestamp},
	}
	cols, err := accessColumns(clickhouse.Version{}, fields, nil) // no DateTime64: timestamp_us column
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		record string
		host   string
		status int64
		total  float64
		sec    int64
		us     uint32
		extra  string
	}{
		{"plain", `{"host":"a.example","status_code":200,"total_time":0.5,"timestamp":1763856000.000002}`, "a.example", 200, 0.5, 1763856000, 2, ""},
		{"escaped string", `{"host":"a\"b\u00e9"}`, `a"bé`, 0, 0, 0, 0, ""},
		{"empty string", `{"host":""}`, "", 0, 0, 0, 0, ""},
		{"number in a string column", `{"host":42}`, "42", 0, 0, 0, 0, ""},
		{"object in a string column", `{"host":{"a":1}}`, "", 0, 0, 0, 0, `{"host":{"a":1}}`},
		{"quoted number", `{"status_code":"404","total_time":"1.5"}`, "", 404, 1.5, 0, 0, ""},
		{"mistyped number", `{"status_code":"oops"}`, "", 0, 0, 0, 0, `{"status_code":"oops"}`},
		{"integer beyond Int64", `{"status_code":9223372036854775808}`, "", 0, 0, 0, 0, `{"status_code":9223372036854775808}`},
		{"integer with a fraction", `{"status_code":200.5}`, "", 0, 0, 0, 0, `{"status_code":200.5}`},
		{"integral float", `{"status_code":2e2}`, "", 200, 0, 0, 0, ""},
		{"timestamp beyond DateTime", `{"timestamp":5000000000.5}`, "", 0, 0, 0, 0, `{"timestamp":5000000000.5}`},
		{"timestamp 2^32", `{"timestamp":4294967296}`, "", 0, 0, 0, 0, `{"timestamp":4294967296}`},
		{"timestamp 2^32-1", `{"timestamp":4294967295}`, "", 0, 0, 4294967295, 0, ""},
		{"negative timestamp", `{"timestamp":-5}`, "", 0, 0, 0, 0, `{"timestamp":-5}`},
		{"null", `{"host":null,"status_code":null}`, "", 0, 0, 0, 0, ""},
		{"repeated key: last wins", `{"status_code":1,"host":"x","status_code":2}`, "x", 2, 0, 0, 0, ""},
		{"escaped key", `{"ho\u0073t":"y"}`, "y", 0, 0, 0, 0, ""},
		{"unknown and custom fields", `{"zz":[1],"req_hdr_a":"v","environment_id":"env"}`, "", 0, 0, 0, 0, `{"req_hdr_a":"v","zz":[1]}`},
		{"other environment_id kept", `{"environment_id":"other"}`, "", 0, 0, 0, 0, `{"environment_id":"other"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Two records per batch: the second one must not inherit the
			// first one's values (the extra map and flags are reused).
			b := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum,
				Records: []json.RawMessage{json.RawMessage(tc.record), json.RawMessage(`{}`)}}
			d := buildColumns([]*accesslog.Batch{b}, cols, 7)
			if d.rows != 2 {
				t.Fatalf("rows = %d", d.rows)
			}
			host := d.fields[0].(*stringColumn).vals
			status := d.fields[1].(*numberColumn[int64]).vals
			total := d.fields[2].(*numberColumn[float64]).vals
			ts := d.fields[3].(*timeColumn)
			got := fmt.Sprint(host[0], status[0], total[0], ts.vals[0].Unix(), ts.fracs[0], d.extra[0])
			want := fmt.Sprint(tc.host, tc.status, tc.total, tc.sec, tc.us, tc.extra)
			if got != want {
				t.Errorf("row = %s, want %s", got, want)
			}
			empty := fmt.Sprint(host[1], status[1], total[1], ts.vals[1].Unix(), ts.fracs[1], d.extra[1])
			if empty != fmt.Sprint("", 0, 0, 0, 0, "") {
				t.Errorf("second (empty) row = %s", empty)
			}
			for i, s := range d.slices() {
				if n := reflectLen(s); n != 2 {
					t.Errorf("column %d has %d values", i, n)
				}
			}
		})
	}
}

func reflectLen(v any) int { return reflect.ValueOf(v).Len() }

// deliverOne delivers one json-lines batch of n records with uuids
// prefix-0 … prefix-(n-1).
func deliverOne(ctx context.Context, sink *Sink, prefix string, n int) error {
	b := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum, ReceivedUnixNano: time.Now().UnixNano()}
	for i := 0; i < n; i++ {
		b.Records = append(b.Records, json.RawMessage(fmt.Sprintf(`{"timestamp":1763856000.5,"uuid":"%s-%d","status_code":200}`, prefix, i)))
	}
	return sink.Deliver(ctx, []*accesslog.Batch{b})
}

// TestTableLayout: a new access_logs is partitioned by day and sorted by
// environment and hour ahead of the record identity.
func TestTableLayout(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := deliverOne(ctx, sink, "u", 3); err != nil {
		t.Fatal(err)
	}
	var partition, sorting string
	if err := srv.Conn(t).QueryRow(ctx, "SELECT partition_key, sorting_key FROM system.tables WHERE database = '"+db+"' AND name = 'access_logs'").Scan(&partition, &sorting); err != nil {
		t.Fatal(err)
	}
	if partition != "toDate(timestamp)" || sorting != "environment_id, toStartOfHour(timestamp), profile_id, agent_id, datestamp, seq_num, record_key, record_index" {
		t.Errorf("partition key %q, sorting key %q", partition, sorting)
	}
}

// TestOldLayoutKeepsWorking: an access_logs created by an older receiver
// (sorted by the identity only, partitioned by month) is used as it is,
// with a warning pointing at the migration; records still collapse under
// FINAL.
func TestOldLayoutKeepsWorking(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	v := clickhouse.Version{Major: 18, Minor: 16, Patch: 1}
	stmts := ddl(t, db, v, accesslog.Fields())
	old := strings.Replace(stmts[len(stmts)-1], "PARTITION BY toDate(`timestamp`)\nORDER BY (environment_id, toStartOfHour(`timestamp`), profile_id,",
		"PARTITION BY toYYYYMM(`timestamp`)\nORDER BY (environment_id, profile_id,", 1)
	if old == stmts[len(stmts)-1] {
		t.Fatalf("could not derive the old layout from:\n%s", old)
	}
	srv.Exec(t, old)
	var logs bytes.Buffer
	sink := newSink(t, Config{DSN: srv.DSN(db), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 2 {
		if err := deliverOne(ctx, sink, "u", 10); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM `"+db+"`.access_logs FINAL"); n != 10 {
		t.Errorf("%d records under FINAL, want 10", n)
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND sorting_key = 'environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index'"); n != 1 {
		t.Error("the old table's sorting key changed")
	}
	if !strings.Contains(logs.String(), "old layout") || !strings.Contains(logs.String(), "INSERT") {
		t.Errorf("no warning about the old layout in the log:\n%s", logs.String())
	}
}

// TestMigrationRecipe follows the README's migration of an old-layout
// access_logs while the receiver keeps delivering: RENAME it away, the
// sink re-creates access_logs in the new layout at its next delivery, and
// INSERT … SELECT * copies the old rows; a record delivered before and
// after the rename still counts once.
func TestMigrationRecipe(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	old := ddl(t, db, clickhouse.Version{Major: 18, Minor: 16, Patch: 1}, accesslog.Fields())
	srv.Exec(t, strings.Replace(old[len(old)-1], "PARTITION BY toDate(`timestamp`)\nORDER BY (environment_id, toStartOfHour(`timestamp`), profile_id,",
		"PARTITION BY toYYYYMM(`timestamp`)\nORDER BY (environment_id, profile_id,", 1))
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := deliverOne(ctx, sink, "old", 10); err != nil {
		t.Fatal(err)
	}

	stmts := readmeMigration(t, db)
	srv.Exec(t, stmts[0]) // RENAME
	// The worker retries a delivery that failed; the sink repairs first.
	deliver := func(prefix string) {
		t.Helper()
		err := deliverOne(ctx, sink, prefix, 10)
		if err != nil && clickhouse.ErrorClass(err) == clickhouse.ClassSchema {
			err = deliverOne(ctx, sink, prefix, 10)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	deliver("new")
	deliver("old") // redelivered after the rename
	// The copy statement prints the INSERT to run.
	var insert string
	if err := srv.Conn(t).QueryRow(ctx, stmts[1]).Scan(&insert); err != nil {
		t.Fatalf("the README's copy statement on ClickHouse 18.16: %v\n%s", err, stmts[1])
	}
	srv.Exec(t, insert)

	if n := srv.QueryUint64(t, "SELECT count() FROM `"+db+"`.access_logs FINAL"); n != 20 {
		t.Errorf("%d records under FINAL after the migration, want 20", n)
	}
	if n := srv.QueryUint64(t, "SELECT uniqExact(uuid) FROM `"+db+"`.access_logs"); n != 20 {
		t.Errorf("%d distinct uuids after the migration, want 20", n)
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name = 'access_logs' AND sorting_key LIKE '%toStartOfHour%'"); n != 1 {
		t.Error("the re-created access_logs does not have the new layout")
	}
}

// ddl returns the statements that create access_logs with fields in
// database on a single server of version v.
func ddl(t *testing.T, database string, v clickhouse.Version, fields []accesslog.Field) []string {
	t.Helper()
	spec, err := TableSpec(v, fields, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return clickhouse.CreateStatements(database, "", v, spec)
}

// newSink is New for a configuration the test expects to be valid.
func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
