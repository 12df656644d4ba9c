package logtable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// rollupRow is what the rollup or access_logs FINAL says of one key
// (environment, minute, status code, cache status, POP).
type rollupRow struct{ requests, bytes uint64 }

// rollupCompare holds the rollup of a database and the same aggregates
// of its access_logs FINAL, by key.
type rollupCompare struct{ rollup, final map[string]rollupRow }

// rollupRows reads sql's rows of (key, requests, bytes).
func rollupRows(ctx context.Context, t *testing.T, conn driver.Conn, sql string) map[string]rollupRow {
	t.Helper()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	defer rows.Close()
	out := map[string]rollupRow{}
	for rows.Next() {
		var k string
		var r rollupRow
		if err := rows.Scan(&k, &r.requests, &r.bytes); err != nil {
			t.Fatal(err)
		}
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

const rollupKey = "concat(environment_id, ' ', toString(minute), ' ', toString(status_code), ' ', cache_status, ' ', pop)"

// compareRollup reads the rollup of database db and access_logs FINAL.
func compareRollup(ctx context.Context, t *testing.T, conn driver.Conn, db string) rollupCompare {
	t.Helper()
	return rollupCompare{
		rollup: rollupRows(ctx, t, conn, "SELECT "+rollupKey+" AS k, toUInt64(countMerge(requests_state)), toUInt64(sumMerge(bytes_out_state)) FROM `"+db+"`.access_logs_1m GROUP BY k"),
		final: rollupRows(ctx, t, conn, "SELECT "+rollupKey+" AS k, toUInt64(count()), toUInt64(sum(bytes_out)) FROM (SELECT environment_id, "+
			"toStartOfMinute(toDateTime(timestamp)) AS minute, status_code, cache_status, pop, bytes_out FROM `"+db+"`.access_logs FINAL) GROUP BY k"),
	}
}

// totals returns the requests of the rollup and of FINAL.
func (c rollupCompare) totals() (rollup, final uint64) {
	for _, r := range c.rollup {
		rollup += r.requests
	}
	for _, r := range c.final {
		final += r.requests
	}
	return rollup, final
}

// diff lists the keys where the rollup differs from FINAL, or with over
// set only those where it holds less (requests or bytes) than FINAL.
func (c rollupCompare) diff(over bool) []string {
	keys := slices.Collect(maps.Keys(c.rollup))
	for k := range c.final {
		if _, ok := c.rollup[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		r, f := c.rollup[k], c.final[k]
		if r == f || over && r.requests >= f.requests && r.bytes >= f.bytes {
			continue
		}
		out = append(out, fmt.Sprintf("%s: rollup %d requests %d bytes, FINAL %d requests %d bytes", k, r.requests, r.bytes, f.requests, f.bytes))
	}
	return out
}

// requireRollupExact fails the test unless the rollup of db equals
// access_logs FINAL key by key and holds want records.
func requireRollupExact(ctx context.Context, t *testing.T, conn driver.Conn, db string, want uint64) {
	t.Helper()
	c := compareRollup(ctx, t, conn, db)
	rollup, final := c.totals()
	if diff := c.diff(false); len(diff) > 0 || rollup != want || final != want {
		t.Fatalf("rollup %d requests, access_logs FINAL %d, want %d; %d keys differ:\n%s", rollup, final, want, len(diff),
			strings.Join(diff[:min(len(diff), 10)], "\n"))
	}
}

// rebuildRollup runs the documented rebuild of the rollup, for the minutes
// before cutoff, on database db (the recipe's cdn), and waits until its
// DELETE is done.
func rebuildRollup(ctx context.Context, t *testing.T, conn driver.Conn, db string, cutoff time.Time) {
	t.Helper()
	stmts := testenv.DocSQL(t, "docs/clickhouse.md", "## access_logs_1m: the per-minute rollup", "DELETE WHERE")
	for i, s := range stmts {
		s = strings.ReplaceAll(s, "cdn.", "`"+db+"`.")
		stmts[i] = strings.ReplaceAll(s, "2026-11-27 12:00:00", cutoff.UTC().Format(time.DateTime))
	}
	if len(stmts) != 3 || !strings.HasPrefix(stmts[0], "ALTER TABLE") || !strings.HasPrefix(stmts[2], "INSERT") {
		t.Fatalf("the documented rebuild has %d statements, want the DELETE, SET and INSERT: %q", len(stmts), stmts)
	}
	if err := testenv.ExecSession(ctx, conn, stmts); err != nil {
		t.Fatalf("the documented rebuild: %v", err)
	}
	waitMutations(ctx, t, conn, db)
}

// rollupCheck runs the documented query listing the minutes where the
// rollup of database db and access_logs FINAL disagree, over the minutes
// from since, and returns them.
func rollupCheck(ctx context.Context, t *testing.T, conn driver.Conn, db string, since time.Time) []string {
	t.Helper()
	stmts := testenv.DocSQL(t, "docs/clickhouse.md", "## access_logs_1m: the per-minute rollup", "HAVING rollup != final")
	if len(stmts) != 1 {
		t.Fatalf("the documented check of the rollup has %d statements, want 1", len(stmts))
	}
	sql := strings.ReplaceAll(strings.ReplaceAll(stmts[0], "cdn.", "`"+db+"`."), "now() - INTERVAL 1 DAY", "toDateTime('"+since.UTC().Format(time.DateTime)+"')")
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatalf("the documented check of the rollup: %v\n%s", err, sql)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var minute time.Time
		var rollup, final uint64
		if err := rows.Scan(&minute, &rollup, &final); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s: rollup %d, FINAL %d", minute.UTC().Format(time.DateTime), rollup, final))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkDocRollupQuery runs the documented query of the rollup (requests,
// bytes, 5xx errors and p95 response time per POP of one environment over
// the last hour) on database db as if now were now, and fails the test
// unless it answers what the same aggregates of access_logs FINAL do:
// requests, bytes and errors exactly, p95 within 5 % (a t-digest), POPs
// busiest first.
func checkDocRollupQuery(ctx context.Context, t *testing.T, conn driver.Conn, db, env string, now time.Time) {
	t.Helper()
	stmts := testenv.DocSQL(t, "docs/clickhouse.md", "## access_logs_1m: the per-minute rollup", "p95_seconds")
	if len(stmts) != 1 {
		t.Fatalf("the documented query of the rollup has %d statements, want 1", len(stmts))
	}
	at := fmt.Sprintf("toDateTime(%d)", now.Unix())
	doc := strings.NewReplacer("cdn.", "`"+db+"`.", "now()", at, "'env-1'", clickhouse.QuoteString(env)).Replace(stmts[0])
	type popRow struct {
		requests, errors uint64
		bytes            int64
		p95              float64
	}
	read := func(sql string) ([]string, map[string]popRow) {
		t.Helper()
		rows, err := conn.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
		defer rows.Close()
		var order []string
		out := map[string]popRow{}
		for rows.Next() {
			var pop string
			var r popRow
			if err := rows.Scan(&pop, &r.requests, &r.bytes, &r.errors, &r.p95); err != nil {
				t.Fatal(err)
			}
			order = append(order, pop)
			out[pop] = r
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return order, out
	}
	order, got := read("SELECT pop, toUInt64(requests), toInt64(bytes), toUInt64(errors_5xx), toFloat64(p95_seconds) FROM (" + doc + ")")
	_, want := read(fmt.Sprintf("SELECT pop, toUInt64(count()), toInt64(sum(bytes_out)), toUInt64(countIf(status_code >= 500)), quantileExact(0.95)(total_time) "+
		"FROM `%s`.access_logs FINAL WHERE environment_id = %s AND toStartOfMinute(toDateTime(`timestamp`)) >= %s - INTERVAL 1 HOUR GROUP BY pop",
		db, clickhouse.QuoteString(env), at))
	if len(want) == 0 {
		t.Fatalf("access_logs of %s has no record in the hour before %s: the documented query tests nothing", env, now)
	}
	if len(got) != len(want) {
		t.Errorf("the documented query lists %d POPs, access_logs FINAL %d", len(got), len(want))
	}
	for i, pop := range order {
		g, w := got[pop], want[pop]
		if g.requests != w.requests || g.bytes != w.bytes || g.errors != w.errors || math.Abs(g.p95-w.p95) > 0.05*w.p95 {
			t.Errorf("POP %s: the documented query says %+v, access_logs FINAL %+v", pop, g, w)
		}
		if i > 0 && got[order[i-1]].requests < g.requests {
			t.Errorf("POP %s (%d requests) listed after %s (%d)", pop, g.requests, order[i-1], got[order[i-1]].requests)
		}
	}
	t.Logf("the documented query of the rollup: %d POPs as access_logs FINAL has them", len(order))
}

// waitMutations waits until the mutations of database db are done.
func waitMutations(ctx context.Context, t *testing.T, conn driver.Conn, db string) {
	t.Helper()
	for {
		var pending uint64
		if err := conn.QueryRow(ctx, "SELECT toUInt64(count()) FROM system.mutations WHERE database = '"+db+"' AND is_done = 0").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d mutations of %s not done", pending, db)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func TestRollupSpec(t *testing.T) {
	v1816, v26 := clickhouse.Version{Major: 18, Minor: 16, Patch: 1}, clickhouse.Version{Major: 26, Minor: 7}
	spec := func(v clickhouse.Version, fields []accesslog.Field) *clickhouse.Table {
		t.Helper()
		s, err := TableSpec(v, fields, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("18.16, the sink's own types", func(t *testing.T) {
		r, err := RollupSpec(v1816, spec(v1816, accesslog.Fields()), 7*24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		stmts := clickhouse.CreateStatements("cdn", "", v1816, r)
		want := "CREATE MATERIALIZED VIEW IF NOT EXISTS `cdn`.`access_logs_1m_mv` TO `cdn`.`access_logs_1m`\nAS SELECT\n    environment_id,\n" +
			"    toStartOfMinute(toDateTime(`timestamp`)) AS minute,\n    status_code,\n    cache_status,\n    pop,\n    countState() AS requests_state,\n" +
			"    sumState(bytes_out) AS bytes_out_state,\n    quantileTDigestState(total_time) AS total_time_state\nFROM `cdn`.`access_logs`\n" +
			"GROUP BY environment_id, minute, status_code, cache_status, pop"
		if len(stmts) != 3 || stmts[2] != want {
			t.Errorf("statements:\n%s\nwant the view last:\n%s", strings.Join(stmts, "\n;\n"), want)
		}
		if strings.Contains(stmts[1], "TTL") || strings.Contains(stmts[1], "LowCardinality") || !strings.Contains(stmts[1], "ENGINE = AggregatingMergeTree()\nPARTITION BY toDate(`minute`)") {
			t.Errorf("18.16 table:\n%s", stmts[1])
		}
	})
	t.Run("26.x cluster", func(t *testing.T) {
		r, err := RollupSpec(v26, spec(v26, accesslog.Fields()), 7*24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		stmts := strings.Join(clickhouse.CreateStatements("cdn", "c1", v26, r), "\n;\n")
		for _, want := range []string{
			"`environment_id` LowCardinality(String)",
			"ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/cdn/access_logs_1m_local', '{replica}')",
			"TTL `minute` + INTERVAL 604800 SECOND\nSETTINGS ttl_only_drop_parts = 1",
			"ENGINE = Distributed('c1', 'cdn', 'access_logs_1m_local', cityHash64(environment_id, minute))",
			"CREATE MATERIALIZED VIEW IF NOT EXISTS `cdn`.`access_logs_1m_mv` ON CLUSTER `c1` TO `cdn`.`access_logs_1m_local`",
			"FROM `cdn`.`access_logs_local`\n",
		} {
			if !strings.Contains(stmts, want) {
				t.Errorf("no %q in:\n%s", want, stmts)
			}
		}
	})
	t.Run("an operator's column types are converted", func(t *testing.T) {
		existing := map[string]string{"status_code": "UInt16", "bytes_out": "UInt64", "total_time": "Float32", "pop": "LowCardinality(String)"}
		s, err := TableSpec(v26, accesslog.Fields(), existing, 0)
		if err != nil {
			t.Fatal(err)
		}
		r, err := RollupSpec(v26, s, 0)
		if err != nil {
			t.Fatal(err)
		}
		q := r.View.Query("src")
		for _, want := range []string{"toInt64(status_code) AS status_code", "sumState(toInt64(bytes_out))", "quantileTDigestState(toFloat64(total_time))", "    pop,\n"} {
			if !strings.Contains(q, want) {
				t.Errorf("no %q in:\n%s", want, q)
			}
		}
	})
	t.Run("fields left out and types it cannot read", func(t *testing.T) {
		var fields []accesslog.Field
		for _, f := range accesslog.Fields() {
			if f.Code != "pop" && f.Code != "total_time" {
				fields = append(fields, f)
			}
		}
		s, err := TableSpec(v26, fields, map[string]string{"status_code": "String", "bytes_out": "Nullable(Int64)"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = RollupSpec(v26, s, 0)
		var se *RollupSourceError
		if !errors.As(err, &se) || len(se.Problems) != 4 {
			t.Fatalf("err %v, want a RollupSourceError naming status_code, pop, bytes_out and total_time", err)
		}
		for _, want := range []string{"column status_code is String", "no column pop", "column bytes_out is Nullable(Int64)", "no column total_time"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v does not say %q", err, want)
			}
		}
	})
}

// TestRollupOn1816 runs the receiver's sink against ClickHouse 18.16,
// which has no deduplication on a single server, and compares the
// per-minute rollup with access_logs FINAL key by key: a receiver that
// restarts and delivers again what it stored (regrouped with newer
// batches, one of them stored in part) counts nothing twice; ClickHouse
// killed with SIGKILL in the middle of inserts, which the sink retries,
// leaves the rollup never below FINAL (a retried INSERT the server had
// stored is counted twice); the documented rebuild makes it exact again.
func TestRollupOn1816(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	conn := srv.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const per = 500
	all := sampleBatches(t, 32, per)

	before := newSink(t, Config{DSN: srv.DSN(db)})
	// The last batch stored in part; the receiver stops before its spool
	// committed them.
	deliverAll(ctx, t, before, append(all[:2:2], all[2].Select(1, 7, 300)))
	before.Close()
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	deliverAll(ctx, t, sink, all[:8])
	requireRollupExact(ctx, t, conn, db, 8*per)

	unique := uint64(8 * per)
	for round, delay := range []time.Duration{0, 30 * time.Millisecond, 150 * time.Millisecond} {
		batches := all[(round+1)*8 : (round+2)*8]
		unique += uint64(len(batches) * per)
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			time.Sleep(delay)
			srv.Kill()
			time.Sleep(200 * time.Millisecond)
			srv.Start()
		}()
		deliverAll(ctx, t, sink, batches) // retried until the restarted server takes them
		<-killed
		conn = srv.Conn(t)
		c := compareRollup(ctx, t, conn, db)
		rollup, final := c.totals()
		if final != unique {
			t.Fatalf("round %d (kill after %s): access_logs FINAL holds %d records, want %d", round, delay, final, unique)
		}
		if under := c.diff(true); len(under) > 0 {
			t.Fatalf("round %d (kill after %s): the rollup holds fewer than FINAL:\n%s", round, delay, strings.Join(under, "\n"))
		}
		t.Logf("round %d (kill after %s): rollup %d requests, FINAL %d (%d counted twice)", round, delay, rollup, final, rollup-final)
	}
	// An INSERT whose acknowledgement was lost, retried: the same rows
	// again, which access_logs collapses under FINAL and the rollup counts.
	deliverAll(ctx, t, sink, all[30:])
	if rollup, final := compareRollup(ctx, t, conn, db).totals(); final != unique || rollup != unique+2*per {
		t.Fatalf("after an INSERT repeated: rollup %d, FINAL %d; want FINAL %d and the rollup %d more", rollup, final, unique, 2*per)
	}
	since := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	if wrong := rollupCheck(ctx, t, conn, db, since); len(wrong) == 0 {
		t.Error("the documented check of the rollup lists no minute after an INSERT was counted twice")
	} else {
		t.Logf("the documented check lists %d minutes, e.g. %s", len(wrong), wrong[0])
	}
	rebuildRollup(ctx, t, conn, db, time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC))
	requireRollupExact(ctx, t, conn, db, unique)
	if wrong := rollupCheck(ctx, t, conn, db, since); len(wrong) != 0 {
		t.Errorf("after the rebuild the documented check of the rollup lists %q", wrong)
	}
	checkDocRollupQuery(ctx, t, conn, db, all[0].EnvironmentID, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	var p95, exact float64
	if err := conn.QueryRow(ctx, "SELECT toFloat64(quantileTDigestMerge(0.95)(total_time_state)) FROM `"+db+"`.access_logs_1m").Scan(&p95); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT quantileExact(0.95)(total_time) FROM `"+db+"`.access_logs FINAL").Scan(&exact); err != nil {
		t.Fatal(err)
	}
	t.Logf("p95 total_time: %.4f from the rollup's digests, %.4f exact", p95, exact)
	if math.Abs(p95-exact) > 0.02*exact {
		t.Errorf("p95 total_time %.4f from the rollup, %.4f exact: more than 2%% apart", p95, exact)
	}
}
