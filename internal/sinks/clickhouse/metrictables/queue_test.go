package metrictables_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func offloadBatch(at time.Time, envs ...string) *schedule.Batch {
	ds := &metricsapi.Dataset{Name: "origin_offload",
		Dimensions: []metricsapi.Dimension{{Name: "time", Type: metricsapi.TypeDate}, {Name: "environment_id", Type: metricsapi.TypeString}},
		Metrics:    []metricsapi.Metric{{Name: "requests_edge_total", Type: metricsapi.TypeNumber}}}
	b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: []string{}, Metrics: []string{"requests_edge_total"}}
	for i, e := range envs {
		b.Updates = append(b.Updates, schedule.Update{Row: metricsapi.Row{Time: at, Environment: e, Values: []float64{float64(i + 1)}}})
	}
	return b
}

// TestQueueOverflowDropsAndCounts: with ClickHouse unreachable, Publish
// returns at once, and a batch beyond the queue's capacity is dropped and
// counted.
func TestQueueOverflowDropsAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: "clickhouse://127.0.0.1:1/x", QueueRows: 5, Registerer: reg,
		Logger: testLogger(t), RetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sink.Start()
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		start := time.Now()
		if err := sink.Publish(context.Background(), offloadBatch(at.Add(time.Duration(i)*5*time.Minute), "a", "b")); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Publish blocked for %s", d)
		}
	}
	if q := sink.QueuedRows(); q != 4 {
		t.Errorf("queued %d rows, want 4 (the third batch does not fit in 5)", q)
	}
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 2 {
		t.Errorf("dropped rows = %v, want 2", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = sink.Close(ctx) // ClickHouse never came: the queued rows are dropped at the deadline
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 6 {
		t.Errorf("dropped rows after Close = %v, want 6", d)
	}
}

// TestCloseFlushes: rows published just before Close are written.
func TestCloseFlushes(t *testing.T) {
	ch := testenv.ClickHouse(t)
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN("flush"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	sink.Start()
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	for i := range 5 {
		if err := sink.Publish(context.Background(), offloadBatch(at.Add(time.Duration(i)*5*time.Minute), "a", "b", "c")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sink.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, ch.Conn(t), "SELECT count() FROM flush.origin_offload FINAL"); n != 15 {
		t.Errorf("%d rows after Close, want 15", n)
	}
	if err := sink.Publish(context.Background(), offloadBatch(at, "a")); err == nil {
		t.Error("Publish after Close succeeded")
	}
}

// TestRevisionReplacesRow: a revision is a full row with a newer version;
// FINAL shows one row per key with the revision's values, even when the
// first sighting and the revision reach ClickHouse in one INSERT.
func TestRevisionReplacesRow(t *testing.T) {
	ch := testenv.ClickHouse(t)
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN("rev"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	first := offloadBatch(at, "a", "b") // a=1, b=2
	rev := offloadBatch(at, "a")
	rev.Updates[0].Row.Values = []float64{40}
	rev.Updates[0].Previous = []float64{1}
	// Queued before the writer starts: both land in one INSERT.
	for _, b := range []*schedule.Batch{first, rev} {
		if err := sink.Publish(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	sink.Start()
	flush(t, sink)
	// And a second revision in an INSERT of its own.
	rev2 := offloadBatch(at, "b")
	rev2.Updates[0].Row.Values = []float64{50}
	rev2.Updates[0].Previous = []float64{2}
	if err := sink.Publish(context.Background(), rev2); err != nil {
		t.Fatal(err)
	}
	flush(t, sink)
	if err := sink.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn := ch.Conn(t)
	if n := countRows(t, conn, "SELECT count() FROM rev.origin_offload"); n != 4 {
		t.Errorf("%d rows written, want 4", n)
	}
	for env, want := range map[string]uint64{"a": 40, "b": 50} {
		rows, err := conn.Query(context.Background(), "SELECT requests_edge_total FROM rev.origin_offload FINAL WHERE environment_id = ?", env)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for rows.Next() {
			var v uint64
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			got = append(got, v)
		}
		rows.Close()
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s under FINAL: %v, want [%d]", env, got, want)
		}
	}
}
