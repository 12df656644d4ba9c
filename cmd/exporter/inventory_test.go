package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// inventoryTruth returns the inventory series the simulator's world calls
// for: cdn_environment_info of every environment served, and the three
// certificate series of each of their certificates.
func inventoryTruth(t *testing.T, sim *platformsim.Server) map[string]float64 {
	t.Helper()
	slugs := map[string]string{}
	for _, p := range sim.Properties() {
		slugs[p.ID] = p.Slug
	}
	want := map[string]float64{}
	for _, e := range sim.Environments() {
		want[seriesKey("cdn_environment_info", map[string]string{"environment_id": e.ID, "environment": e.Name,
			"property_id": e.PropertyID, "property": slugs[e.PropertyID], "organization_id": platformsim.DemoOrganizationID})] = 1
		certs, _ := sim.TLSCertificates(e.ID)
		for _, c := range certs {
			want[seriesKey("cdn_tls_certificate_expiry_timestamp_seconds", map[string]string{
				"environment_id": e.ID, "certificate_id": c.ID, "common_name": c.CommonName})] = float64(c.Expiration.Unix())
			want[seriesKey("cdn_tls_certificate_info", map[string]string{"environment_id": e.ID, "certificate_id": c.ID,
				"common_name": c.CommonName, "serial": c.Serial, "status": c.Status, "generated": strconv.FormatBool(c.Generated)})] = 1
			failed := 0.0
			if c.ActivationError != "" {
				failed = 1
			}
			want[seriesKey("cdn_tls_certificate_activation_failed", map[string]string{"environment_id": e.ID, "certificate_id": c.ID})] = failed
		}
	}
	return want
}

// checkInventory compares the scraped inventory series with want exactly.
func checkInventory(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for _, d := range inventoryDiff(got, want, 10) {
		t.Error(d)
	}
}

