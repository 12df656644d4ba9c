package logtable

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The ClickHouse 26.x tier of the receiver's sink: chDB behind testenv's
// HTTP(S) server (testenv.ChDB), written through the sink's own insert
// path over the HTTP interface.

func TestMain(m *testing.M) { testenv.Main(m) }

// sampleBatches returns n batches of per records each, with identity, of
// the simulator's records with every catalogued field.
func sampleBatches(t testing.TB, n, per int) []*accesslog.Batch {
	t.Helper()
	recs, err := platformsim.SampleRecords(7, n*per, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	// The records' environment_id is the batch's, as the platform sends it.
	var first struct {
		EnvironmentID string `json:"environment_id"`
	}
	if err := json.Unmarshal(recs[0], &first); err != nil {
		t.Fatal(err)
	}
	out := make([]*accesslog.Batch, n)
	for i := range out {
		out[i] = &accesslog.Batch{
			EnvironmentID: first.EnvironmentID, ProfileID: "1", Format: accesslog.FormatJSON, AgentID: "agent-1", Datestamp: "20261127",
			SeqNum: int64(i), ReceivedUnixNano: time.Date(2026, 11, 27, 12, 0, i, 0, time.UTC).UnixNano(),
			Records: recs[i*per : (i+1)*per],
		}
	}
	return out
}

// deliverAll delivers the batches, retrying as the receiver's worker does.
func deliverAll(ctx context.Context, t *testing.T, sink *Sink, batches []*accesslog.Batch) {
	t.Helper()
	d := &delivery.Deliverer{Sink: sink, MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	rejected, err := d.Deliver(ctx, batches, nil)
	if err != nil || len(rejected) != 0 {
		t.Fatalf("deliver: %v, %d records rejected", err, len(rejected))
	}
}

// TestAccessLogsOn26 delivers the simulator's records through the sink
// over HTTP and over HTTPS (certificate checked against the test CA with
// --clickhouse.tls.ca-file's option) to ClickHouse 26.x: count() FINAL is
// the number of records acknowledged, and so is count() without FINAL,
// also after every batch is delivered a second time (the platform's
// retry: same identity, same deduplication token), and the per-minute
// rollup equals FINAL key by key (the token reaches its view), also for
// two batches whose records differ only in their identity (the view's
// blocks are alike: deduplicated by the token, not by their content), and
// after the documented rebuild. The table has the modern layout:
// LowCardinality, codecs, DateTime64(6), ttl_only_drop_parts and a
// deduplication window.
func TestAccessLogsOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	for _, tc := range []struct {
		name, dsn string
		opts      []clickhouse.Option
	}{
		{"http", srv.DSN("logs_http"), nil},
		{"https", srv.HTTPSDSN("logs_https"), []clickhouse.Option{clickhouse.WithTLS(clickhouse.TLSOptions{CAFile: srv.CAFile(), ServerName: "localhost"})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := strings.TrimSuffix(tc.dsn[strings.LastIndex(tc.dsn, "/")+1:], "?secure=true")
			sink := newSink(t, Config{DSN: tc.dsn, Options: tc.opts, Retention: 30 * 24 * time.Hour})
			t.Cleanup(func() { sink.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			batches := sampleBatches(t, 8, 250)
			deliverAll(ctx, t, sink, batches)
			const acked = 8*250 + 2
			deliverAll(ctx, t, sink, batches) // redelivered: same identity
			// Two records alike but for their identity, in two INSERTs.
			for seq := range int64(2) {
				deliverAll(ctx, t, sink, []*accesslog.Batch{{EnvironmentID: "env-alike", ProfileID: "1", Format: accesslog.FormatJSON, AgentID: "agent-1",
					Datestamp: "20261127", SeqNum: seq, Records: []json.RawMessage{json.RawMessage(`{"timestamp":1795780800.5,"status_code":200,"cache_status":"TCP_HIT","pop":"fra","bytes_out":100,"total_time":0.1}`)}}})
			}
			final := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL")
			raw := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs")
			if final != acked || raw != acked {
				t.Errorf("count() FINAL %d, count() %d after delivering every batch twice; want %d acknowledged records for both", final, raw, acked)
			}
			requireRollupExact(ctx, t, srv.Conn(t), db, acked)
			rebuildRollup(ctx, t, srv.Conn(t), db, time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC))
			requireRollupExact(ctx, t, srv.Conn(t), db, acked)
			checkDocRollupQuery(ctx, t, srv.Conn(t), db, batches[0].EnvironmentID, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
			if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs WHERE extra != ''"); n != 0 {
				t.Errorf("%d records with fields in extra: every catalogued field has a column", n)
			}
			for col, want := range map[string]string{
				"timestamp": "DateTime64(6)", "method": "LowCardinality(String)", "pop": "LowCardinality(String)",
				"environment_id": "LowCardinality(String)", "path": "String", "bytes_out": "Int64",
			} {
				if got := srv.QueryString(t, "SELECT type FROM system.columns WHERE database = '"+db+"' AND table = 'access_logs' AND name = '"+col+"'"); got != want {
					t.Errorf("column %s: %s, want %s", col, got, want)
				}
			}
			for col, want := range map[string]string{"timestamp": "Delta", "path": "ZSTD(1)", "bytes_out": "T64", "extra": "ZSTD(1)"} {
				if got := srv.QueryString(t, "SELECT compression_codec FROM system.columns WHERE database = '"+db+"' AND table = 'access_logs' AND name = '"+col+"'"); !strings.Contains(got, want) {
					t.Errorf("column %s has codec %q, want one with %s", col, got, want)
				}
			}
			for table, ttl := range map[string]string{"access_logs": "TTL toDateTime(timestamp) + toIntervalSecond(2592000)", RollupTable: "TTL minute + toIntervalSecond(2592000)"} {
				create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+db+"' AND name = '"+table+"'")
				for _, want := range []string{"ttl_only_drop_parts = 1", "non_replicated_deduplication_window = 1000", ttl} {
					if !strings.Contains(create, want) {
						t.Errorf("%s lacks %q:\n%s", table, want, create)
					}
				}
			}
		})
	}
}

// TestNoDuplicatesAfterKill26: ClickHouse 26.x killed with SIGKILL while
// the sink inserts, then started again; the sink retries the same INSERTs
// (same deduplication tokens) until they succeed, and the spool's
// redelivery of a group already stored (the receiver lost the
// acknowledgement) is dropped by the server: count() without FINAL equals
// the number of unique records, and the per-minute rollup equals
// access_logs FINAL key by key.
func TestNoDuplicatesAfterKill26(t *testing.T) {
	srv := testenv.ChDB(t)
	sink := newSink(t, Config{DSN: srv.DSN("logs_kill")})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	all := sampleBatches(t, 24, 500)
	unique := 0
	for round, delay := range []time.Duration{0, 30 * time.Millisecond, 150 * time.Millisecond} {
		batches := all[round*8 : (round+1)*8]
		unique += 8 * 500
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(delay)
			srv.Kill()
		}()
		// The first attempt races the kill; the Deliverer retries the
		// same prepared INSERTs until the restarted server takes them.
		restarted := make(chan struct{})
		go func() {
			<-done
			time.Sleep(200 * time.Millisecond)
			srv.Start()
			close(restarted)
		}()
		deliverAll(ctx, t, sink, batches)
		<-restarted
		// The spool delivers the same group again after a receiver crash.
		deliverAll(ctx, t, sink, batches)
		if raw := srv.QueryUint64(t, "SELECT count() FROM logs_kill.access_logs"); raw != uint64(unique) {
			t.Fatalf("round %d (kill after %s): count() %d, want the %d unique records", round, delay, raw, unique)
		}
		requireRollupExact(ctx, t, srv.Conn(t), "logs_kill", uint64(unique))
	}
	if final := srv.QueryUint64(t, "SELECT count() FROM logs_kill.access_logs FINAL"); final != uint64(unique) {
		t.Errorf("count() FINAL %d, want %d", final, unique)
	}
	if wrong := rollupCheck(ctx, t, srv.Conn(t), "logs_kill", time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)); len(wrong) != 0 {
		t.Errorf("the documented check of the rollup lists %q", wrong)
	}
}

