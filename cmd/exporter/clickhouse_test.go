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
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn"}},
		{args: []string{"--clickhouse.dsn=https://h:8443/cdn?secure=true", "--clickhouse.tls.server-name=ch.example", "--clickhouse.tls.insecure-skip-verify"}},
		{args: []string{"--clickhouse.dsn=https://h:8443/cdn"}, wantErr: "https without TLS"},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn", "--clickhouse.tls.server-name=x"}, wantErr: "TLS options need a DSN with TLS"},
		{args: []string{"--clickhouse.dsn=https://h:8443/cdn?secure=true", "--clickhouse.tls.ca-file=/nonexistent.pem"}, wantErr: "CA file"},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn", "--clickhouse.cluster=c"}, wantErr: "needs the native protocol"},
		{args: []string{"--clickhouse.dsn=ftp://h/cdn"}, wantErr: "ClickHouse DSN"},
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

// TestHTTPDSNTo1816StopsAtStart: an HTTP DSN to ClickHouse 18.16, whose
// HTTP interface clickhouse-go cannot talk to, stops the exporter at start
// with an error naming the server's version and the native protocol,
// instead of retrying forever; so does the backfill command.
func TestHTTPDSNTo1816StopsAtStart(t *testing.T) {
	ch := testenv.ClickHouse(t)
	_, base := startSim(t, platformsim.Config{Seed: 9})
	t.Setenv("EDGEPIPE_CLICKHOUSE_DSN", "")
	dsn := "--clickhouse.dsn=http://" + ch.HTTPAddr() + "/cdn"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID, "--web.listen-address=" + testenv.FreeAddr(t), "--log.level=warn", dsn},
		{"backfill", "--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID, "--from=2026-11-01", "--to=2026-11-02", "--dataset=edge_errors", "--progress=none", "--log.level=warn", dsn},
	} {
		err := run(ctx, args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "ClickHouse 18.16.1") || !strings.Contains(err.Error(), "clickhouse://") {
			t.Errorf("%s: %v, want an error naming ClickHouse 18.16.1 and the native protocol", args[0], err)
		}
	}
}