// inventoryDiff lists up to limit differences between the scraped
// inventory series and the wanted ones.
func inventoryDiff(got, want map[string]float64, limit int) []string {
	var diff []string
	for k, w := range want {
		if v, ok := got[k]; !ok || v != w {
			diff = append(diff, fmt.Sprintf("%s = %v (present %v), want %v", k, v, ok, w))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; inventorySeries(k) && !ok {
			diff = append(diff, fmt.Sprintf("unexpected series %s = %v", k, v))
		}
	}
	slices.Sort(diff)
	if len(diff) > limit {
		diff = append(diff[:limit], fmt.Sprintf("… and %d more", len(diff)-limit))
	}
	return diff
}

// TestInventoryMetrics runs the exporter against the simulator over real
// HTTP: cdn_environment_info names every environment as the simulator does,
// and the certificate series equal the simulator's certificates, expiry to
// the second, for an environment of 251 certificates too (three pages);
// promtool finds nothing to complain about. A renamed environment shows
// its new name after the next discovery, and no series of its old name.
func TestInventoryMetrics(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 9, Properties: 3}})
	big := te.sim.EnvironmentIDs()[4]
	if _, err := te.sim.AddTLSCertificates(big, 250); err != nil {
		t.Fatal(err)
	}
	te.advance(time.Hour) // the first pass ends, the second begins
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	want := inventoryTruth(t, te.sim)
	certs, _ := te.sim.TLSCertificates(big)
	if len(certs) <= platform.PageSize {
		t.Fatalf("%d certificates fit one page", len(certs))
	}
	checkInventory(t, got, want)
	for _, k := range []string{`edgepipe_inventory_up{kind=environments}`, `edgepipe_inventory_up{kind=tls_certificates}`} {
		if got[k] != 1 {
			t.Errorf("%s = %v, want 1", k, got[k])
		}
	}
	// The first pass: one request per environment, three for the big one;
	// then the second pass has begun.
	if n := te.sim.Stats().Count("GET /config/v0.1/tls-certs", 200); n < 8+3+1 {
		t.Errorf("%d certificate list requests, want at least 12: a pass over 9 environments, one of three pages, and the next pass begun", n)
	}

	env := te.sim.Environments()[2]
	if _, err := te.sim.RenameEnvironment(env.ID, "renamed-env"); err != nil {
		t.Fatal(err)
	}
	te.advance(5 * time.Minute) // the next discovery
	_, got = te.scrape()
	checkInventory(t, got, inventoryTruth(t, te.sim))
	for k := range got {
		if strings.Contains(k, "environment="+env.Name+",environment_id="+env.ID) {
			t.Errorf("old name still exported: %s", k)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for the logger's and the test's
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestInventoryWithoutConfigScope: an API client without app.config gets
// every dataset exported as usual and every environment named, no
// certificate series, edgepipe_inventory_up{kind="tls_certificates"} 0, and
// one log line naming the scope however many passes the platform refuses.
func TestInventoryWithoutConfigScope(t *testing.T) {
	logs := &lockedBuffer{}
	te := startExporter(t, testOptions{logs: logs, sim: platformsim.Config{Environments: 6,
		Clients: []platformsim.Client{platformsim.DemoClient(platformsim.ScopeMetrics, platformsim.ScopeAccounts)}}})
	for range 3 {
		te.advance(time.Hour)
	}
	at := te.clock.Now()
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	truth(t, te.sim, te.sim.EnvironmentIDs(), te.sim.DatasetNames(), te.firstFrom, metricsapi.FiveMinutes.Truncate(at), at).check(t, got)
	want := inventoryTruth(t, te.sim)
	for k := range want {
		if strings.HasPrefix(k, "cdn_tls_certificate_") {
			delete(want, k)
		}
	}
	checkInventory(t, got, want)
	if v, ok := got[`edgepipe_inventory_up{kind=tls_certificates}`]; !ok || v != 0 {
		t.Errorf("edgepipe_inventory_up{kind=tls_certificates} = %v (present %v), want 0", v, ok)
	}
	if got[`edgepipe_inventory_up{kind=environments}`] != 1 || got[`edgepipe_discovery_up{}`] != 1 {
		t.Errorf("environments or discovery not up: %v %v", got[`edgepipe_inventory_up{kind=environments}`], got[`edgepipe_discovery_up{}`])
	}
	out := logs.String()
	if n := strings.Count(out, "TLS certificates are not exported"); n != 1 || !strings.Contains(out, platform.ScopeConfig) {
		t.Errorf("%d lines say why certificates are missing, want 1 naming %s:\n%s", n, platform.ScopeConfig, out)
	}
	if n := te.sim.Stats().Count("GET /config/v0.1/tls-certs", 0); n != 0 {
		t.Errorf("%d certificate requests reached the API without a token for it", n)
	}
}

// TestInventoryTables: with the ClickHouse sink the inventory lands in the
// environments and tls_certificates tables of a real ClickHouse 18.16: under
// FINAL one row per environment with the simulator's names, one row per
// certificate with its expiry to the second.
func TestInventoryTables(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	chExt := &clickhouseExtension{flags: &clickhouseFlags{dsn: ch.DSN(db), queueRows: 1_000_000, maxBackfill: model.Duration(24 * time.Hour)}}
	te := startExporter(t, testOptions{exts: []extension{chExt}, sim: platformsim.Config{Environments: 5, Properties: 2}})
	te.advance(time.Minute) // every environment's certificates listed
	slugs := map[string]string{}
	for _, p := range te.sim.Properties() {
		slugs[p.ID] = p.Slug
	}
	var wantEnvs, wantCerts []string
	for _, e := range te.sim.Environments() {
		wantEnvs = append(wantEnvs, fmt.Sprintf("%s %s %s %s %s", e.ID, e.Name, e.PropertyID, slugs[e.PropertyID], platformsim.DemoOrganizationID))
		certs, _ := te.sim.TLSCertificates(e.ID)
		for _, c := range certs {
			wantCerts = append(wantCerts, fmt.Sprintf("%s %s %s %s %s %d %q", e.ID, c.ID, c.CommonName, c.Serial, c.Status, c.Expiration.Unix(), c.ActivationError))
		}
	}
	conn := ch.Conn(t)
	query := func(sql string, scan func(scan func(...any) error) string) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := conn.Query(ctx, sql)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			out = append(out, scan(rows.Scan))
		}
		return out, rows.Err()
	}
	var gotEnvs, gotCerts []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		gotEnvs, err = query("SELECT environment_id, environment, property_id, property, organization_id FROM "+db+".environments FINAL ORDER BY environment_id",
			func(scan func(...any) error) string {
				var id, name, pid, prop, org string
				if err := scan(&id, &name, &pid, &prop, &org); err != nil {
					t.Fatal(err)
				}
				return fmt.Sprintf("%s %s %s %s %s", id, name, pid, prop, org)
			})
		if err == nil {
			gotCerts, err = query("SELECT environment_id, certificate_id, common_name, serial, status, expiration, activation_error FROM "+db+
				".tls_certificates FINAL WHERE removed = 0 ORDER BY environment_id, certificate_id",
				func(scan func(...any) error) string {
					var env, id, cn, serial, status, actErr string
					var exp time.Time
					if err := scan(&env, &id, &cn, &serial, &status, &exp, &actErr); err != nil {
						t.Fatal(err)
					}
					return fmt.Sprintf("%s %s %s %s %s %d %q", env, id, cn, serial, status, exp.Unix(), actErr)
				})
		}
		if err == nil && len(gotEnvs) == len(wantEnvs) && len(gotCerts) == len(wantCerts) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d environments, %d certificates (want %d, %d), err %v", len(gotEnvs), len(gotCerts), len(wantEnvs), len(wantCerts), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sortStrings := func(s []string) string {
		return strings.Join(slices.Sorted(slices.Values(s)), "\n")
	}
	if g, w := sortStrings(gotEnvs), sortStrings(wantEnvs); g != w {
		t.Errorf("environments FINAL:\n%s\nwant\n%s", g, w)
	}
	if g, w := sortStrings(gotCerts), sortStrings(wantCerts); g != w {
		t.Errorf("tls_certificates FINAL:\n%s\nwant\n%s", g, w)
	}
}