// TestRestartRegroupedNoDuplicates26: a receiver stopped after its sink
// stored a group but before the spool committed it delivers, after the
// restart, those batches again in a larger group (more arrived meanwhile),
// whose INSERT has another token: the first delivery of the new sink
// leaves out the records the table holds, of batches stored in full and
// of one stored in part (an INSERT cut short: one shard of a cluster, or
// one day's partition, stored), so count() without FINAL stays the number
// of unique records, and the rollup counts each once.
func TestRestartRegroupedNoDuplicates26(t *testing.T) {
	srv := testenv.ChDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	batches := sampleBatches(t, 8, 100)
	before := newSink(t, Config{DSN: srv.DSN("logs_restart")})
	deliverAll(ctx, t, before, append(batches[:4:4], batches[4].Select(0, 2, 3, 50, 99)))
	before.Close() // the crash: the spool position was not committed
	after := newSink(t, Config{DSN: srv.DSN("logs_restart")})
	t.Cleanup(func() { after.Close() })
	deliverAll(ctx, t, after, batches) // from the committed position: the five again and three more
	if raw := srv.QueryUint64(t, "SELECT count() FROM logs_restart.access_logs"); raw != 800 {
		t.Errorf("count() %d without FINAL, want the 800 unique records", raw)
	}
	if final := srv.QueryUint64(t, "SELECT count() FROM logs_restart.access_logs FINAL"); final != 800 {
		t.Errorf("count() FINAL %d, want 800", final)
	}
	requireRollupExact(ctx, t, srv.Conn(t), "logs_restart", 800)
}

