package logtable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// rollupRow is what the rollup and access_logs FINAL say of one key
// (environment, minute, status code, cache status, POP).
type rollupRow struct{ requests, bytes uint64 }

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
		var bytes int64
		if err := rows.Scan(&k, &r.requests, &bytes); err != nil {
			t.Fatal(err)
		}
		r.bytes = uint64(bytes)
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

const rollupKey = "concat(environment_id, ' ', toString(minute), ' ', toString(status_code), ' ', cache_status, ' ', pop)"

// compareRollup reads the rollup of database db and the same aggregates
// of access_logs FINAL, key by key: what the rollup holds, what FINAL
// holds, and the keys where they differ (each "key: rollup … final …").
func compareRollup(ctx context.Context, t *testing.T, conn driver.Conn, db string) (rollup, final rollupRow, diff []string) {
	t.Helper()
	got := rollupRows(ctx, t, conn, "SELECT "+rollupKey+" AS k, toUInt64(countMerge(requests)), toInt64(sumMerge(bytes_out)) FROM `"+db+"`.access_logs_1m GROUP BY k")
	want := rollupRows(ctx, t, conn, "SELECT "+rollupKey+" AS k, toUInt64(count()), toInt64(sum(bytes_out)) FROM (SELECT environment_id, toStartOfMinute(toDateTime(timestamp)) AS minute, "+
		"status_code, cache_status, pop, bytes_out FROM `"+db+"`.access_logs FINAL) GROUP BY k")
	for _, k := range slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, rollupRow) bool) {
		for k, v := range got {
			yield(k, v)
		}
		for k, v := range want {
			yield(k, v)
		}
	}))) {
		g, w := got[k], want[k]
		rollup.requests += g.requests
		rollup.bytes += g.bytes
		final.requests += w.requests
		final.bytes += w.bytes
		if g != w {
			diff = append(diff, fmt.Sprintf("%s: rollup %d requests %d bytes, FINAL %d requests %d bytes", k, g.requests, g.bytes, w.requests, w.bytes))
		}
	}
	return rollup, final, diff
}

// requireRollupExact fails the test unless the rollup of db equals
// access_logs FINAL key by key and holds want records.
func requireRollupExact(ctx context.Context, t *testing.T, conn driver.Conn, db string, want uint64) {
	t.Helper()
	rollup, final, diff := compareRollup(ctx, t, conn, db)
	if len(diff) > 0 || rollup.requests != want || final.requests != want {
		t.Fatalf("rollup %d requests, access_logs FINAL %d, want %d; %d keys differ:\n%s", rollup.requests, final.requests, want, len(diff),
			strings.Join(diff[:min(len(diff), 10)], "\n"))
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
			"    toStartOfMinute(toDateTime(`timestamp`)) AS minute,\n    status_code,\n    cache_status,\n    pop,\n    countState() AS requests,\n" +
			"    sumState(bytes_out) AS bytes_out,\n    quantileTDigestState(total_time) AS total_time\nFROM `cdn`.`access_logs`\n" +
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

// TestRollupOn1816 runs the receiver's sink against ClickHouse 18.16 and
// compares the per-minute rollup with access_logs FINAL key by key.
func TestRollupOn1816(t *testing.T) {
	srv := testenv.ClickHouse(t)
	db := srv.NewDatabase(t)
	sink := newSink(t, Config{DSN: srv.DSN(db)})
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	batches := sampleBatches(t, 8, 250)
	deliverAll(ctx, t, sink, batches[:5])
	requireRollupExact(ctx, t, srv.Conn(t), db, 5*250)
}
