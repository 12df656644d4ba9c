package metrictables_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables/chtest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// BenchmarkInsertEdgeUsageByCountry measures rows per second written to
// ClickHouse for the widest dataset (edge_usage_by_country: one label and
// 33 metrics), with the simulator's real rows, in batches of several sizes
// (one poll of 25 environments is about 350 rows per bucket). It covers
// the sink's whole write path: conversion to columns, the native-protocol
// INSERT and the server's work.
func BenchmarkInsertEdgeUsageByCountry(b *testing.B) {
	ch := testenv.ClickHouse(b)
	at := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	sim, err := platformsim.New(platformsim.Config{Seed: 3, Now: func() time.Time { return at }, Environments: 25})
	if err != nil {
		b.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	api := chtest.MetricsClient(b, base)
	ds, err := api.Dataset(context.Background(), "edge_usage_by_country")
	if err != nil {
		b.Fatal(err)
	}
	res, err := api.Data(context.Background(), metricsapi.Query{
		Dataset: ds.Name, Environments: sim.EnvironmentIDs(), Granularity: metricsapi.FiveMinutes,
		Start: at.Add(-6 * time.Hour), End: at,
	})
	if err != nil {
		b.Fatal(err)
	}
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN("bench"), Logger: testLogger(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close(context.Background())
	for _, size := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("rows=%d", size), func(b *testing.B) {
			batch := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: res.Labels, Metrics: res.Metrics}
			for i := 0; len(batch.Updates) < size; i++ {
				batch.Updates = append(batch.Updates, schedule.Update{Row: res.Rows[i%len(res.Rows)]})
			}
			// Create the table outside the timed part.
			if _, err := sink.Write(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := sink.Write(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