// migrationDoc is the document whose section "access_logs layout and
// migration" holds the recipe users run.
const migrationDoc = "docs/clickhouse.md"

// docMigration returns the SQL statements of the access_logs migration
// recipe in migrationDoc, comments removed, with the database cdn renamed db.
func docMigration(t *testing.T, db string) []string {
	t.Helper()
	stmts := testenv.DocSQL(t, migrationDoc, "## access_logs layout and migration", "RENAME TABLE")
	for i, s := range stmts {
		s = strings.ReplaceAll(s, "cdn.", db+".")
		stmts[i] = strings.ReplaceAll(s, "'cdn'", "'"+db+"'")
	}
	return stmts
}

// TestMigrationRecipeFrom1816LayoutOn26 runs the access_logs migration
// recipe of migrationDoc, statement by statement, on ClickHouse 26.x, from a
// table in the layout ClickHouse 18.16 gets (timestamp DateTime +
// timestamp_us, sorted by identity) filled by the sink (which writes an
// existing table in its own types): the copy keeps every record and its
// microseconds, the receiver goes on in the new layout, the rollup's view
// is made again on the new table, and the rollup's rebuild the documentation
// asks for after the copy makes it exact.
func TestMigrationRecipeFrom1816LayoutOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	const db = "cdn_migration"
	srv.Exec(t, "CREATE DATABASE "+db)
	old := ddl(t, db, clickhouse.Version{Major: 18, Minor: 16, Patch: 1}, accesslog.Fields())
	srv.Exec(t, strings.Replace(old[len(old)-1], "PARTITION BY toDate(`timestamp`)\nORDER BY (environment_id, toStartOfHour(`timestamp`), profile_id,",
		"PARTITION BY toYYYYMM(`timestamp`)\nORDER BY (environment_id, profile_id,", 1))
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	batches := sampleBatches(t, 4, 100)
	deliverAll(ctx, t, sink, batches[:2])
	if n := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs WHERE timestamp_us != 0"); n == 0 {
		t.Fatal("no microseconds in timestamp_us: the old layout was not written as such")
	}

	stmts := docMigration(t, db)
	if len(stmts) != 4 || !strings.HasPrefix(stmts[0], "RENAME TABLE") {
		t.Fatalf("the recipe in %s has %d statements, want RENAME, the copy, the check, DROP: %q", migrationDoc, len(stmts), stmts)
	}
	srv.Exec(t, stmts[0])
	// The receiver goes on: its next delivery creates access_logs anew.
	deliverAll(ctx, t, sink, batches[2:])
	if got := srv.QueryString(t, "SELECT type FROM system.columns WHERE database = '"+db+"' AND table = 'access_logs' AND name = 'timestamp'"); got != "DateTime64(6)" {
		t.Fatalf("the new access_logs has timestamp %s, want DateTime64(6)", got)
	}
	// The copy statement prints the INSERT to run.
	insert := srv.QueryString(t, stmts[1])
	srv.Exec(t, insert)
	if n := srv.QueryUint64(t, strings.Replace(stmts[2], "SELECT count()", "SELECT toUInt64(count())", 1)); n != 400 {
		t.Errorf("%d records under FINAL after the copy, want 400", n)
	}
	lost := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs AS n INNER JOIN "+db+".access_logs_old AS o ON n.uuid = o.uuid "+
		"WHERE toUnixTimestamp64Micro(n.timestamp) != toInt64(toUnixTimestamp(o.timestamp)) * 1000000 + o.timestamp_us")
	copied := srv.QueryUint64(t, "SELECT count() FROM "+db+".access_logs AS n INNER JOIN "+db+".access_logs_old AS o ON n.uuid = o.uuid")
	if copied != 200 || lost != 0 {
		t.Errorf("%d records copied (want 200), %d of them with other microseconds than the old table's (want 0)", copied, lost)
	}
	srv.Exec(t, stmts[3])
	// The rollup's view followed the renamed table (Atomic databases
	// follow a table by UUID): the receiver made it again on the new one.
	// The copy passed through it; the documented rebuild makes it exact.
	if deps := srv.QueryString(t, "SELECT toString(dependencies_table) FROM system.tables WHERE database = '"+db+"' AND name = 'access_logs'"); deps != "['"+RollupView+"']" {
		t.Errorf("after the migration access_logs feeds %s, want the rollup's view", deps)
	}
	rebuildRollup(ctx, t, srv.Conn(t), db, time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC))
	requireRollupExact(ctx, t, srv.Conn(t), db, 400)
}

