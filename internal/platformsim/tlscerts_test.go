package platformsim_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// TestTLSCertificatesWorld: every environment has certificates, the world
// holds each case the exporter's alerts are about (expiring in days, in
// months, a failed activation, generated ones), and the same seed gives
// the same certificates while another seed gives others.
func TestTLSCertificatesWorld(t *testing.T) {
	now := testNow
	certsOf := func(seed int64) map[string][]platformsim.TLSCertificate {
		srv, err := platformsim.New(platformsim.Config{Seed: seed, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		out := map[string][]platformsim.TLSCertificate{}
		for _, id := range srv.EnvironmentIDs() {
			cs, ok := srv.TLSCertificates(id)
			if !ok {
				t.Fatalf("environment %s unknown", id)
			}
			out[id] = cs
		}
		return out
	}
	world := certsOf(1)
	var days, months, failed, generated, total int
	ids := map[string]bool{}
	for env, cs := range world {
		if len(cs) == 0 {
			t.Errorf("environment %s has no certificate", env)
		}
		for i, c := range cs {
			total++
			if ids[c.ID] {
				t.Errorf("certificate ID %s twice", c.ID)
			}
			ids[c.ID] = true
			if i > 0 && cs[i-1].ID >= c.ID {
				t.Errorf("environment %s: certificates not ordered by ID", env)
			}
			if c.EnvironmentID != env || c.CommonName == "" || c.Serial == "" || c.Status == "" ||
				!strings.HasPrefix(c.PrimaryCert, "-----BEGIN CERTIFICATE-----\n") || len(c.AlternativeNames) == 0 {
				t.Errorf("incomplete certificate %+v", c)
			}
			if !c.CreatedAt.Before(c.Expiration) {
				t.Errorf("certificate %s created %s, expires %s", c.ID, c.CreatedAt, c.Expiration)
			}
			left := c.Expiration.Sub(now)
			switch {
			case left < 0:
				t.Errorf("certificate %s expired %s ago", c.ID, -left)
			case left < 21*24*time.Hour:
				days++
			case left > 30*24*time.Hour:
				months++
			}
			if c.ActivationError != "" {
				failed++
				if c.Status != platformsim.CertificateFailed {
					t.Errorf("certificate %s: activation error with status %q", c.ID, c.Status)
				}
			}
			if c.Generated {
				generated++
			}
		}
	}
	t.Logf("%d certificates: %d expire within 21 days, %d in over 30 days, %d failed, %d generated", total, days, months, failed, generated)
	if days == 0 || months == 0 || failed == 0 || generated == 0 {
		t.Errorf("the default world lacks a case: %d within 21 days, %d in months, %d failed, %d generated", days, months, failed, generated)
	}
	again, other := certsOf(1), certsOf(2)
	for env, cs := range world {
		if len(again[env]) != len(cs) || again[env][0].ID != cs[0].ID || !again[env][0].Expiration.Equal(cs[0].Expiration) {
			t.Fatalf("same seed, other certificates for %s", env)
		}
	}
	for _, cs := range other {
		if ids[cs[0].ID] {
			t.Fatal("another seed gave the same certificate IDs")
		}
	}
}

// TestTLSCertificatesEndpoints walks the list page by page (the paginated
// envelope, sizes 1 to 100), gets each certificate by ID, and checks the
// errors: a missing or unknown environment, bad paging, an unknown ID.
func TestTLSCertificatesEndpoints(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 3})
	tok := token(t, base, platformsim.ScopeConfig)
	env := srv.EnvironmentIDs()[4]
	added, err := srv.AddTLSCertificates(env, 7)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := srv.TLSCertificates(env)
	if len(want) < len(added)+1 {
		t.Fatalf("%d certificates after adding %d", len(want), len(added))
	}
	for _, size := range []int{1, 3, 100} {
		items := walk(t, base, tok, "/config/v0.1/tls-certs?environment_id="+env, size)
		if len(items) != len(want) {
			t.Fatalf("page size %d: %d items, want %d", size, len(items), len(want))
		}
		for i, it := range items {
			c := want[i]
			if it["@type"] != "TLSCertificate" || it["id"] != c.ID || it["environment_id"] != env || it["common_name"] != c.CommonName ||
				it["serial"] != c.Serial || it["status"] != c.Status || it["activation_error"] != c.ActivationError ||
				it["generated"] != c.Generated || it["primary_cert"] != c.PrimaryCert {
				t.Fatalf("item %d = %v, want %+v", i, it, c)
			}
			if it["expiration"] != c.Expiration.UTC().Format(time.RFC3339) {
				t.Fatalf("item %d expiration %v, want %s", i, it["expiration"], c.Expiration)
			}
		}
	}
	for _, c := range want[:3] {
		r := do(t, http.MethodGet, base+"/config/v0.1/tls-certs/"+c.ID, "Bearer "+tok, "", "")
		if r.status != http.StatusOK {
			t.Fatalf("get %s: %d %s", c.ID, r.status, r.body)
		}
		if m := r.json(t); m["id"] != c.ID || m["expiration"] != c.Expiration.UTC().Format(time.RFC3339) {
			t.Fatalf("get %s = %v", c.ID, m)
		}
	}
	list := base + "/config/v0.1/tls-certs"
	for _, tc := range []struct {
		name, url, source string
		status            int
	}{
		{"no environment", list, "environment_id", 400},
		{"unknown environment", list + "?environment_id=00000000-0000-4000-8000-000000000000", "id", 404},
		{"page size 0", list + "?environment_id=" + env + "&page_size=0", "page_size", 400},
		{"page size 101", list + "?environment_id=" + env + "&page_size=101", "page_size", 400},
		{"negative page", list + "?environment_id=" + env + "&page=-1", "page", 400},
		{"unknown certificate", list + "/" + url.PathEscape("nope"), "id", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkError(t, do(t, http.MethodGet, tc.url, "Bearer "+tok, "", ""), tc.status, tc.source)
		})
	}
	// Past the last page: an empty page, total_items still right.
	r := do(t, http.MethodGet, list+"?environment_id="+env+"&page=9&page_size=100", "Bearer "+tok, "", "")
	m := r.json(t)
	if n, _ := m["total_items"].(json.Number).Int64(); r.status != 200 || int(n) != len(want) || len(m["items"].([]any)) != 0 {
		t.Fatalf("page past the end: %d %s", r.status, r.body)
	}
}

