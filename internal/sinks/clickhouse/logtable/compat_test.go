package logtable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestParseColumnTypeAndCompatibility(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		base  string
		null  bool
		holds []accesslog.FieldType
	}{
		{"String", "String", false, []accesslog.FieldType{accesslog.TypeString, accesslog.TypeInteger, accesslog.TypeFloat, accesslog.TypeTimestamp}},
		{"LowCardinality(String)", "String", false, []accesslog.FieldType{accesslog.TypeString, accesslog.TypeInteger, accesslog.TypeFloat, accesslog.TypeTimestamp}},
		{"LowCardinality(Nullable(String))", "String", true, []accesslog.FieldType{accesslog.TypeString, accesslog.TypeInteger, accesslog.TypeFloat, accesslog.TypeTimestamp}},
		{"Nullable(UInt16)", "UInt16", true, []accesslog.FieldType{accesslog.TypeInteger}},
		{"UInt64", "UInt64", false, []accesslog.FieldType{accesslog.TypeInteger}},
		{"Int8", "Int8", false, []accesslog.FieldType{accesslog.TypeInteger}},
		{"Float32", "Float32", false, []accesslog.FieldType{accesslog.TypeInteger, accesslog.TypeFloat}},
		{"Float64", "Float64", false, []accesslog.FieldType{accesslog.TypeInteger, accesslog.TypeFloat, accesslog.TypeTimestamp}},
		{"DateTime", "DateTime", false, []accesslog.FieldType{accesslog.TypeTimestamp}},
		{"DateTime('UTC')", "DateTime", false, []accesslog.FieldType{accesslog.TypeTimestamp}},
		{"Nullable(DateTime64(3, 'UTC'))", "DateTime64", true, []accesslog.FieldType{accesslog.TypeTimestamp}},
		{"Date", "", false, nil},
		{"Decimal(18, 2)", "", false, nil},
		{"FixedString(2)", "", false, nil},
		{"Array(String)", "", false, nil},
		{"LowCardinality(UInt16)", "", false, nil},
	} {
		ct, ok := parseColumnType(tc.raw)
		if ok != (tc.base != "") || (ok && (ct.base != tc.base || ct.nullable != tc.null)) {
			t.Errorf("parseColumnType(%s) = %+v, %v", tc.raw, ct, ok)
			continue
		}
		for _, ft := range []accesslog.FieldType{accesslog.TypeString, accesslog.TypeInteger, accesslog.TypeFloat, accesslog.TypeTimestamp} {
			want := false
			for _, h := range tc.holds {
				want = want || h == ft
			}
			if ok && ct.holds(ft) != want {
				t.Errorf("%s holds %s: %v, want %v", tc.raw, ft, ct.holds(ft), want)
			}
		}
	}
}

func TestNumberColumnsNeverWrap(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		in   string
		want string // "" = does not fit
	}{
		{"UInt16", "65535", "65535"}, {"UInt16", "65536", ""}, {"UInt16", "-1", ""}, {"UInt16", `"404"`, "404"},
		{"UInt8", "255.0", "255"}, {"UInt8", "1.5", ""},
		{"Int8", "-128", "-128"}, {"Int8", "128", ""},
		{"UInt32", "4294967295", "4294967295"}, {"UInt32", "4294967296", ""},
		{"Int64", "9223372036854775807", "9223372036854775807"}, {"Int64", "9223372036854775808", ""}, {"Int64", "1e19", ""},
		{"UInt64", "18446744073709551615", "18446744073709551615"}, {"UInt64", "18446744073709551616", ""},
		{"Float32", "1.5", "1.5"}, {"Float32", "1e39", ""}, {"Float64", "1e308", "1e+308"},
		{"Int64", "true", ""}, {"Float64", `"NaN"`, ""},
	} {
		ct, _ := parseColumnType(tc.typ)
		c := newValueColumn(accessColumn{typ: ct}, 1)
		ok := c.add([]byte(tc.in), tc.in)
		got := ""
		if ok {
			got = strings.Trim(fmt.Sprint(c.data(nil)[0]), "[]")
		}
		if got != tc.want {
			t.Errorf("%s column, value %s: got %q, want %q", tc.typ, tc.in, got, tc.want)
		}
	}
	// Nullable: null and values out of range are NULL.
	ct, _ := parseColumnType("Nullable(UInt16)")
	c := newValueColumn(accessColumn{typ: ct}, 3)
	c.add([]byte("7"), "7")
	c.add([]byte("null"), "null")
	if c.add([]byte("70000"), "70000") {
		t.Fatal("70000 fits a UInt16")
	}
	c.addDefault()
	vals := c.data(nil)[0].([]*uint16)
	if len(vals) != 3 || vals[0] == nil || *vals[0] != 7 || vals[1] != nil || vals[2] != nil {
		t.Fatalf("Nullable(UInt16) values %v", vals)
	}
}

