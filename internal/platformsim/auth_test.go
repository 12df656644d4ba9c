package platformsim_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func TestTokenEndpoint(t *testing.T) {
	_, base := startSim(t, platformsim.Config{
		Seed: 1,
		Clients: []platformsim.Client{
			{ID: platformsim.DemoClientID, Secret: platformsim.DemoClientSecret, Scopes: []string{"app.metrics", "app.accounts", "app.rtld"}},
			{ID: "broad", Secret: "broad-secret", Scopes: []string{"app"}},
			{ID: "metrics-only", Secret: "m-secret", Scopes: []string{"app.metrics"}},
		},
	})
	form := func(id, secret, grant, scope string) url.Values {
		v := url.Values{"client_id": {id}, "client_secret": {secret}, "grant_type": {grant}}
		if scope != "" {
			v.Set("scope", scope)
		}
		return v
	}
	demo, secret := platformsim.DemoClientID, platformsim.DemoClientSecret
	tests := []struct {
		name      string
		form      url.Values
		status    int
		source    string
		wantScope string
	}{
		{"one scope", form(demo, secret, "client_credentials", "app.metrics"), 200, "", "app.metrics"},
		{"space separated", form(demo, secret, "client_credentials", "app.metrics app.accounts"), 200, "", "app.metrics app.accounts"},
		{"plus separated", form(demo, secret, "client_credentials", "app.metrics+app.rtld"), 200, "", "app.metrics app.rtld"},
		{"narrower than granted", form(demo, secret, "client_credentials", "app.metrics:read"), 200, "", "app.metrics:read"},
		{"no scope grants all", form(demo, secret, "client_credentials", ""), 200, "", "app.metrics app.accounts app.rtld"},
		{"broad grant covers", form("broad", "broad-secret", "client_credentials", "app.metrics app.accounts"), 200, "", "app.metrics app.accounts"},
		{"scope not granted", form(demo, secret, "client_credentials", "app.metrics app.waf"), 401, "scope", ""},
		{"broader than granted", form("metrics-only", "m-secret", "client_credentials", "app"), 401, "scope", ""},
		{"sibling not granted", form("metrics-only", "m-secret", "client_credentials", "app.accounts"), 401, "scope", ""},
		{"prefix is not a parent", form("metrics-only", "m-secret", "client_credentials", "app.metricsx"), 401, "scope", ""},
		{"wrong secret", form(demo, "nope", "client_credentials", "app.metrics"), 401, "client_id", ""},
		{"other client's secret", form(demo, "broad-secret", "client_credentials", "app.metrics"), 401, "client_id", ""},
		{"unknown client", form("who", secret, "client_credentials", "app.metrics"), 401, "client_id", ""},
		{"missing secret", form(demo, "", "client_credentials", "app.metrics"), 401, "client_id", ""},
		{"wrong grant", form(demo, secret, "password", "app.metrics"), 400, "grant_type", ""},
		{"missing grant", url.Values{"client_id": {demo}, "client_secret": {secret}}, 400, "grant_type", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenRequest(t, base, tc.form)
			if tc.status != http.StatusOK {
				m := checkError(t, r, tc.status, tc.source)
				if m["error"] != m["code"] || m["error_description"] == "" {
					t.Fatalf("no OAuth2 error fields: %s", r.body)
				}
				return
			}
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			m := r.json(t)
			if m["token_type"] != "Bearer" || m["access_token"] == "" || m["scope"] != tc.wantScope {
				t.Fatalf("response %s, want scope %q", r.body, tc.wantScope)
			}
			if n, _ := m["expires_in"].(interface{ String() string }); n == nil || n.String() != "300" {
				t.Fatalf("expires_in %v, want 300", m["expires_in"])
			}
		})
	}

	t.Run("basic auth", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, base+"/connect/token", strings.NewReader("grant_type=client_credentials&scope=app.metrics"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth(url.QueryEscape(demo), url.QueryEscape(secret))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("not a form", func(t *testing.T) {
		r := do(t, http.MethodPost, base+"/connect/token", "", "application/json", `{"grant_type":"client_credentials"}`)
		checkError(t, r, 400, "Content-Type")
	})
	t.Run("GET is not allowed", func(t *testing.T) {
		r := do(t, http.MethodGet, base+"/connect/token", "", "", "")
		checkError(t, r, 405, "")
	})
}

func TestAPIAuthorization(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 1, Now: clk.Now, TokenLifetime: 60 * time.Second})
	metrics := token(t, base, "app.metrics")
	accounts := token(t, base, "app.accounts")
	datasets := base + "/metrics/v1/datasets"
	tests := []struct {
		name   string
		auth   string
		url    string
		status int
		code   string
	}{
		{"valid", "Bearer " + metrics, datasets, 200, ""},
		{"lowercase bearer", "bearer " + metrics, datasets, 200, ""},
		{"uppercase token", "BEARER " + strings.ToUpper(metrics), datasets, 200, ""},
		{"missing header", "", datasets, 401, "missing_token"},
		{"no scheme", metrics, datasets, 401, "malformed_token"},
		{"basic scheme", "Basic " + metrics, datasets, 401, "malformed_token"},
		{"empty token", "Bearer ", datasets, 401, "malformed_token"},
		{"unknown token", "Bearer 0123456789abcdef", datasets, 401, "invalid_token"},
		{"insufficient scope", "Bearer " + accounts, datasets, 401, "insufficient_scope"},
		{"accounts with accounts scope", "Bearer " + accounts, base + "/accounts/v0.1/organizations/" + platformsim.DemoOrganizationID, 200, ""},
		{"accounts with metrics scope", "Bearer " + metrics, base + "/accounts/v0.1/organizations/" + platformsim.DemoOrganizationID, 401, "insufficient_scope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, http.MethodGet, tc.url, tc.auth, "", "")
			if tc.status == 200 {
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				return
			}
			m := checkError(t, r, tc.status, "Authorization")
			if m["code"] != tc.code {
				t.Fatalf("code %v, want %s", m["code"], tc.code)
			}
		})
	}

	t.Run("expiry", func(t *testing.T) {
		tok := token(t, base, "app.metrics")
		clk.Advance(59 * time.Second)
		if r := do(t, http.MethodGet, datasets, "Bearer "+tok, "", ""); r.status != 200 {
			t.Fatalf("before expiry: %d", r.status)
		}
		clk.Advance(time.Second)
		m := checkError(t, do(t, http.MethodGet, datasets, "Bearer "+tok, "", ""), 401, "Authorization")
		if m["code"] != "expired_token" || !strings.Contains(m["description"].(string), "nauthenticated") {
			t.Fatalf("expired token: %v", m)
		}
		fresh := token(t, base, "app.metrics")
		if r := do(t, http.MethodGet, datasets, "Bearer "+fresh, "", ""); r.status != 200 {
			t.Fatalf("fresh token: %d", r.status)
		}
	})

	t.Run("revoke", func(t *testing.T) {
		tok := token(t, base, "app.metrics")
		srv.RevokeTokens()
		checkError(t, do(t, http.MethodGet, datasets, "Bearer "+tok, "", ""), 401, "Authorization")
	})
}

