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
// in database on a single server of version v, as the receiver's sink does.
func accessLogsDDL(t *testing.T, database string, v clickhouse.Version, fields []accesslog.Field) []string {
	t.Helper()
	spec, err := logtable.TableSpec(v, fields, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return clickhouse.CreateStatements(database, "", v, spec)
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
// without FINAL, so every panel must collapse redeliveries itself
// (uniqExact of the record identity, or LIMIT 1 BY it). Each panel's
// result on a table holding every record twice (two parts, merges stopped,
// as after redeliveries not merged yet) equals its result on a table
// holding every record once.
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
		return db
	}
	once, twice := open("logs_once", 1), open("logs_twice", 2)
	var raw uint64
	if err := twice.Conn().QueryRow(ctx, "SELECT count() FROM access_logs").Scan(&raw); err != nil || raw != 800 {
		t.Fatalf("the doubled table holds %d rows (%v), want 800", raw, err)
	}
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

// TestLastHourReadsFewRows measures what a "last hour" panel reads from an
// access_logs holding 30 days (about 1.5 million records of two
// environments): system.query_log's read_rows for the dashboard's Requests
// and Top paths panels, on the receiver's table layout (partitioned by
// day, sorted by environment and hour ahead of the record identity) and,
// for comparison, on the old layout (sorted by the identity only). The new
// layout must read at most 3% of the rows.
func TestLastHourReadsFewRows(t *testing.T) {
	srv := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var panels []Query
	var dash Dashboard
	for _, d := range loadDashboards(t) {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Language == ClickHouseSQL && (strings.HasPrefix(q.Where, `panel "Requests"`) || strings.HasPrefix(q.Where, `panel "Top paths"`)) {
				panels, dash = append(panels, q), d
			}
		}
	}
	if len(panels) != 2 {
		t.Fatalf("found %d of the Requests and Top paths panels", len(panels))
	}
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
			if slices.Contains([]string{"timestamp", "uuid", "status_code", "path", "bytes_out", "total_time"}, f.Code) {
				fields = append(fields, f)
			}
		}
		stmts := accessLogsDDL(t, database, db.Version(), fields)
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
		if err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (environment_id, agent_id, datestamp, seq_num, record_key, record_index, timestamp, uuid, status_code, path, bytes_out, total_time, insert_version)
			SELECT if(number %% 2 = 0, 'env-a', 'env-b'), 'agent-1', '20260101', toInt64(intDiv(number, 100)), '', toUInt32(number %% 100),
				toDateTime(%d - intDiv(number, 2) * %d / %d), toString(number), 200, concat('/p/', toString(number %% 11)), number %% 1000, 0.1, toUInt64(1)
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
			id := fmt.Sprintf("%s-%d", database, time.Now().UnixNano())
			qctx := ch.Context(ctx, ch.WithQueryID(id), ch.WithSettings(ch.Settings{"log_queries": 1}))
			if _, err := resultText(qctx, db.Conn(), sql); err != nil {
				t.Fatalf("%s: %v\n%s", q.Where, err, sql)
			}
			var read uint64
			deadline := time.Now().Add(15 * time.Second)
			for {
				if err := db.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
					t.Fatal(err)
				}
				err := db.Conn().QueryRow(ctx, "SELECT read_rows FROM system.query_log WHERE type = 2 AND query_id = "+clickhouse.QuoteString(id)).Scan(&read)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("read_rows of %s: %v", q.Where, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			out[q.Where] = float64(read) / float64(rows)
			t.Logf("%s layout, last hour, panel %s: read_rows %d of %d (%.2f%%)", layout, q.Where, read, rows, 100*out[q.Where])
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
