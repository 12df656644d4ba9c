package metrictables_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

var _ schedule.ResumeSource = (*metrictables.Sink)(nil)
var _ schedule.Publisher = (*metrictables.Sink)(nil)

// TestResumePoints: newest stored bucket per environment; the table's newest
// for an environment without rows; bounded by MaxBackfill; nothing for a
// missing table or another granularity.
func TestResumePoints(t *testing.T) {
	ch := testenv.ClickHouse(t)
	now := time.Date(2026, 11, 20, 12, 7, 0, 0, time.UTC)
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN("resume"), Logger: testLogger(t),
		Now: func() time.Time { return now }, MaxBackfill: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ds := &metricsapi.Dataset{Name: "origin_offload",
		Dimensions: []metricsapi.Dimension{{Name: "time", Type: metricsapi.TypeDate}, {Name: "environment_id", Type: metricsapi.TypeString}, {Name: "http_method", Type: metricsapi.TypeString}},
		Metrics:    []metricsapi.Metric{{Name: "requests_edge_total", Type: metricsapi.TypeNumber}}}
	ctx := context.Background()

	got, err := sink.Resume(ctx, ds, metricsapi.FiveMinutes, []string{"a"})
	if err != nil || len(got) != 0 {
		t.Fatalf("missing table: %v, %v; want empty", got, err)
	}

	row := func(env string, at time.Time) schedule.Update {
		return schedule.Update{Row: metricsapi.Row{Time: at, Environment: env, Labels: []string{"GET"}, Values: []float64{1}}}
	}
	b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: []string{"http_method"}, Metrics: []string{"requests_edge_total"},
		Updates: []schedule.Update{
			row("a", now.Add(-3*time.Hour).Truncate(5*time.Minute)),
			row("a", now.Add(-2*time.Hour).Truncate(5*time.Minute)),
			row("b", now.Add(-30*time.Hour).Truncate(5*time.Minute)),
		}}
	if n, err := sink.Write(ctx, b); err != nil || n != 3 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	hour := &schedule.Batch{Dataset: ds, Granularity: metricsapi.Hour, Labels: b.Labels, Metrics: b.Metrics,
		Updates: []schedule.Update{row("a", now.Add(-time.Hour).Truncate(time.Hour))}}
	if _, err := sink.Write(ctx, hour); err != nil {
		t.Fatal(err)
	}

	got, err = sink.Resume(ctx, ds, metricsapi.FiveMinutes, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{
		"a": time.Date(2026, 11, 20, 10, 5, 0, 0, time.UTC), // newest of a (the HOUR row does not count)
		"b": time.Date(2026, 11, 19, 12, 5, 0, 0, time.UTC), // 30h ago, bounded to now−24h
		"c": time.Date(2026, 11, 20, 10, 5, 0, 0, time.UTC), // no rows: the table's newest
	}
	for e, w := range want {
		if !got[e].Equal(w) {
			t.Errorf("resume %s = %s, want %s", e, got[e], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("resume = %v, want %v", got, want)
	}
	got, err = sink.Resume(ctx, ds, metricsapi.Day, []string{"a"})
	if err != nil || len(got) != 0 {
		t.Errorf("granularity without rows: %v, %v; want empty", got, err)
	}
}

// TestNewMetricAddsColumn: a metric the descriptor gains later becomes a
// new column; old rows keep theirs and new rows fill it.
func TestNewMetricAddsColumn(t *testing.T) {
	ch := testenv.ClickHouse(t)
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN("migrate"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx := context.Background()
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	ds := &metricsapi.Dataset{Name: "edge_errors",
		Dimensions: []metricsapi.Dimension{{Name: "time", Type: metricsapi.TypeDate}, {Name: "environment_id", Type: metricsapi.TypeString},
			{Name: "http_status_code", Type: metricsapi.TypeNumber}},
		Metrics: []metricsapi.Metric{{Name: "requests_edge_total", Type: metricsapi.TypeNumber}}}
	b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: []string{"http_status_code"}, Metrics: []string{"requests_edge_total"},
		Updates: []schedule.Update{{Row: metricsapi.Row{Time: at, Environment: "e", Labels: []string{"503"}, Values: []float64{7}}}}}
	if _, err := sink.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	ds2 := *ds
	ds2.Metrics = append(ds2.Metrics, metricsapi.Metric{Name: "requests_error_ratio", Type: metricsapi.TypeNumber})
	b2 := &schedule.Batch{Dataset: &ds2, Granularity: metricsapi.FiveMinutes, Labels: b.Labels, Metrics: []string{"requests_edge_total", "requests_error_ratio"},
		Updates: []schedule.Update{{Row: metricsapi.Row{Time: at.Add(5 * time.Minute), Environment: "e", Labels: []string{"503"}, Values: []float64{9, 0.25}}}}}
	if _, err := sink.Write(ctx, b2); err != nil {
		t.Fatal(err)
	}
	conn := ch.Conn(t)
	var typ string
	if err := conn.QueryRow(ctx, "SELECT type FROM system.columns WHERE database = 'migrate' AND table = 'edge_errors' AND name = 'requests_error_ratio'").Scan(&typ); err != nil {
		t.Fatalf("new column missing: %v", err)
	}
	if typ != "Float64" {
		t.Errorf("requests_error_ratio is %s, want Float64", typ)
	}
	var status int64
	var total uint64
	var ratio float64
	if err := conn.QueryRow(ctx, "SELECT http_status_code, requests_edge_total, requests_error_ratio FROM migrate.edge_errors FINAL WHERE time = toDateTime(?)", at.Add(5*time.Minute).Unix()).Scan(&status, &total, &ratio); err != nil {
		t.Fatal(err)
	}
	if status != 503 || total != 9 || ratio != 0.25 {
		t.Errorf("new row = %d %d %v, want 503 9 0.25", status, total, ratio)
	}

	// A new dimension joins the sorting key, so rows differing only in it
	// stay apart under FINAL.
	ds3 := ds2
	ds3.Dimensions = append(append([]metricsapi.Dimension{}, ds2.Dimensions...), metricsapi.Dimension{Name: "country_code", Type: metricsapi.TypeString})
	t3 := at.Add(10 * time.Minute)
	b3 := &schedule.Batch{Dataset: &ds3, Granularity: metricsapi.FiveMinutes, Labels: []string{"http_status_code", "country_code"}, Metrics: b2.Metrics,
		Updates: []schedule.Update{
			{Row: metricsapi.Row{Time: t3, Environment: "e", Labels: []string{"503", "de"}, Values: []float64{1, 0.5}}},
			{Row: metricsapi.Row{Time: t3, Environment: "e", Labels: []string{"503", "fr"}, Values: []float64{2, 0.5}}},
		}}
	if _, err := sink.Write(ctx, b3); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := conn.QueryRow(ctx, "SELECT sorting_key FROM system.tables WHERE database = 'migrate' AND name = 'edge_errors'").Scan(&key); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(key, "country_code") {
		t.Errorf("sorting key %q does not end in the new dimension", key)
	}
	if n := countRows(t, conn, fmt.Sprintf("SELECT count() FROM migrate.edge_errors FINAL WHERE time = toDateTime(%d)", t3.Unix())); n != 2 {
		t.Errorf("%d rows for two countries under FINAL, want 2", n)
	}
}

// TestIncompatibleColumnNamed: a metrics column of a type that cannot take
// the sink's values (a Date for a counter) fails the write with the column
// and the ALTER TABLE that fixes it, not with the driver's conversion
// error; once altered, the same rows are written.
func TestIncompatibleColumnNamed(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+db+".edge_errors (time DateTime, granularity String, environment_id String, version UInt64, requests_edge_total Date) "+
		"ENGINE = ReplacingMergeTree(version) ORDER BY (granularity, environment_id, time)")
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN(db), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx := context.Background()
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	ds := &metricsapi.Dataset{Name: "edge_errors",
		Dimensions: []metricsapi.Dimension{{Name: "time", Type: metricsapi.TypeDate}, {Name: "environment_id", Type: metricsapi.TypeString}},
		Metrics:    []metricsapi.Metric{{Name: "requests_edge_total", Type: metricsapi.TypeNumber}}}
	b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Metrics: []string{"requests_edge_total"},
		Updates: []schedule.Update{{Row: metricsapi.Row{Time: at, Environment: "e", Values: []float64{7}}}}}
	_, err = sink.Write(ctx, b)
	var se *clickhouse.SchemaError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "column requests_edge_total of table edge_errors has type Date, but edgepipe writes UInt64 values into it") ||
		!strings.Contains(err.Error(), "ALTER TABLE `edge_errors` MODIFY COLUMN `requests_edge_total` UInt64") {
		t.Fatalf("write into a Date counter column: %v; want a SchemaError naming the column and the ALTER TABLE", err)
	}
	ch.Exec(t, "ALTER TABLE "+db+".edge_errors MODIFY COLUMN requests_edge_total UInt64")
	if _, err := sink.Write(ctx, b); err != nil {
		t.Fatalf("write after the ALTER: %v", err)
	}
	var total uint64
	if err := ch.Conn(t).QueryRow(ctx, "SELECT requests_edge_total FROM "+db+".edge_errors FINAL").Scan(&total); err != nil || total != 7 {
		t.Fatalf("stored %d, %v; want 7", total, err)
	}
}
