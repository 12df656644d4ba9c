package inventory

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
)

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

// fakeLister serves certificates by environment and records when it was
// asked, on the test's clock.
type fakeLister struct {
	clock *fakeclock.Clock
	mu    sync.Mutex
	certs map[string][]platform.TLSCertificate
	err   map[string]error // by environment ("*": every one)
	calls []call
}

type call struct {
	env string
	at  time.Time
}

func (f *fakeLister) TLSCertificates(_ context.Context, env string) ([]platform.TLSCertificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{env, f.clock.Now()})
	if err := f.err[env]; err != nil {
		return nil, err
	}
	if err := f.err["*"]; err != nil {
		return nil, err
	}
	return slices.Clone(f.certs[env]), nil
}

func (f *fakeLister) set(env string, certs []platform.TLSCertificate, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if certs != nil {
		f.certs[env] = certs
	}
	f.err[env] = err
}

func (f *fakeLister) calledN() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeLister) since(i int) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls[i:])
}

// recorder is a Publisher that keeps what it got.
type recorder struct {
	mu    sync.Mutex
	envs  [][]Environment
	certs []published
}

type published struct {
	env         string
	certs, gone []string
}

func (r *recorder) PublishEnvironments(_ time.Time, envs []Environment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.envs = append(r.envs, slices.Clone(envs))
}

func (r *recorder) PublishCertificates(_ time.Time, env string, certs, gone []Certificate) {
	ids := func(cs []Certificate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ID)
		}
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.certs = append(r.certs, published{env, ids(certs), ids(gone)})
}

type harness struct {
	t      *testing.T
	clock  *fakeclock.Clock
	inv    *Inventory
	lister *fakeLister
	pub    *recorder
	logs   *bytes.Buffer
	logMu  *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// start runs an inventory with a lister of n environments (env-00 …), each
// with certificates per certsOf, until the test ends.
func start(t *testing.T, cfg Config, n int) *harness {
	t.Helper()
	clk := fakeclock.New(t0)
	l := &fakeLister{clock: clk, certs: map[string][]platform.TLSCertificate{}, err: map[string]error{}}
	for i := range n {
		env := fmt.Sprintf("env-%02d", i)
		l.certs[env] = []platform.TLSCertificate{cert(env, "a", 30), cert(env, "b", 10)}
	}
	h := &harness{t: t, clock: clk, lister: l, pub: &recorder{}, logs: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	cfg.Clock, cfg.Certificates, cfg.Publisher = clk, l, h.pub
	cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{h.logMu, h.logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	inv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.inv = inv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func cert(env, name string, days int) platform.TLSCertificate {
	return platform.TLSCertificate{ID: env + "-" + name, EnvironmentID: env, CommonName: name + ".example.com", Serial: "0A" + name,
		Status: "active", Expiration: t0.Add(time.Duration(days) * 24 * time.Hour).Add(17 * time.Second)}
}

// discover records a discovery that describes every environment of ids
// except those in undescribed.
func (h *harness) discover(ids []string, undescribed ...string) {
	var envs []platform.Environment
	for _, id := range ids {
		if !slices.Contains(undescribed, id) {
			envs = append(envs, platform.Environment{ID: id, Name: "name-" + id, PropertyID: "prop-1"})
		}
	}
	h.inv.RecordDiscovery(ids, envs, map[string]platform.Property{"prop-1": {ID: "prop-1", Slug: "shop", OrganizationID: "org-1"}})
}

func envIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("env-%02d", i)
	}
	return out
}

// until advances the clock by step whenever the inventory sleeps, until
// cond holds.
func (h *harness) until(step time.Duration, cond func() bool) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !cond() {
		if err := h.clock.BlockUntil(ctx, 1); err != nil {
			h.t.Fatalf("the inventory did not sleep again (clock %s, %d calls)", h.clock.Now(), h.lister.calledN())
		}
		if cond() {
			return
		}
		h.clock.Advance(step)
	}
}

// at sets the clock to t once the inventory sleeps.
func (h *harness) at(t time.Time) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.clock.BlockUntil(ctx, 1); err != nil {
		h.t.Fatal("the inventory did not sleep")
	}
	h.clock.Set(t)
}

func (h *harness) log() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.logs.String()
}

// gaps returns the times between consecutive calls.
func gaps(cs []call) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(cs); i++ {
		out = append(out, cs[i].at.Sub(cs[i-1].at))
	}
	return out
}

