package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/backfill"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestParseInstant(t *testing.T) {
	now := time.Date(2026, 11, 20, 12, 34, 56, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  bool
	}{
		{in: "now", want: now},
		{in: "", want: now},
		{in: "2026-11-01", want: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)},
		{in: "2026-11-01T06:30", want: time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC)},
		{in: "2026-11-01T06:30:00+02:00", want: time.Date(2026, 11, 1, 4, 30, 0, 0, time.UTC)},
		{in: "7d", want: now.Add(-7 * 24 * time.Hour)},
		{in: "-36h", want: now.Add(-36 * time.Hour)},
		{in: "yesterday", err: true},
	} {
		got, err := parseInstant(tc.in, now)
		if tc.err {
			if err == nil {
				t.Errorf("parseInstant(%q) = %s, want error", tc.in, got)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("parseInstant(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestBackfillCommand runs `exporter backfill` as a user would (flags,
// discovery of the demo organization, real ClickHouse), checks the request
// limits at the simulator and the stored rows, then runs it again: every
// chunk is recorded, so nothing is fetched twice.
func TestBackfillCommand(t *testing.T) {
	ch := testenv.ClickHouse(t)
	checkBackfillCommand(t, ch.DSN("cli"), "cli", nil, ch.Conn(t))
}

// TestBackfillCommand26 is TestBackfillCommand on ClickHouse 26.x (chDB
// behind testenv's server): over HTTPS, the certificate checked against
// --clickhouse.tls.ca-file, and over HTTP through a proxy that loses the
// server's answer to the first INSERT into each table, so the command
// retries rows the server had stored: every retry carries the
// deduplication token of the INSERT it retries, and count() equals
// count() FINAL in the datasets' tables and the progress table.
func TestBackfillCommand26(t *testing.T) {
	ch := testenv.ChDB(t)
	t.Run("https", func(t *testing.T) {
		checkBackfillCommand(t, ch.HTTPSDSN("cli"), "cli", []string{"--clickhouse.tls.ca-file=" + ch.CAFile()}, ch.Conn(t))
	})
	t.Run("http, answers lost", func(t *testing.T) {
		proxy := ch.LosingProxy(t)
		checkBackfillCommand(t, proxy.DSN("lost"), "lost", nil, ch.Conn(t))
		for _, table := range []string{"origin_offload", "edge_errors", backfill.ProgressTable} {
			if tokens := proxy.Tokens(table); !proxy.Lost(table) || len(tokens) < 2 || tokens[0] == "" || tokens[1] != tokens[0] {
				t.Errorf("%s: INSERT tokens %q (an answer lost: %v): want the lost INSERT's token, and the same on its retry", table, tokens, proxy.Lost(table))
			}
			q := "`lost`.`" + table + "`"
			if all, final := ch.QueryUint64(t, "SELECT count() FROM "+q), ch.QueryUint64(t, "SELECT count() FROM "+q+" FINAL"); all != final {
				t.Errorf("%s: count() %d, count() FINAL %d: a retried INSERT stored its rows twice", table, all, final)
			}
		}
	})
}

// checkBackfillCommand runs `exporter backfill` into the database db of
// dsn twice: the first run stores every settled bucket as the simulator
// has it, the second finds everything loaded.
func checkBackfillCommand(t *testing.T, dsn, db string, flags []string, conn driver.Conn) {
	sim, base := startSim(t, platformsim.Config{Seed: 5})
	t.Setenv("EDGEPIPE_CLICKHOUSE_DSN", "")

	// The day before yesterday: settled data, and the same range when the
	// command runs again.
	midnight := time.Now().UTC().Truncate(24 * time.Hour)
	from, to := midnight.Add(-48*time.Hour), midnight.Add(-24*time.Hour)
	args := []string{"backfill", "--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
		"--clickhouse.dsn=" + dsn, "--from=" + from.Format("2006-01-02"), "--to=" + to.Format(time.RFC3339),
		"--dataset=origin_offload", "--dataset=edge_errors", "--progress=lines", "--log.level=warn"}
	args = append(args, flags...)
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	// Progress is written to os.Stderr (a terminal or a log, not the
	// logger): capture it in a file, which also selects plain lines.
	realStderr := os.Stderr
	os.Stderr = stderr
	t.Cleanup(func() { os.Stderr = realStderr })
	if err := run(context.Background(), args, io.Discard, stderr); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(stderr.Name())
	if !strings.Contains(string(out), "backfill done") || !strings.Contains(string(out), "chunks (API requests)") {
		t.Errorf("no progress lines:\n%s", out)
	}
	st := sim.Stats()
	if len(st.Data) == 0 {
		t.Fatal("no data requests reached the simulator")
	}
	for _, r := range st.Data {
		if len(r.Environments) > metricsapi.MaxFilterValues || r.End.Sub(r.Start) > 24*time.Hour || r.Status != 200 {
			t.Errorf("request %s %s..%s with %d environments answered %d", r.Dataset, r.Start, r.End, len(r.Environments), r.Status)
		}
	}
	// 2 datasets × 1 day × 2 environment batches (25 environments).
	if len(st.Data) != 4 {
		t.Errorf("%d data requests, want 4", len(st.Data))
	}

	// Rows of settled buckets equal the simulator's.
	pc, err := platform.New(platform.Config{BaseURL: base, AuthURL: base, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	api := metricsapi.NewClient(pc.Metrics())
	res, err := api.Data(context.Background(), metricsapi.Query{Dataset: "origin_offload", Environments: sim.EnvironmentIDs(),
		Granularity: metricsapi.FiveMinutes, Start: from, End: to})
	if err != nil {
		t.Fatal(err)
	}
	var stored uint64
	var sum float64
	if err := conn.QueryRow(context.Background(), "SELECT count(), sum(toFloat64(requests_edge_total)) FROM `"+db+"`.origin_offload FINAL WHERE time >= toDateTime(?) AND time < toDateTime(?)",
		from.Unix(), to.Unix()).Scan(&stored, &sum); err != nil {
		t.Fatal(err)
	}
	var want float64
	i := 0
	for j, m := range res.Metrics {
		if m == "requests_edge_total" {
			i = j
		}
	}
	for _, r := range res.Rows {
		want += r.Values[i]
	}
	if stored != uint64(len(res.Rows)) || sum != want {
		t.Errorf("stored %d rows summing %v requests, simulator %d rows summing %v", stored, sum, len(res.Rows), want)
	}

	// Again: everything is recorded as loaded.
	sim.ResetStats()
	if err := run(context.Background(), args, io.Discard, stderr); err != nil {
		t.Fatal(err)
	}
	if n := len(sim.Stats().Data); n != 0 {
		t.Errorf("second run sent %d data requests, want 0", n)
	}
}
