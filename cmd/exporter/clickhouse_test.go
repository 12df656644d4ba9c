package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestRunWithClickHouse runs the exporter as a user would, with
// --clickhouse.dsn: every dataset gets its table and rows, the sink's
// self-metrics are on /metrics, and shutdown flushes.
func TestRunWithClickHouse(t *testing.T) {
	ch := testenv.ClickHouse(t)
	_, base := startSim(t, platformsim.Config{Seed: 9})
	t.Setenv("EDGEPIPE_CLICKHOUSE_DSN", ch.DSN("cdn"))
	addr := testenv.FreeAddr(t)
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
			"--web.listen-address=" + addr, "--log.level=warn"}, io.Discard, stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	}()

	conn := ch.Conn(t)
	datasets := []string{"edge_usage_by_country", "edge_errors", "origin_usage_by_country", "origin_usage", "origin_errors", "origin_offload"}
	deadline := time.Now().Add(60 * time.Second)
	for _, ds := range datasets {
		for {
			var n uint64
			err := conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM cdn.`%s`", ds)).Scan(&n)
			if err == nil && n > 0 {
				break
			}
			if time.Now().After(deadline) {
				out, _ := os.ReadFile(stderr.Name())
				t.Fatalf("no rows in cdn.%s after 60s (%v)\n%s", ds, err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"edgepipe_clickhouse_rows_written_total{dataset=\"origin_offload\"}", "edgepipe_clickhouse_queue_rows", "edgepipe_clickhouse_up 1"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestClickHouseFlags: the sink's flags are checked before anything
// connects.
func TestClickHouseFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn"}},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.cluster=c", "--clickhouse.insert-quorum=2"}},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.insert-quorum=2"}, wantErr: "only with --clickhouse.cluster"},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.cluster=c", "--clickhouse.insert-quorum=-1"}, wantErr: "--clickhouse.insert-quorum"},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.queue-rows=0"}, wantErr: "--clickhouse.queue-rows"},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn"}, wantErr: "clickhouse://"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			app := kingpin.New("t", "")
			f := addClickHouseFlags(app.Command("run", "").Default(), false)
			if _, err := app.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			sink, err := f.newSink(&host{log: slog.New(slog.DiscardHandler)}, nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				_ = sink.Close(context.Background())
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}