// TestPace: the first pass asks once every RequestGap, later passes spread
// their requests over nine tenths of the interval, an environment of three
// pages counts three gaps, and passes start every Interval.
func TestPace(t *testing.T) {
	h := start(t, Config{Interval: time.Hour}, 10)
	var big []platform.TLSCertificate
	for i := range 250 {
		big = append(big, cert("env-04", fmt.Sprintf("c%03d", i), 50))
	}
	h.lister.set("env-04", big, nil)
	h.discover(envIDs(10))
	h.until(100*time.Millisecond, func() bool { return h.lister.calledN() == 10 })
	first := h.lister.since(0)
	if !first[0].at.Equal(t0) {
		t.Errorf("first request at %s, want at once (%s)", first[0].at, t0)
	}
	ms := time.Millisecond
	want := []time.Duration{600 * ms, 600 * ms, 600 * ms, 600 * ms, 1800 * ms, 600 * ms, 600 * ms, 600 * ms, 600 * ms} // env-04: three pages
	for i, g := range gaps(first) {
		if g != want[i] {
			t.Fatalf("first pass gaps %v, want %v ms", gaps(first), want)
		}
	}
	h.at(t0.Add(time.Hour))
	h.until(6*time.Second, func() bool { return h.lister.calledN() == 20 })
	second := h.lister.since(10)
	if !second[0].at.Equal(t0.Add(time.Hour)) {
		t.Errorf("second pass began at %s, want %s", second[0].at, t0.Add(time.Hour))
	}
	// 54 minutes over 10 environments: 5.4 minutes each, three for env-04.
	for i, g := range gaps(second) {
		w := 324 * time.Second
		if i == 4 {
			w = 3 * 324 * time.Second
		}
		if g != w {
			t.Fatalf("second pass gaps %v, want 5m24s (16m12s after the three pages of env-04)", gaps(second))
		}
	}
	if m := upOf(t, h.inv, KindTLSCertificates); m != 1 {
		t.Errorf("edgepipe_inventory_up{kind=tls_certificates} = %v, want 1", m)
	}
}

// TestRefusedScope: a client refused the config service is asked once per
// pass, logs one line however many passes fail, exports no certificate but
// every environment's info, and recovers when the scope is granted.
func TestRefusedScope(t *testing.T) {
	h := start(t, Config{Interval: time.Hour}, 3)
	refused := fmt.Errorf("TLS certificates of environment env-00: %w", &platform.Error{Status: 401, Code: "invalid_scope", Description: "The client may not request scope \"app.config\"."})
	h.lister.set("*", nil, refused)
	h.discover(envIDs(3))
	h.until(time.Minute, func() bool { return h.lister.calledN() == 3 }) // three passes
	for i, c := range h.lister.since(0) {
		if want := t0.Add(time.Duration(i) * time.Hour); !c.at.Equal(want) {
			t.Errorf("request %d at %s, want %s (one per pass)", i, c.at, want)
		}
	}
	if n := strings.Count(h.log(), "TLS certificates are not exported"); n != 1 || !strings.Contains(h.log(), platform.ScopeConfig) {
		t.Errorf("%d refusal lines, want 1 naming %s:\n%s", n, platform.ScopeConfig, h.log())
	}
	if err := testutil.CollectAndCompare(h.inv, strings.NewReader(`
# HELP cdn_environment_info 1 per environment served: its name, its property's slug and organization (join on environment_id for names; an environment the platform could not name shows its ID as name).
# TYPE cdn_environment_info gauge
cdn_environment_info{environment="name-env-00",environment_id="env-00",organization_id="org-1",property="shop",property_id="prop-1"} 1
cdn_environment_info{environment="name-env-01",environment_id="env-01",organization_id="org-1",property="shop",property_id="prop-1"} 1
cdn_environment_info{environment="name-env-02",environment_id="env-02",organization_id="org-1",property="shop",property_id="prop-1"} 1
`), "cdn_environment_info", "cdn_tls_certificate_info"); err != nil {
		t.Error(err)
	}
	if up := upOf(t, h.inv, KindTLSCertificates); up != 0 {
		t.Errorf("up = %v while refused", up)
	}
	h.lister.set("*", nil, nil)
	h.until(time.Minute, func() bool { return h.lister.calledN() == 6 })
	h.until(time.Minute, func() bool { return upOf(t, h.inv, KindTLSCertificates) == 1 })
	if !strings.Contains(h.log(), "lists TLS certificates again") {
		t.Errorf("no recovery line:\n%s", h.log())
	}

	// A wrong secret is not blamed on the scope.
	h2 := start(t, Config{Interval: time.Hour}, 1)
	h2.lister.set("*", nil, &platform.Error{Status: 401, Code: "invalid_client", Description: "Unknown client or wrong client secret."})
	h2.discover(envIDs(1))
	h2.until(time.Minute, func() bool { return h2.lister.calledN() == 1 })
	h2.until(time.Minute, func() bool { return strings.Contains(h2.log(), "not exported") })
	if out := h2.log(); !strings.Contains(out, "refuses this API client's credentials") || strings.Contains(out, platform.ScopeConfig) {
		t.Errorf("wrong secret logged as:\n%s", out)
	}
	if n := testutil.CollectAndCount(h.inv, "cdn_tls_certificate_expiry_timestamp_seconds"); n != 6 {
		t.Errorf("%d expiry series after recovery, want 6", n)
	}
}