// recordsWith builds a json batch of n records; field values follow i.
func recordsWith(env string, seq int64, n int, rec func(i int) string) *accesslog.Batch {
	b := &accesslog.Batch{EnvironmentID: env, Format: accesslog.FormatJSON, AgentID: "agent", Datestamp: "20261123", SeqNum: seq, ProfileID: "1",
		ReceivedUnixNano: time.Now().UnixNano()}
	for i := 0; i < n; i++ {
		b.Records = append(b.Records, json.RawMessage(rec(i)))
	}
	return b
}

func TestExistingTableWithOtherTypes(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn := srv.Conn(t)
	// An operator's table: narrower integers, Nullable, LowCardinality,
	// DateTime with a time zone, a float timestamp; no typed column for
	// most fields, and no timestamp_us.
	create := "CREATE TABLE `" + db + "`.access_logs (environment_id String, agent_id String, datestamp String, seq_num Int64, " +
		"record_key String, record_index UInt32, profile_id String, format String, received_at DateTime, extra String, insert_version UInt64, " +
		"timestamp DateTime('UTC'), status_code UInt16, bytes_out UInt32, client_port Nullable(UInt16), host LowCardinality(String), " +
		"total_time Float32, origin_time Nullable(Float64), client_asn String) " +
		"ENGINE = ReplacingMergeTree(insert_version) ORDER BY (environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index)"
	lcCtx := ch.Context(ctx, ch.WithSettings(ch.Settings{"allow_experimental_low_cardinality_type": 1}))
	if err := conn.Exec(lcCtx, create); err != nil {
		t.Fatal(err)
	}
	sink := New(Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	const batches, per = 4, 250
	var bs []*accesslog.Batch
	var wantStatus, wantBytes uint64
	for s := 0; s < batches; s++ {
		bs = append(bs, recordsWith("env", int64(s), per, func(i int) string {
			status, bytes := 200+i%5, uint64(1000*s+i)
			wantStatus += uint64(status)
			wantBytes += bytes
			return fmt.Sprintf(`{"timestamp":%d.5,"status_code":%d,"bytes_out":%d,"client_port":%d,"host":"h%d","total_time":0.25,"client_asn":%d}`,
				1763856000+i, status, bytes, 40000+i, i%3, 64500+i)
		}))
	}
	// Values the columns cannot hold go to extra, never wrapped.
	bs = append(bs, recordsWith("env", 99, 1, func(int) string {
		return `{"status_code":70000,"bytes_out":-1,"client_port":99999,"timestamp":5000000000.5,"host":"h9"}`
	}))
	for attempt := 0; attempt < 2; attempt++ { // a redelivery collapses
		if err := sink.Deliver(ctx, bs); err != nil {
			t.Fatalf("Deliver: %v", err)
		}
	}
	var count, status, bytes, nullPorts uint64
	if err := conn.QueryRow(ctx, "SELECT count(), sum(toUInt64(status_code)), sum(toUInt64(bytes_out)), countIf(isNull(client_port)) FROM `"+db+"`.access_logs FINAL WHERE seq_num < 99").
		Scan(&count, &status, &bytes, &nullPorts); err != nil {
		t.Fatal(err)
	}
	if count != batches*per || status != wantStatus || bytes != wantBytes || nullPorts != 0 {
		t.Fatalf("count %d sum(status_code) %d sum(bytes_out) %d null ports %d; want %d, %d, %d, 0", count, status, bytes, nullPorts, batches*per, wantStatus, wantBytes)
	}
	var hosts, asn uint64
	if err := conn.QueryRow(ctx, "SELECT uniqExact(host), countIf(client_asn != '') FROM `"+db+"`.access_logs FINAL WHERE seq_num < 99").Scan(&hosts, &asn); err != nil {
		t.Fatal(err)
	}
	if hosts != 3 || asn != batches*per {
		t.Fatalf("hosts %d, client_asn as text %d", hosts, asn)
	}
	var st uint16
	var bo uint32
	var port *uint16
	var ts time.Time
	var extra string
	if err := conn.QueryRow(ctx, "SELECT status_code, bytes_out, client_port, timestamp, extra FROM `"+db+"`.access_logs FINAL WHERE seq_num = 99").Scan(&st, &bo, &port, &ts, &extra); err != nil {
		t.Fatal(err)
	}
	if st != 0 || bo != 0 || port != nil || ts.Unix() != 0 ||
		extra != `{"bytes_out":-1,"client_port":99999,"status_code":70000,"timestamp":5000000000.5}` {
		t.Fatalf("out-of-range row: status %d bytes %d port %v ts %v extra %s", st, bo, port, ts, extra)
	}
	// The sink added the columns it lacked (timestamp_us for the DateTime).
	var us uint32
	if err := conn.QueryRow(ctx, "SELECT timestamp_us FROM `"+db+"`.access_logs FINAL WHERE seq_num = 0 LIMIT 1").Scan(&us); err != nil || us != 500000 {
		t.Fatalf("timestamp_us = %d, %v", us, err)
	}
}

func TestIncompatibleColumnIsRefusedByName(t *testing.T) {
	srv := testenv.ClickHouse(t)
	for _, tc := range []struct{ column, def, field string }{
		{"status_code", "status_code Date", "status_code"},
		{"host", "host UInt32", "host"},
		{"seq_num", "seq_num String", ""}, // one of the sink's own columns
	} {
		t.Run(tc.column, func(t *testing.T) {
			db := srv.NewDatabase(t)
			srv.Exec(t, "CREATE TABLE "+db+".access_logs (environment_id String, "+tc.def+", extra String) ENGINE = MergeTree ORDER BY environment_id")
			sink := New(Config{DSN: srv.DSN(db)})
			t.Cleanup(func() { sink.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := sink.Check(ctx)
			var ic *IncompatibleColumnError
			if !errors.As(err, &ic) || ic.Column != tc.column || !strings.Contains(err.Error(), "column "+tc.column) {
				t.Fatalf("Check: %v, want an IncompatibleColumnError naming %s", err, tc.column)
			}
			t.Logf("%v", err)
		})
	}
}

func TestDroppedTableIsRecreated(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	sink := New(Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := &delivery.Deliverer{Sink: sink, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	rec := func(i int) string { return fmt.Sprintf(`{"uuid":"u%d","status_code":200}`, i) }
	if _, err := d.Deliver(ctx, []*accesslog.Batch{recordsWith("env", 1, 10, rec)}, nil); err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "DROP TABLE "+db+".access_logs")
	failures := 0
	d.OnError = func(err error, _, _ int, _ time.Duration) {
		failures++
		if clickhouse.ErrorClass(err) != clickhouse.ClassSchema {
			t.Errorf("after DROP TABLE: %v (class %s), want a schema error", err, clickhouse.ErrorClass(err))
		}
	}
	if rejected, err := d.Deliver(ctx, []*accesslog.Batch{recordsWith("env", 2, 7, rec)}, nil); err != nil || len(rejected) != 0 {
		t.Fatalf("Deliver after DROP TABLE: %v, %d rejected", err, len(rejected))
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != 7 || failures != 1 {
		t.Fatalf("%d rows in the re-created table after %d failed attempts, want 7 after 1", n, failures)
	}
	// The same when the whole database is gone.
	srv.Exec(t, "DROP DATABASE "+db)
	if _, err := d.Deliver(ctx, []*accesslog.Batch{recordsWith("env", 3, 5, rec)}, nil); err != nil {
		t.Fatal(err)
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != 5 {
		t.Fatalf("%d rows after DROP DATABASE, want 5", n)
	}
}

func TestRowsTheServerRefusesAreFoundAndRejected(t *testing.T) {
	// A DEFAULT expression that throws for one host: the server refuses
	// every INSERT holding such a row (code 395), whatever its neighbours.
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	sink := New(Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sink.Check(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "ALTER TABLE "+db+".access_logs ADD COLUMN host_check UInt8 DEFAULT throwIf(host = 'forbidden.example')")
	var bs []*accesslog.Batch
	for s := 0; s < 5; s++ {
		bs = append(bs, recordsWith("env", int64(s), 100, func(i int) string {
			host := "ok.example"
			if (s == 1 && i == 40) || (s == 3 && i == 99) {
				host = "forbidden.example"
			}
			return fmt.Sprintf(`{"uuid":"u%d-%d","host":"%s"}`, s, i, host)
		}))
	}
	deliveries := 0
	counting := &countingSink{Sink: sink, n: &deliveries}
	d := &delivery.Deliverer{Sink: counting, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	rejected, err := d.Deliver(ctx, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rejected) != 2 {
		t.Fatalf("%d records rejected, want the 2 forbidden ones", len(rejected))
	}
	for _, r := range rejected {
		if !strings.Contains(string(r.Batch.Records[0]), "forbidden") || r.Reason != "code_395" {
			t.Errorf("rejected %s (%s)", r.Batch.Records[0], r.Reason)
		}
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != 498 {
		t.Fatalf("%d rows stored, want the 498 others", n)
	}
	t.Logf("%d INSERTs to find 2 bad rows among 500", deliveries)
}

// countingSink counts the deliveries prepared through it.
type countingSink struct {
	*Sink
	n *int
}

func (c *countingSink) Prepare(batches []*accesslog.Batch) delivery.Prepared {
	*c.n++
	return c.Sink.Prepare(batches)
}
