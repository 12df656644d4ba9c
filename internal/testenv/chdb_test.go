package testenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// TestChDBServer: the ClickHouse 26.x engine behind chdb-server answers
// clickhouse-go's HTTP client over HTTP and HTTPS (certificate checked
// against the test CA), round-trips the column types the sinks write in a
// batch, reports server errors with their codes, and keeps its data across
// a kill -9.
func TestChDBServer(t *testing.T) {
	s := ChDB(t)
	if v := s.Version(t); !strings.HasPrefix(v, "26.") {
		t.Fatalf("chDB version %s, want 26.x", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.Exec(t, "CREATE DATABASE t")
	s.Exec(t, "CREATE TABLE t.x (a UInt64, s LowCardinality(String), at DateTime64(6), n Nullable(Int64), f Float64) ENGINE = ReplacingMergeTree ORDER BY a")

	opts, err := clickhouse.ParseDSN(s.HTTPSDSN("t"))
	if err != nil {
		t.Fatal(err)
	}
	opts.TLS = s.TLSConfig(t)
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, err := conn.PrepareBatch(ctx, "INSERT INTO t.x (a, s, at, n, f)")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 20, 12, 0, 0, 123456000, time.UTC)
	seven := int64(7)
	for i := range 3 {
		if err := b.Append(uint64(i), "pop", at, &seven, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert over HTTPS: %v", err)
	}
	var (
		n      uint64
		newest time.Time
		seen   string
	)
	if err := conn.QueryRow(ctx, "SELECT count(), max(at), any(s) FROM t.x FINAL").Scan(&n, &newest, &seen); err != nil {
		t.Fatal(err)
	}
	if n != 3 || !newest.Equal(at) || seen != "pop" {
		t.Errorf("read back count %d, max(at) %s, s %q; want 3, %s, pop", n, newest, seen, at)
	}

	var ex *clickhouse.Exception
	if err := s.TryExec("SELECT * FROM t.missing"); !errors.As(err, &ex) || ex.Code != 60 {
		t.Errorf("query of a missing table: %v, want exception code 60", err)
	}

	s.Kill()
	s.Start()
	if n := s.QueryUint64(t, "SELECT count() FROM t.x"); n != 3 {
		t.Errorf("%d rows after kill -9 and restart, want 3", n)
	}
}
