package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
			"--web.listen-address=" + addr, "--log.level=warn"}, stderr)
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
