package inventorysink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorysink"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 11, 23, 10, 0, 17, 0, time.UTC)

func certificate(env, id string, days int) inventory.Certificate {
	return inventory.Certificate{ID: id, EnvironmentID: env, CommonName: id + ".example.com", AlternativeNames: []string{id + ".example.com", "www." + id + ".example.com"},
		Serial: "0A1B" + id, Status: "active", Generated: days < 90, Expiration: t0.Add(time.Duration(days)*24*time.Hour + 1234*time.Second),
		CreatedAt: t0.Add(-time.Hour), UpdatedAt: t0.Add(-time.Minute)}
}

// TestTablesOnClickHouse18: through the metrics sink's connection, the sink
// creates both tables on a real ClickHouse 18.16 and writes the inventory;
// `FINAL` shows the latest row per key: a renamed environment's new name, a
// certificate no longer listed as removed with its last values, expiry to
// the second. Changes published while ClickHouse is down are written once
// it is back.
func TestTablesOnClickHouse18(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	metrics, err := metrictables.NewSink(metrictables.SinkConfig{DSN: ch.DSN(db)})
	if err != nil {
		t.Fatal(err)
	}
	defer metrics.Close(context.Background())
	reg := prometheus.NewRegistry()
	sink, err := inventorysink.New(inventorysink.Config{Schemas: metrics, RetryMax: 200 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sink.Start()
	closed := false
	closeSink := func() {
		if !closed {
			closed = true
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sink.Close(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	defer closeSink()

	envs := []inventory.Environment{
		{ID: "env-a", Name: "production", PropertyID: "p1", Property: "shop", OrganizationID: "o1"},
		{ID: "env-b", Name: "staging", PropertyID: "p1", Property: "shop", OrganizationID: "o1"},
	}
	sink.PublishEnvironments(t0, envs)
	a1, a2, a3 := certificate("env-a", "c1", 9), certificate("env-a", "c2", 200), certificate("env-a", "c3", 60)
	a3.ActivationError, a3.Status = "no CNAME record _acme_challenge.c3.example.com", "failed"
	sink.PublishCertificates(t0, "env-a", []inventory.Certificate{a1, a2, a3}, nil)
	waitFor(t, func() bool { return count(t, ch, db, inventorytables.TableTLSCertificates) == 3 })

	// A rename and a certificate gone, published while ClickHouse is down.
	ch.Stop()
	later := t0.Add(time.Hour)
	envs[1].Name = "staging-eu"
	sink.PublishEnvironments(later, envs)
	sink.PublishCertificates(later, "env-a", []inventory.Certificate{a1, a3}, []inventory.Certificate{a2})
	time.Sleep(time.Second) // a few failed attempts
	ch.Start()
	closeSink() // writes what is pending
	if n := testutil.ToFloat64(mustCounter(t, reg, "edgepipe_clickhouse_inventory_write_errors_total")); n == 0 {
		t.Error("no failed write counted while ClickHouse was down")
	}

	checkTables(t, ch.Conn(t), db, later, []string{"env-a production p1 shop o1", "env-b staging-eu p1 shop o1"},
		[]string{certLine(a1, 1, 0, later), certLine(a2, 0, 1, later), certLine(a3, 1, 0, later)})
}

// checkTables compares the tables of database db under FINAL with
// envs ("<id> <name> <property id> <property> <organization>", all seen at
// seen) and certs (certLine of env-a's certificates).
func checkTables(t *testing.T, conn driver.Conn, db string, seen time.Time, envs, certs []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, "SELECT environment_id, environment, property_id, property, organization_id, seen_at FROM `"+db+"`.environments FINAL ORDER BY environment_id")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id, name, pid, prop, org string
		var at time.Time
		if err := rows.Scan(&id, &name, &pid, &prop, &org, &at); err != nil {
			t.Fatal(err)
		}
		if !at.Equal(seen) {
			t.Errorf("environment %s seen at %s, want %s", id, at.UTC().Format(time.RFC3339), seen.Format(time.RFC3339))
		}
		got = append(got, fmt.Sprintf("%s %s %s %s %s", id, name, pid, prop, org))
	}
	rows.Close()
	if strings.Join(got, "\n") != strings.Join(envs, "\n") {
		t.Errorf("environments FINAL:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(envs, "\n"))
	}

	rows, err = conn.Query(ctx, "SELECT certificate_id, common_name, alternative_names, serial, status, generated, activation_error, expiration, removed, seen_at FROM `"+
		db+"`.tls_certificates FINAL WHERE environment_id = 'env-a' ORDER BY certificate_id")
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for rows.Next() {
		var id, cn, serial, status, actErr string
		var names []string
		var generated, removed uint8
		var exp, at time.Time
		if err := rows.Scan(&id, &cn, &names, &serial, &status, &generated, &actErr, &exp, &removed, &at); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %v %s %s %d %q %d %d %s", id, cn, names, serial, status, generated, actErr, exp.Unix(), removed, at.UTC().Format(time.RFC3339)))
	}
	rows.Close()
	if strings.Join(got, "\n") != strings.Join(certs, "\n") {
		t.Errorf("tls_certificates FINAL:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(certs, "\n"))
	}
}

// certLine is a row of tls_certificates as checkTables shows it.
func certLine(c inventory.Certificate, generated, removed int, seen time.Time) string {
	return fmt.Sprintf("%s %s %v %s %s %d %q %d %d %s", c.ID, c.CommonName, c.AlternativeNames, c.Serial, c.Status, generated, c.ActivationError,
		c.Expiration.Unix(), removed, seen.Format(time.RFC3339))
}

func count(t *testing.T, ch *testenv.ClickHouseServer, db, table string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n uint64
	conn := ch.Conn(t)
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+"."+table+" FINAL").Scan(&n); err != nil {
		if clickhouse.ErrorCode(err) == 60 { // not created yet
			return 0
		}
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
	}
}

// mustCounter returns the sum of a registered counter family as a
// collector testutil can read.
func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	c.Add(sum)
	return c
}