// TestFailuresKeepLastListing: an environment that cannot be listed keeps
// its last certificates and makes the pass fail; a certificate no longer
// listed is gone from the metrics and published as gone; an environment no
// longer served loses its certificates at once.
func TestFailuresKeepLastListing(t *testing.T) {
	h := start(t, Config{Interval: time.Hour}, 3)
	h.discover(envIDs(3))
	h.until(time.Second, func() bool { return h.lister.calledN() == 3 })
	h.until(time.Second, func() bool { return upOf(t, h.inv, KindTLSCertificates) == 1 })
	h.lister.set("env-01", nil, &platform.Error{Status: 503})
	h.lister.set("env-02", []platform.TLSCertificate{cert("env-02", "a", 30), cert("env-02", "c", 3)}, nil)
	h.until(time.Minute, func() bool { return h.lister.calledN() == 6 })
	h.until(time.Second, func() bool { return upOf(t, h.inv, KindTLSCertificates) == 0 })
	if !strings.Contains(h.log(), "could not list the TLS certificates of some environments") {
		t.Errorf("no failure line:\n%s", h.log())
	}
	if err := testutil.CollectAndCompare(h.inv, strings.NewReader(`
# HELP cdn_tls_certificate_activation_failed 1 when the platform could not activate the TLS certificate (its activation_error is set), else 0.
# TYPE cdn_tls_certificate_activation_failed gauge
cdn_tls_certificate_activation_failed{certificate_id="env-00-a",environment_id="env-00"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-00-b",environment_id="env-00"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-01-a",environment_id="env-01"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-01-b",environment_id="env-01"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-02-a",environment_id="env-02"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-02-c",environment_id="env-02"} 0
`), "cdn_tls_certificate_activation_failed"); err != nil {
		t.Error(err)
	}
	h.pub.mu.Lock()
	last := h.pub.certs[len(h.pub.certs)-1]
	h.pub.mu.Unlock()
	if last.env != "env-02" || fmt.Sprint(last.certs) != "[env-02-a env-02-c]" || fmt.Sprint(last.gone) != "[env-02-b]" {
		t.Errorf("last publication %+v, want env-02 with b gone", last)
	}
	h.discover([]string{"env-00", "env-02"})
	if n := testutil.CollectAndCount(h.inv, "cdn_tls_certificate_info"); n != 4 {
		t.Errorf("%d certificate series after env-01 left, want 4", n)
	}
}

