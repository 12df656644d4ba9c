package deploytest

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// createAccessLogs creates access_logs in db's database as the receiver's
// sink does on a single server.
func createAccessLogs(ctx context.Context, t *testing.T, db *clickhouse.DB) {
	t.Helper()
	for _, stmt := range accessLogsDDL(t, db.Database(), db.Version(), accesslog.Fields()) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	createEnvironments(ctx, t, db)
}

// createEnvironments creates the exporter's environments table, as its sink
// does, naming the access logs' environments: env-a production, env-b
// staging, renamed staging-eu later (a newer row).
func createEnvironments(ctx context.Context, t *testing.T, db *clickhouse.DB) {
	t.Helper()
	spec := inventorytables.EnvironmentsTable()
	for _, stmt := range clickhouse.CreateStatements(db.Database(), "", db.Version(), spec) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for i, rows := range [][][]any{
		{{"env-a", "production", "p-1", "shop", "o-1", at, uint64(1)}, {"env-b", "staging", "p-1", "shop", "o-1", at, uint64(1)}},
		{{"env-b", "staging-eu", "p-1", "shop", "o-1", at.Add(time.Hour), uint64(2)}},
	} {
		if err := db.Insert(ctx, spec.Name, []string{"environment_id", "environment", "property_id", "property", "organization_id", "seen_at", "version"}, rows); err != nil {
			t.Fatalf("environments insert %d: %v", i, err)
		}
	}
}