func TestRateLimits(t *testing.T) {
	clk := newClock(testNow)
	_, base := startSim(t, platformsim.Config{Seed: 1, Now: clk.Now, RateLimits: true, TokenLifetime: time.Hour})
	tok := token(t, base, "app.accounts app.metrics")
	org := base + "/accounts/v0.1/organizations/" + platformsim.DemoOrganizationID
	for i := 0; i < 2000; i++ {
		if r := do(t, http.MethodGet, org, "Bearer "+tok, "", ""); r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		if i%500 == 499 {
			clk.Advance(time.Minute) // 2,000 requests within 4 minutes
		}
	}
	r := do(t, http.MethodGet, org, "Bearer "+tok, "", "")
	checkError(t, r, 429, "")
	// The first 500 requests leave the window 5 minutes after they were made.
	if got := r.header.Get("Retry-After"); got != "60" {
		t.Fatalf("Retry-After %q, want 60", got)
	}
	// Metrics have no documented limit.
	if r := do(t, http.MethodGet, base+"/metrics/v1/datasets", "Bearer "+tok, "", ""); r.status != 200 {
		t.Fatalf("metrics limited: %d", r.status)
	}
	clk.Advance(60 * time.Second)
	if r := do(t, http.MethodGet, org, "Bearer "+tok, "", ""); r.status != 200 {
		t.Fatalf("after Retry-After: %d", r.status)
	}
}

func TestCloseDuringSlowRequest(t *testing.T) {
	srv, err := platformsim.New(platformsim.Config{Seed: 1, Faults: platformsim.Faults{Latency: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tok := token(t, base, "app.metrics")
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodGet, base+"/metrics/v1/datasets", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(50 * time.Millisecond) // let the request reach the latency wait
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("Close waits for an injected latency of a minute")
	}
	<-done
	if err := srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
