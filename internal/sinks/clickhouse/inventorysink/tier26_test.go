package inventorysink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorysink"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The ClickHouse 26.x tier of the inventory's tables: chDB behind
// testenv's HTTP(S) server (testenv.ChDB), written through the metrics
// sink's connection as the exporter does.

// TestTablesOn26 writes the inventory over an HTTP DSN (through a proxy
// that loses the server's answer to the first INSERT into each table, so
// the sink retries rows the server stored) and over an HTTPS DSN to
// ClickHouse 26.x: every retried INSERT carries the token of the one it
// retries, count() equals count() FINAL (no row stored twice, merges
// stopped so none could hide a copy), both tables have the deduplication
// window, and after a rename and a certificate gone FINAL shows exactly
// the latest row per key.
func TestTablesOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	for _, tc := range []struct {
		name  string
		lossy bool
		dsn   func(db string) string
		tls   clickhouse.TLSOptions
	}{
		{name: "http", lossy: true},
		{name: "https", dsn: srv.HTTPSDSN, tls: clickhouse.TLSOptions{CAFile: srv.CAFile()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := "inventory_" + tc.name
			var proxy *testenv.LosingProxy
			dsn := tc.dsn
			if tc.lossy {
				proxy = srv.LosingProxy(t)
				dsn = proxy.DSN
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// The tables made first, as a previous run would have, so
			// that merges can be stopped before anything is written.
			conn, err := clickhouse.Open(ctx, srv.DSN(db))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			schema := clickhouse.NewSchema(conn, nil)
			defer schema.Close()
			for _, tb := range []*clickhouse.Table{inventorytables.EnvironmentsTable(), inventorytables.CertificatesTable()} {
				if _, err := schema.Ensure(ctx, tb); err != nil {
					t.Fatal(err)
				}
				srv.Exec(t, "SYSTEM STOP MERGES `"+db+"`.`"+tb.Name+"`")
				create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+db+"' AND name = '"+tb.Name+"'")
				if !strings.Contains(create, "non_replicated_deduplication_window = 1000") {
					t.Errorf("%s has no deduplication window:\n%s", tb.Name, create)
				}
			}

			metrics, err := metrictables.NewSink(metrictables.SinkConfig{DSN: dsn(db), TLS: tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			defer metrics.Close(context.Background())
			open := func() *inventorysink.Sink {
				s, err := inventorysink.New(inventorysink.Config{Schemas: metrics, RetryMax: 200 * time.Millisecond, Registerer: prometheus.NewRegistry()})
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				return s
			}
			closeSink := func(s *inventorysink.Sink) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := s.Close(ctx); err != nil {
					t.Error(err)
				}
			}

			envs := []inventory.Environment{
				{ID: "env-a", Name: "production", PropertyID: "p1", Property: "shop", OrganizationID: "o1"},
				{ID: "env-b", Name: "staging", PropertyID: "p1", Property: "shop", OrganizationID: "o1"},
			}
			a1, a2, a3 := certificate("env-a", "c1", 9), certificate("env-a", "c2", 200), certificate("env-a", "c3", 60)
			a3.ActivationError, a3.Status = "no CNAME record _acme_challenge.c3.example.com", "failed"
			sink := open()
			sink.PublishEnvironments(t0, envs)
			sink.PublishCertificates(t0, "env-a", []inventory.Certificate{a1, a2, a3}, nil)
			closeSink(sink) // writes what is pending, retrying

			for _, table := range []string{inventorytables.TableEnvironments, inventorytables.TableTLSCertificates} {
				q := "`" + db + "`.`" + table + "`"
				all, final := srv.QueryUint64(t, "SELECT count() FROM "+q), srv.QueryUint64(t, "SELECT count() FROM "+q+" FINAL")
				if all != final || final == 0 {
					t.Errorf("%s: count() %d, count() FINAL %d: a retried INSERT stored its rows twice", table, all, final)
				}
				if proxy == nil {
					continue
				}
				tokens := proxy.Tokens(table)
				if !proxy.Lost(table) || len(tokens) < 2 || tokens[0] == "" || tokens[1] != tokens[0] {
					t.Errorf("%s: INSERT tokens %q: want the lost INSERT's token, and the same on its retry", table, tokens)
				}
			}

			// A rename and a certificate gone: FINAL shows the latest rows.
			later := t0.Add(time.Hour)
			envs[1].Name = "staging-eu"
			sink = open()
			sink.PublishEnvironments(later, envs)
			sink.PublishCertificates(later, "env-a", []inventory.Certificate{a1, a3}, []inventory.Certificate{a2})
			closeSink(sink)
			checkTables(t, srv.Conn(t), db, later, []string{"env-a production p1 shop o1", "env-b staging-eu p1 shop o1"},
				[]string{certLine(a1, 1, 0, later), certLine(a2, 0, 1, later), certLine(a3, 1, 0, later)})
		})
	}
}