// TestNames: discovery names most environments; the inventory looks up
// the others (one request every RequestGap, a property once), keeps a
// looked-up name, publishes every change, and shows the ID of an
// environment it cannot name. Refused lookups are logged once.
func TestNames(t *testing.T) {
	acc := &fakeAccounts{envs: map[string]platform.Environment{"env-02": {ID: "env-02", Name: "static-two", PropertyID: "prop-9"}}}
	h := start(t, Config{Interval: time.Hour, Accounts: acc}, 0)
	h.discover(envIDs(4), "env-02", "env-03") // env-03 cannot be looked up
	h.until(100*time.Millisecond, func() bool { return acc.calls() == 3 })
	h.until(100*time.Millisecond, func() bool { return strings.Contains(h.log(), "could not look up") })
	want := `
# HELP cdn_environment_info 1 per environment served: its name, its property's slug and organization (join on environment_id for names; an environment the platform could not name shows its ID as name).
# TYPE cdn_environment_info gauge
cdn_environment_info{environment="name-env-00",environment_id="env-00",organization_id="org-1",property="shop",property_id="prop-1"} 1
cdn_environment_info{environment="name-env-01",environment_id="env-01",organization_id="org-1",property="shop",property_id="prop-1"} 1
cdn_environment_info{environment="static-two",environment_id="env-02",organization_id="org-9",property="slug-prop-9",property_id="prop-9"} 1
cdn_environment_info{environment="env-03",environment_id="env-03",organization_id="",property="",property_id=""} 1
`
	if err := testutil.CollectAndCompare(h.inv, strings.NewReader(want), "cdn_environment_info"); err != nil {
		t.Error(err)
	}
	if up := upOf(t, h.inv, KindEnvironments); up != 0 {
		t.Errorf("environments up = %v with env-03 unnamed", up)
	}
	// The next discovery (env-02 still undescribed) keeps the looked-up
	// name; a rename shows and is published.
	h.inv.RecordDiscovery(envIDs(4), []platform.Environment{
		{ID: "env-00", Name: "renamed", PropertyID: "prop-1"}, {ID: "env-01", Name: "name-env-01", PropertyID: "prop-1"},
		{ID: "env-03", Name: "name-env-03", PropertyID: "prop-1"}},
		map[string]platform.Property{"prop-1": {ID: "prop-1", Slug: "shop", OrganizationID: "org-1"}})
	got := testutil.CollectAndCount(h.inv, "cdn_environment_info")
	h.pub.mu.Lock()
	last := h.pub.envs[len(h.pub.envs)-1]
	h.pub.mu.Unlock()
	if got != 4 || len(last) != 4 || last[0].Name != "renamed" || last[2].Name != "static-two" || last[3].Name != "name-env-03" {
		t.Errorf("after the rename: %d series, published %+v", got, last)
	}
	if up := upOf(t, h.inv, KindEnvironments); up != 0 {
		t.Errorf("environments up = %v before the lookups succeeded", up)
	}
	h.until(time.Minute, func() bool { return acc.calls() >= 4 }) // the next pass looks env-02 up again
	h.until(time.Second, func() bool { return upOf(t, h.inv, KindEnvironments) == 1 })

	// Refused lookups: one line, IDs as names.
	acc2 := &fakeAccounts{err: &platform.Error{Status: 401, Code: "insufficient_scope"}}
	h2 := start(t, Config{Interval: time.Hour, Accounts: acc2}, 0)
	h2.discover([]string{"env-00", "env-01"}, "env-00", "env-01")
	h2.until(time.Minute, func() bool { return acc2.calls() >= 2 })
	if n := strings.Count(h2.log(), "environment names unavailable"); n != 1 || acc2.calls() != 2 {
		t.Errorf("%d refusal lines after %d lookups (one per pass, stopping at the refusal):\n%s", n, acc2.calls(), h2.log())
	}
	if err := testutil.CollectAndCompare(h2.inv, strings.NewReader(`
# HELP cdn_environment_info 1 per environment served: its name, its property's slug and organization (join on environment_id for names; an environment the platform could not name shows its ID as name).
# TYPE cdn_environment_info gauge
cdn_environment_info{environment="env-00",environment_id="env-00",organization_id="",property="",property_id=""} 1
cdn_environment_info{environment="env-01",environment_id="env-01",organization_id="",property="",property_id=""} 1
`), "cdn_environment_info"); err != nil {
		t.Error(err)
	}
}