// TestAccessLogsBytesPerRecord26 measures access_logs' bytes on disk per
// record on ClickHouse 26.x, for 20,000 of the simulator's records with
// every catalogued field, in the layout 26.x servers got before (plain
// String columns, no codecs) and in the modern one, each merged into one
// part (OPTIMIZE … FINAL). docs/clickhouse.md records the figures
// (access_logs layout and migration):
//
//	go test -run TestAccessLogsBytesPerRecord26 -v ./internal/sinks/clickhouse/logtable
func TestAccessLogsBytesPerRecord26(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	srv := testenv.ChDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const records = 20_000
	batches := sampleBatches(t, records/500, 500)
	v := clickhouse.Version{Major: 26, Minor: 7}
	spec, err := TableSpec(v, accesslog.Fields(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	bytesPerRecord := map[string]float64{}
	for _, layout := range []string{"before", "modern"} {
		db := "bytes_" + layout
		stmts := clickhouse.CreateStatements(db, "", v, spec)
		if layout == "before" {
			stmts = clickhouse.CreateStatements(db, "", v, plainLayout(spec))
		}
		for _, s := range stmts {
			srv.Exec(t, s)
		}
		sink := newSink(t, Config{DSN: srv.DSN(db)})
		deliverAll(ctx, t, sink, batches)
		sink.Close()
		srv.Exec(t, "OPTIMIZE TABLE "+db+".access_logs FINAL")
		var rows, size uint64
		if err := srv.Conn(t).QueryRow(ctx, "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND database = '"+db+"' AND table = 'access_logs'").Scan(&rows, &size); err != nil {
			t.Fatal(err)
		}
		if rows != records {
			t.Fatalf("%s layout: %d rows, want %d", layout, rows, records)
		}
		bytesPerRecord[layout] = float64(size) / float64(rows)
	}
	var raw int
	for _, b := range batches {
		raw += b.RecordBytes()
	}
	t.Logf("ClickHouse 26.x, %d records (%.0f bytes of JSON each): access_logs on disk %.1f bytes/record before, %.1f modern (%.0f %%)",
		records, float64(raw)/records, bytesPerRecord["before"], bytesPerRecord["modern"], 100*bytesPerRecord["modern"]/bytesPerRecord["before"])
	if bytesPerRecord["modern"] >= bytesPerRecord["before"] {
		t.Errorf("the modern layout takes %.1f bytes/record, the one before %.1f", bytesPerRecord["modern"], bytesPerRecord["before"])
	}
}

// plainLayout returns spec as 26.x servers got it before the modern
// layout: no LowCardinality, no codecs, no table settings beyond those
// CreateStatements adds.
func plainLayout(spec *clickhouse.Table) *clickhouse.Table {
	out := *spec
	out.Columns = nil
	codec := regexp.MustCompile(` CODEC\(.*\)$`)
	for _, c := range spec.Columns {
		typ := codec.ReplaceAllString(c.Type, "")
		if inner, ok := unwrap(typ, "LowCardinality"); ok {
			typ = inner
		}
		c.Type = typ
		out.Columns = append(out.Columns, c)
	}
	return &out
}