// TestInventoryDespite429: with half the API's answers 429 (Retry-After),
// passes of the certificate inventory retry as every request of the
// platform client does, and the certificate series still equal the
// simulator's certificates.
func TestInventoryDespite429(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 6,
		Faults: platformsim.Faults{Rate429: 0.5, RetryAfter: time.Second}},
		run: func(f *runFlags) { f.datasets = []string{"edge_errors"} }})
	const route = "GET /config/v0.1/tls-certs"
	// A listing that failed after the client's retries keeps the
	// environment's last one and is tried again at the next pass, so the
	// series equal the simulator's once every environment has had a pass
	// that got through. The retries wait Retry-After on the real clock, so
	// a pass may still be under way at a scrape: keep advancing.
	want := inventoryTruth(t, te.sim)
	for i := 0; ; i++ {
		te.advance(time.Hour)
		_, got := te.scrape()
		diff := inventoryDiff(got, want, 10)
		if len(diff) == 0 && te.sim.Stats().Requests[route][http.StatusTooManyRequests] > 0 {
			break
		}
		if i == 10 {
			t.Fatalf("after %d inventory passes with half the answers 429 (%d certificate lists answered 429): %s",
				i+1, te.sim.Stats().Requests[route][http.StatusTooManyRequests], strings.Join(diff, "; "))
		}
	}
	st := te.sim.Stats()
	t.Logf("certificate lists: %d answered 429, %d 200", st.Requests[route][http.StatusTooManyRequests], st.Requests[route][http.StatusOK])
}