// accessLogsDDL returns the statements that create access_logs with fields
// and its per-minute rollup (table and view) in database on a single server
// of version v, as the receiver's sink does.
func accessLogsDDL(t *testing.T, database string, v clickhouse.Version, fields []accesslog.Field) []string {
	t.Helper()
	spec, err := logtable.TableSpec(v, fields, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	rollup, err := logtable.RollupSpec(v, spec, 0)
	if err != nil {
		t.Fatal(err)
	}
	return append(clickhouse.CreateStatements(database, "", v, spec), clickhouse.CreateStatements(database, "", v, rollup)...)
}

// rebuildRollup runs the documented rebuild of the per-minute rollup for
// every minute before cutoff on db's database, and waits for its DELETE.
func rebuildRollup(ctx context.Context, t *testing.T, db *clickhouse.DB, cutoff time.Time) {
	t.Helper()
	stmts := testenv.DocSQL(t, "docs/clickhouse.md", "## access_logs_1m: the per-minute rollup", "DELETE WHERE")
	for i, s := range stmts {
		s = strings.ReplaceAll(s, "cdn.", clickhouse.QuoteIdent(db.Database())+".")
		stmts[i] = strings.ReplaceAll(s, "2026-11-27 12:00:00", cutoff.UTC().Format(time.DateTime))
	}
	if err := testenv.ExecSession(ctx, db.Conn(), stmts); err != nil {
		t.Fatalf("the documented rebuild of the rollup: %v", err)
	}
	for {
		var pending uint64
		if err := db.Conn().QueryRow(ctx, "SELECT toUInt64(count()) FROM system.mutations WHERE database = "+clickhouse.QuoteString(db.Database())+" AND is_done = 0").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// accessLogRows returns an INSERT … SELECT of n records in the hour before
// end, two environments, every value of the dashboards' columns varied and
// total_time unique (so "slowest" is well ordered). The same n and end give
// the same records (a redelivery).
func accessLogRows(db *clickhouse.DB, n int, end time.Time) string {
	return fmt.Sprintf(`INSERT INTO %s (environment_id, agent_id, datestamp, seq_num, record_key, record_index,
			timestamp, uuid, status_code, host, path, cache_status, pop, total_time, bytes_out, client_country_code, insert_version)
		SELECT if(number %% 2 = 0, 'env-a', 'env-b'), 'agent-1', '20260101', toInt64(intDiv(number, 10)), toString(number), toUInt32(number %% 10),
			toDateTime(%d - number * 7), toString(number),
			arrayElement([200, 200, 304, 404, 503], number %% 5 + 1), concat('h', toString(number %% 3), '.example'),
			concat('/p/', toString(number %% 11)), arrayElement(['TCP_HIT', 'TCP_MISS', 'TCP_EXPIRED_HIT'], number %% 3 + 1),
			arrayElement(['fra', 'iad', 'sin'], number %% 3 + 1), (number %% 100) / 250 + number / 1000000, number * 13,
			arrayElement(['us', 'de', 'jp', 'br'], number %% 4 + 1), toUInt64(1)
		FROM system.numbers LIMIT %d`, db.Table(logtable.Table), end.Unix(), n)
}

// resultText runs sql and returns its rows as sorted lines of
// tab-separated values (floats to 9 significant digits).
func resultText(ctx context.Context, conn driver.Conn, sql string) (string, error) {
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	var lines []string
	for rows.Next() {
		vals := make([]any, len(types))
		for i, ct := range types {
			vals[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(vals...); err != nil {
			return "", err
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			switch x := reflect.ValueOf(v).Elem().Interface().(type) {
			case float64:
				parts[i] = fmt.Sprintf("%.9g", x)
			case float32:
				parts[i] = fmt.Sprintf("%.6g", x)
			default:
				parts[i] = fmt.Sprint(x)
			}
		}
		lines = append(lines, strings.Join(parts, "\t"))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), rows.Err()
}

// TestDashboardSQLCountsRecordsOnce: the access-logs dashboard reads
// without FINAL, so every panel of access_logs must collapse redeliveries
// itself (uniqExact of the record identity, or LIMIT 1 BY it), and every
// panel of the per-minute rollup must read what the rollup holds when each
// record was counted once. Each panel's result on a database holding every
// record twice (two parts, merges stopped, as after redeliveries not
// merged yet), whose rollup was rebuilt from access_logs FINAL by the
// documented recipe (the view had counted both copies), equals its result
// on a database holding every record once, whose rollup the view filled.
func TestDashboardSQLCountsRecordsOnce(t *testing.T) {
	srv := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	end := time.Now().Truncate(time.Second)
	open := func(database string, copies int) *clickhouse.DB {
		db, err := clickhouse.Open(ctx, srv.DSN(database))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		createAccessLogs(ctx, t, db)
		if err := db.Exec(ctx, "SYSTEM STOP MERGES "+db.Table(logtable.Table)); err != nil {
			t.Fatal(err)
		}
		for range copies {
			if err := db.Exec(ctx, accessLogRows(db, 400, end)); err != nil {
				t.Fatal(err)
			}
		}
		createLogCompleteness(ctx, t, db, end) // read by the Log delivery dashboard
		return db
	}
	once, twice := open("logs_once", 1), open("logs_twice", 2)
	var raw, counted uint64
	if err := twice.Conn().QueryRow(ctx, "SELECT count() FROM access_logs").Scan(&raw); err != nil || raw != 800 {
		t.Fatalf("the doubled table holds %d rows (%v), want 800", raw, err)
	}
	if err := twice.Conn().QueryRow(ctx, "SELECT toUInt64(countMerge(requests_state)) FROM access_logs_1m").Scan(&counted); err != nil || counted != 800 {
		t.Fatalf("the doubled table's rollup counts %d records (%v), want both copies of 400", counted, err)
	}
	rebuildRollup(ctx, t, twice, end.Add(time.Minute))
	n := 0
	for _, d := range loadDashboards(t) {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Language != ClickHouseSQL || q.Variable {
				continue
			}
			for _, v := range []Values{testValues(), allSelected(testValues())} {
				sql, err := Expand(d, q, v)
				if err != nil {
					t.Fatal(err)
				}
				want, err := resultText(ctx, once.Conn(), sql)
				if err != nil {
					t.Fatalf("%s %s: %v\n%s", q.Dashboard, q.Where, err, sql)
				}
				got, err := resultText(ctx, twice.Conn(), sql)
				if err != nil {
					t.Fatalf("%s %s: %v\n%s", q.Dashboard, q.Where, err, sql)
				}
				if want == "" {
					t.Errorf("%s %s: no rows", q.Dashboard, q.Where)
				}
				if got != want {
					t.Errorf("%s %s counts redeliveries: with every record twice\n%s\nonce\n%s", q.Dashboard, q.Where, got, want)
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no ClickHouse queries found")
	}
	t.Logf("%d panel queries give the same result with every record delivered twice", n)
}

// readRows runs sql on db and returns what system.query_log says it read:
// rows and bytes.
func readRows(ctx context.Context, t *testing.T, db *clickhouse.DB, sql string) (rows, bytes uint64) {
	t.Helper()
	id := fmt.Sprintf("%s-%d", db.Database(), time.Now().UnixNano())
	qctx := ch.Context(ctx, ch.WithQueryID(id), ch.WithSettings(ch.Settings{"log_queries": 1}))
	if _, err := resultText(qctx, db.Conn(), sql); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := db.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
			t.Fatal(err)
		}
		err := db.Conn().QueryRow(ctx, "SELECT read_rows, read_bytes FROM system.query_log WHERE type = 2 AND query_id = "+clickhouse.QuoteString(id)).Scan(&rows, &bytes)
		if err == nil {
			return rows, bytes
		}
		if time.Now().After(deadline) {
			t.Fatalf("read_rows of %s: %v", sql, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// panelQueries returns the ClickHouse queries of the access-logs
// dashboard's panels with the given titles, and the dashboard.
func panelQueries(t *testing.T, titles ...string) (Dashboard, []Query) {
	t.Helper()
	d := dashboardFile(t, "access-logs.json")
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	var out []Query
	for _, q := range qs {
		for _, title := range titles {
			if q.Language == ClickHouseSQL && strings.HasPrefix(q.Where, `panel "`+title+`"`) {
				out = append(out, q)
			}
		}
	}
	if len(out) != len(titles) {
		t.Fatalf("found %d of the panels %q", len(out), titles)
	}
	return d, out
}

// TestLastHourReadsFewRows measures what a "last hour" panel of
// access_logs reads from a table holding 30 days (about 1.5 million
// records of two environments): system.query_log's read_rows for the
// dashboard's Top paths and Top hosts panels, on the receiver's table
// layout (partitioned by day, sorted by environment and hour ahead of the
// record identity) and, for comparison, on the old layout (sorted by the
// identity only). The new layout must read at most 3% of the rows.
func TestLastHourReadsFewRows(t *testing.T) {
	srv := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dash, panels := panelQueries(t, "Top paths", "Top hosts")
	const days, perEnvHour = 30, 1024
	to := time.Now().Truncate(time.Second)
	v := Values{From: to.Add(-time.Hour), To: to, Interval: time.Minute,
		Vars: map[string][]string{"environment_id": {"env-a", "env-b"}}, All: map[string]bool{"environment_id": true}}

	measure := func(database, layout string) map[string]float64 {
		db, err := clickhouse.Open(ctx, srv.DSN(database))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		// The fields the panels read: the layout is the receiver's, and
		// fewer columns make the 30 days quicker to write.
		var fields []accesslog.Field
		for _, f := range accesslog.Fields() {
			if slices.Contains([]string{"timestamp", "uuid", "status_code", "host", "path", "bytes_out", "total_time"}, f.Code) {
				fields = append(fields, f)
			}
		}
		spec, err := logtable.TableSpec(db.Version(), fields, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		stmts := clickhouse.CreateStatements(database, "", db.Version(), spec)
		create := stmts[len(stmts)-1]
		if layout == "old" {
			old := strings.Replace(create, "PARTITION BY toDate(`timestamp`)\nORDER BY (environment_id, toStartOfHour(`timestamp`), profile_id,",
				"PARTITION BY toYYYYMM(`timestamp`)\nORDER BY (environment_id, profile_id,", 1)
			if old == create {
				t.Fatalf("could not derive the old layout from:\n%s", create)
			}
			create = old
		}
		if err := db.Exec(ctx, create); err != nil {
			t.Fatal(err)
		}
		rows := days * 24 * 2 * perEnvHour
		start := time.Now()
		if err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (environment_id, agent_id, datestamp, seq_num, record_key, record_index, timestamp, uuid, status_code, host, path, bytes_out, total_time, insert_version)
			SELECT if(number %% 2 = 0, 'env-a', 'env-b'), 'agent-1', '20260101', toInt64(intDiv(number, 100)), '', toUInt32(number %% 100),
				toDateTime(%d - intDiv(number, 2) * %d / %d), toString(number), 200, concat('h', toString(number %% 7)), concat('/p/', toString(number %% 11)),
				number %% 1000, 0.1, toUInt64(1)
			FROM system.numbers LIMIT %d`, db.Table(logtable.Table), to.Unix(), days*24*3600, rows/2, rows)); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s layout: %d rows over %d days written in %s", layout, rows, days, time.Since(start).Round(time.Millisecond))
		out := map[string]float64{}
		for _, q := range panels {
			sql, err := Expand(dash, q, v)
			if err != nil {
				t.Fatal(err)
			}
			read, _ := readRows(ctx, t, db, sql)
			out[q.Where] = float64(read) / float64(rows)
			t.Logf("%s layout, last hour, %s: read_rows %d of %d (%.2f%%)", layout, q.Where, read, rows, 100*out[q.Where])
		}
		return out
	}
	newLayout := measure("layout_new", "new")
	oldLayout := measure("layout_old", "old")
	for where, frac := range newLayout {
		if frac > 0.03 {
			t.Errorf("%s over the last hour reads %.2f%% of 30 days: want at most 3%%", where, 100*frac)
		}
		if frac >= oldLayout[where] {
			t.Errorf("%s reads %.2f%% with the new layout, %.2f%% with the old", where, 100*frac, 100*oldLayout[where])
		}
	}
}

// The Requests and Traffic per POP panels as they read access_logs before
// the per-minute rollup: TestRollupReadsFewRows compares them with the
// panels that read the rollup.
const (
	rawRequests = "SELECT uniqExact(environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index) AS requests FROM access_logs " +
		"WHERE $__timeFilter(timestamp) AND $__conditionalAll(environment_id IN (${environment_id:singlequote}), $environment_id)"
	rawTrafficPerPOP = "SELECT pop, count() AS requests, sum(bytes_out) AS bytes FROM (SELECT pop, bytes_out FROM access_logs " +
		"WHERE $__timeFilter(timestamp) AND $__conditionalAll(environment_id IN (${environment_id:singlequote}), $environment_id) " +
		"LIMIT 1 BY environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index) GROUP BY pop ORDER BY requests DESC"
)

// TestRollupReadsFewRows measures what the Access logs dashboard's
// aggregate panels read from the per-minute rollup against what the same
// aggregates read from access_logs, over 6 hours of two environments at
// 1,000 records a minute each (720,000 records; 5 status codes, 3 cache
// statuses, 3 POPs), on ClickHouse 18.16 (system.query_log): the Requests
// panel and requests and bytes of the Traffic per POP panel give the same
// numbers from both, and the rollup reads at most 5% of the rows.
func TestRollupReadsFewRows(t *testing.T) {
	srv := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := clickhouse.Open(ctx, srv.DSN("rollup_reads"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	createAccessLogs(ctx, t, db)
	const hours, perMinute = 6, 1000
	rows := hours * 60 * 2 * perMinute
	to := time.Now().Truncate(time.Minute)
	start := time.Now()
	if err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (environment_id, agent_id, datestamp, seq_num, record_key, record_index, timestamp, uuid, status_code, cache_status, pop, bytes_out, total_time, insert_version)
		SELECT if(number %% 2 = 0, 'env-a', 'env-b'), 'agent-1', '20260101', toInt64(intDiv(number, 100)), '', toUInt32(number %% 100),
			toDateTime(%d - intDiv(number, 2) * 60 / %d), toString(number), arrayElement([200, 200, 304, 404, 503], number %% 5 + 1),
			arrayElement(['TCP_HIT', 'TCP_MISS', 'TCP_EXPIRED_HIT'], intDiv(number, 5) %% 3 + 1), arrayElement(['fra', 'iad', 'sin'], intDiv(number, 15) %% 3 + 1),
			number %% 1000, (number %% 100) / 250, toUInt64(1)
		FROM system.numbers LIMIT %d`, db.Table(logtable.Table), to.Unix()-1, perMinute, rows)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records over %d hours written through the rollup's view in %s", rows, hours, time.Since(start).Round(time.Millisecond))
	v := Values{From: to.Add(-hours * time.Hour), To: to, Interval: time.Minute,
		Vars: map[string][]string{"environment_id": {"env-a", "env-b"}}, All: map[string]bool{"environment_id": true}}
	dash, panels := panelQueries(t, "Requests", "Traffic per POP")
	for i, raw := range []string{rawRequests, rawTrafficPerPOP} {
		rollupSQL, err := Expand(dash, panels[i], v)
		if err != nil {
			t.Fatal(err)
		}
		rawSQL, err := Expand(dash, Query{Dashboard: dash.File, Where: "raw", Language: ClickHouseSQL, Text: raw}, v)
		if err != nil {
			t.Fatal(err)
		}
		// The rollup's panel without what access_logs cannot give alike
		// (the hit ratio and the t-digest's p95).
		if i == 1 {
			rollupSQL = "SELECT pop, requests, bytes FROM (" + rollupSQL + ")"
		}
		got, err := resultText(ctx, db.Conn(), rollupSQL)
		if err != nil {
			t.Fatal(err)
		}
		want, err := resultText(ctx, db.Conn(), rawSQL)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || want == "" {
			t.Errorf("%s: from the rollup\n%s\nfrom access_logs\n%s", panels[i].Where, got, want)
		}
		rollupRows, rollupBytes := readRows(ctx, t, db, rollupSQL)
		rawRows, rawBytes := readRows(ctx, t, db, rawSQL)
		t.Logf("%s over %d hours: the rollup reads %d rows (%d bytes), access_logs %d rows (%d bytes): %.2f%% of the rows, %.2f%% of the bytes",
			panels[i].Where, hours, rollupRows, rollupBytes, rawRows, rawBytes, 100*float64(rollupRows)/float64(rawRows), 100*float64(rollupBytes)/float64(rawBytes))
		if rollupRows*20 > rawRows {
			t.Errorf("%s reads %d rows from the rollup, %d from access_logs: want at most 5%%", panels[i].Where, rollupRows, rawRows)
		}
	}
}