// TestCollectorLint: the exposition passes client_golang's linter (what
// promtool check metrics runs).
func TestCollectorLint(t *testing.T) {
	h := start(t, Config{Interval: time.Hour}, 2)
	h.lister.set("env-01", []platform.TLSCertificate{func() platform.TLSCertificate {
		c := cert("env-01", "x", 1)
		c.ActivationError, c.Status, c.Generated = "no CNAME", "failed", true
		return c
	}()}, nil)
	h.discover(envIDs(2))
	h.until(time.Second, func() bool { return upOf(t, h.inv, KindTLSCertificates) == 1 })
	problems, err := testutil.CollectAndLint(h.inv)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if err := testutil.CollectAndCompare(h.inv, strings.NewReader(fmt.Sprintf(`
# HELP cdn_tls_certificate_expiry_timestamp_seconds When the TLS certificate expires (its expiration, Unix seconds), as the config API listed it last.
# TYPE cdn_tls_certificate_expiry_timestamp_seconds gauge
cdn_tls_certificate_expiry_timestamp_seconds{certificate_id="env-00-a",common_name="a.example.com",environment_id="env-00"} %d
cdn_tls_certificate_expiry_timestamp_seconds{certificate_id="env-00-b",common_name="b.example.com",environment_id="env-00"} %d
cdn_tls_certificate_expiry_timestamp_seconds{certificate_id="env-01-x",common_name="x.example.com",environment_id="env-01"} %d
# HELP cdn_tls_certificate_activation_failed 1 when the platform could not activate the TLS certificate (its activation_error is set), else 0.
# TYPE cdn_tls_certificate_activation_failed gauge
cdn_tls_certificate_activation_failed{certificate_id="env-00-a",environment_id="env-00"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-00-b",environment_id="env-00"} 0
cdn_tls_certificate_activation_failed{certificate_id="env-01-x",environment_id="env-01"} 1
# HELP cdn_tls_certificate_info 1 per TLS certificate of an environment served: common name, serial, status and whether the platform generated it.
# TYPE cdn_tls_certificate_info gauge
cdn_tls_certificate_info{certificate_id="env-00-a",common_name="a.example.com",environment_id="env-00",generated="false",serial="0Aa",status="active"} 1
cdn_tls_certificate_info{certificate_id="env-00-b",common_name="b.example.com",environment_id="env-00",generated="false",serial="0Ab",status="active"} 1
cdn_tls_certificate_info{certificate_id="env-01-x",common_name="x.example.com",environment_id="env-01",generated="true",serial="0Ax",status="failed"} 1
`, cert("", "", 30).Expiration.Unix(), cert("", "", 10).Expiration.Unix(), cert("", "", 1).Expiration.Unix())),
		"cdn_tls_certificate_expiry_timestamp_seconds", "cdn_tls_certificate_activation_failed", "cdn_tls_certificate_info"); err != nil {
		t.Error(err)
	}
}

// upOf returns edgepipe_inventory_up{kind}, or -1 when absent.
func upOf(t *testing.T, inv *Inventory, kind string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1000)
	inv.Collect(ch)
	close(ch)
	for m := range ch {
		if m.Desc() != inv.descs.up {
			continue
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		if pb.GetLabel()[0].GetValue() == kind {
			return pb.GetGauge().GetValue()
		}
	}
	return -1
}

// fakeAccounts answers environment and property lookups.
type fakeAccounts struct {
	mu    sync.Mutex
	envs  map[string]platform.Environment
	err   error
	asked int
}

func (f *fakeAccounts) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func (f *fakeAccounts) Environment(_ context.Context, id string) (*platform.Environment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.err != nil {
		return nil, f.err
	}
	e, ok := f.envs[id]
	if !ok {
		return nil, &platform.Error{Status: 404}
	}
	return &e, nil
}

func (f *fakeAccounts) Property(_ context.Context, id string) (*platform.Property, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return &platform.Property{ID: id, Slug: "slug-" + id, OrganizationID: "org-9"}, nil
}

// TestCollectorInvalidUTF8: a name or common name that is not UTF-8 (the
// platform's bytes) is exported with replacement characters; the scrape
// still succeeds.
func TestCollectorInvalidUTF8(t *testing.T) {
	h := start(t, Config{Interval: time.Hour}, 1)
	bad := cert("env-00", "a", 30)
	bad.CommonName = "caf\xe9.example.com"
	h.lister.set("env-00", []platform.TLSCertificate{bad}, nil)
	h.inv.RecordDiscovery([]string{"env-00"}, []platform.Environment{{ID: "env-00", Name: "pr\xffod", PropertyID: "p"}}, nil)
	h.until(time.Second, func() bool { return upOf(t, h.inv, KindTLSCertificates) == 1 })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h.inv)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "environment" || l.GetName() == "common_name" {
					got = append(got, l.GetValue())
				}
			}
		}
	}
	if !slices.Contains(got, "pr\uFFFDod") || !slices.Contains(got, "caf\uFFFD.example.com") {
		t.Errorf("label values %q", got)
	}
}