// TestTLSCertificatesScope: the config service wants app.config; a token
// without it is refused with 401, and a client that was not granted it
// cannot get such a token.
func TestTLSCertificatesScope(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 1, Clients: []platformsim.Client{
		platformsim.DemoClient(platformsim.ScopeMetrics, platformsim.ScopeAccounts),
	}})
	env := srv.EnvironmentIDs()[0]
	tok := token(t, base, "app.metrics app.accounts")
	r := do(t, http.MethodGet, base+"/config/v0.1/tls-certs?environment_id="+env, "Bearer "+tok, "", "")
	if m := checkError(t, r, http.StatusUnauthorized, "Authorization"); m["code"] != "insufficient_scope" {
		t.Fatalf("code %v, want insufficient_scope", m["code"])
	}
	r = tokenRequest(t, base, url.Values{"grant_type": {"client_credentials"}, "client_id": {platformsim.DemoClientID},
		"client_secret": {platformsim.DemoClientSecret}, "scope": {platformsim.ScopeConfig}})
	if m := checkError(t, r, http.StatusUnauthorized, "scope"); m["code"] != "invalid_scope" {
		t.Fatalf("code %v, want invalid_scope", m["code"])
	}
	// The default demo client has the scope.
	_, base2 := startSim(t, platformsim.Config{Seed: 1})
	if r := do(t, http.MethodGet, base2+"/config/v0.1/tls-certs?environment_id="+env, "Bearer "+token(t, base2, platformsim.ScopeConfig), "", ""); r.status != 200 {
		t.Fatalf("demo client: %d %s", r.status, r.body)
	}
}

// TestTLSCertificatesRateLimit: with rate limits on, the config service
// answers its 2,001st GET within 5 minutes with 429 and Retry-After, while
// the accounts service's budget is its own.
func TestTLSCertificatesRateLimit(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 1, Now: clk.Now, RateLimits: true, TokenLifetime: time.Hour})
	tok := token(t, base, "app.config app.accounts")
	list := base + "/config/v0.1/tls-certs?environment_id=" + srv.EnvironmentIDs()[0]
	for i := 0; i < 2000; i++ {
		if r := do(t, http.MethodGet, list, "Bearer "+tok, "", ""); r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		if i%1000 == 999 {
			clk.Advance(2 * time.Minute)
		}
	}
	r := do(t, http.MethodGet, list, "Bearer "+tok, "", "")
	checkError(t, r, http.StatusTooManyRequests, "")
	// The first 1,000 requests leave the window 5 minutes after they were made.
	if got := r.header.Get("Retry-After"); got != "60" {
		t.Fatalf("Retry-After %q, want 60", got)
	}
	if r := do(t, http.MethodGet, base+"/accounts/v0.1/organizations/"+platformsim.DemoOrganizationID, "Bearer "+tok, "", ""); r.status != 200 {
		t.Fatalf("accounts limited by the config service's budget: %d", r.status)
	}
	clk.Advance(time.Minute)
	if r := do(t, http.MethodGet, list, "Bearer "+tok, "", ""); r.status != 200 {
		t.Fatalf("after Retry-After: %d", r.status)
	}
}

// TestRenameEnvironment: the accounts API lists the new name; the ID and
// the certificates stay as they were.
func TestRenameEnvironment(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 1})
	env := srv.Environments()[2]
	before, _ := srv.TLSCertificates(env.ID)
	if _, err := srv.RenameEnvironment(env.ID, "Bad Name"); err == nil {
		t.Fatal("a name with capitals and a space was accepted")
	}
	if _, err := srv.RenameEnvironment(env.ID, "renamed-env"); err != nil {
		t.Fatal(err)
	}
	r := do(t, http.MethodGet, base+"/accounts/v0.1/environments/"+env.ID, "Bearer "+token(t, base, platformsim.ScopeAccounts), "", "")
	if m := r.json(t); m["name"] != "renamed-env" || m["id"] != env.ID {
		t.Fatalf("after rename: %s", r.body)
	}
	after, _ := srv.TLSCertificates(env.ID)
	if len(after) != len(before) || after[0].ID != before[0].ID || after[0].CommonName != before[0].CommonName || strings.Contains(after[0].CommonName, "renamed") {
		t.Fatalf("certificates after rename: %+v, before %+v", after[0], before[0])
	}
}
