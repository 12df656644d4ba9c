// Package chtest compares what the ClickHouse metrics sink stored with the
// platform simulator's data, row by row and value by value. The tests of the
// sink and of the backfill share it; it is not used outside tests.
package chtest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// MetricsClient returns a Metrics API client for the simulator at base (its
// API and token endpoint), with the demo credentials and without the
// client's rate limits, so tests that move a fake clock by hours are not
// throttled.
func MetricsClient(t testing.TB, base string) *metricsapi.Client {
	t.Helper()
	unlimited := platform.Limits{Read: platform.RateLimit{Requests: -1}, Write: platform.RateLimit{Requests: -1}}
	pc, err := platform.New(platform.Config{
		BaseURL: base, AuthURL: base,
		ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret,
		RateLimits: map[string]platform.Limits{platform.ServiceMetrics: unlimited},
	})
	if err != nil {
		t.Fatal(err)
	}
	return metricsapi.NewClient(pc.Metrics())
}

// Rows are the FIVE_MINUTES buckets of one dataset keyed by RowKey, each
// with its metric values in the descriptor's metric order.
type Rows map[string][]float64

// RowKey identifies a bucket of a series: environment, label values in the
// descriptor's label order, and the bucket's start.
func RowKey(env string, labels []string, at time.Time) string {
	return env + "|" + strings.Join(labels, "|") + "|" + at.UTC().Format(time.RFC3339)
}

// Truth asks the simulator through api for every FIVE_MINUTES bucket of ds
// in [from, to) for envs, with counts rounded (and negative or missing
// counts made 0) as the sink stores them.
func Truth(t testing.TB, api *metricsapi.Client, ds *metricsapi.Dataset, envs []string, from, to time.Time) Rows {
	t.Helper()
	res, err := api.Data(context.Background(), metricsapi.Query{
		Dataset: ds.Name, Environments: envs, Granularity: metricsapi.FiveMinutes,
		Start: from, End: to,
	})
	if err != nil {
		t.Fatalf("truth for %s: %v", ds.Name, err)
	}
	out := make(Rows, len(res.Rows))
	for _, row := range res.Rows {
		labels := reorder(res.Labels, row.Labels, ds)
		vals := make([]float64, len(ds.Metrics))
		for i, m := range ds.Metrics {
			j := slices.Index(res.Metrics, m.Name)
			v := math.NaN()
			if j >= 0 {
				v = row.Values[j]
			}
			if metricsapi.Classify(m.Name).Kind == metricsapi.KindCount {
				if math.IsNaN(v) || v < 0 {
					v = 0
				}
				v = math.Round(v)
			}
			vals[i] = v
		}
		k := RowKey(row.Environment, labels, row.Time)
		if _, dup := out[k]; dup {
			t.Fatalf("simulator returned %s twice", k)
		}
		out[k] = vals
	}
	return out
}

// reorder puts label values into the descriptor's label order.
func reorder(names, values []string, ds *metricsapi.Dataset) []string {
	var out []string
	for _, d := range ds.Labels() {
		i := slices.Index(names, d.Name)
		v := ""
		if i >= 0 {
			v = values[i]
		}
		out = append(out, v)
	}
	return out
}

// Stored reads the FIVE_MINUTES rows of ds's table in database db for
// [from, to) under FINAL, keyed like Truth. A key read twice is a test
// error.
func Stored(t testing.TB, conn driver.Conn, db string, ds *metricsapi.Dataset, from, to time.Time) Rows {
	t.Helper()
	cols := []string{"environment_id"}
	for _, d := range ds.Labels() {
		// Every label as text: NUMBER dimensions come back as integers.
		cols = append(cols, "toString(`"+d.Name+"`)")
	}
	cols = append(cols, "time")
	for _, m := range ds.Metrics {
		cols = append(cols, "toFloat64(`"+m.Name+"`)")
	}
	q := fmt.Sprintf("SELECT %s FROM `%s`.`%s` FINAL WHERE granularity = 'FIVE_MINUTES' AND time >= toDateTime(%d) AND time < toDateTime(%d)",
		strings.Join(cols, ", "), db, ds.Name, from.Unix(), to.Unix())
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("read %s: %v", ds.Name, err)
	}
	defer rows.Close()
	out := make(Rows)
	nl := len(ds.Labels())
	for rows.Next() {
		var env string
		labels := make([]string, nl)
		var at time.Time
		vals := make([]float64, len(ds.Metrics))
		dest := []any{&env}
		for i := range labels {
			dest = append(dest, &labels[i])
		}
		dest = append(dest, &at)
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatalf("scan %s: %v", ds.Name, err)
		}
		k := RowKey(env, labels, at)
		if _, dup := out[k]; dup {
			t.Errorf("%s: %s twice under FINAL", ds.Name, k)
		}
		out[k] = vals
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read %s: %v", ds.Name, err)
	}
	return out
}

// Compare reports as test errors every row of want missing from got, every
// value that differs (NaN equals NaN) and every row of got not in want,
// showing the first five, and returns how many differences it found.
func Compare(t testing.TB, ds *metricsapi.Dataset, want, got Rows) (bad int) {
	t.Helper()
	for k, wv := range want {
		gv, ok := got[k]
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: missing row %s", ds.Name, k)
			}
			continue
		}
		for j := range wv {
			if !(gv[j] == wv[j] || (math.IsNaN(gv[j]) && math.IsNaN(wv[j]))) {
				if bad++; bad <= 5 {
					t.Errorf("%s %s: %s = %v, simulator %v", ds.Name, k, ds.Metrics[j].Name, gv[j], wv[j])
				}
			}
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: extra row %s", ds.Name, k)
			}
		}
	}
	return bad
}
