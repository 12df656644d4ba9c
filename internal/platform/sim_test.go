package platform_test

// Integration tests: the client against the platform simulator over real
// loopback HTTP.

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

const (
	routeToken      = "POST /connect/token"
	routeEnv        = "GET /accounts/v0.1/environments/{id}"
	routeProperties = "GET /accounts/v0.1/properties"
	routeEnvs       = "GET /accounts/v0.1/environments"
)

// startSim serves a simulator on a loopback port for the test's lifetime.
func startSim(t *testing.T, cfg platformsim.Config) *platformsim.Server {
	t.Helper()
	srv := platformsim.New(cfg)
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// simClient returns a client for srv with the demo credentials and quick
// retries.
func simClient(t *testing.T, srv *platformsim.Server, mutate ...func(*platform.Config)) *platform.Client {
	t.Helper()
	cfg := platform.Config{
		BaseURL:      srv.URL(),
		AuthURL:      srv.URL(),
		ClientID:     platformsim.DemoClientID,
		ClientSecret: platformsim.DemoClientSecret,
		Timeout:      10 * time.Second,
		Retry:        platform.RetryConfig{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxElapsed: 20 * time.Second},
		Version:      "test",
	}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := platform.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestSimTokenRefreshAcrossExpiry(t *testing.T) {
	t.Parallel()
	srv := startSim(t, platformsim.Config{Seed: 1, TokenLifetime: 2 * time.Second})
	c := simClient(t, srv)
	ctx := testCtx(t)
	env := srv.EnvironmentIDs()[0]
	calls := 0
	for end := time.Now().Add(4500 * time.Millisecond); time.Now().Before(end); calls++ {
		if _, err := c.Accounts().Environment(ctx, env); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := srv.Stats()
	if n := st.Count(routeEnv, http.StatusUnauthorized); n != 0 {
		t.Errorf("the simulator refused %d calls with 401: tokens were not refreshed before expiry", n)
	}
	if n := st.Count(routeEnv, http.StatusOK); n != calls {
		t.Errorf("%d successful calls seen, want %d", n, calls)
	}
	// 4.5 s of 2 s tokens refreshed 0.4 s early: 3 tokens, perhaps 4.
	if n := st.Count(routeToken, http.StatusOK); n < 3 || n > 4 {
		t.Errorf("%d tokens fetched for %d calls over 4.5 s of 2 s tokens, want 3..4", n, calls)
	}
}

func TestSimUnauthorizedRefreshesOnce(t *testing.T) {
	srv := startSim(t, platformsim.Config{Seed: 1})
	c := simClient(t, srv)
	ctx := testCtx(t)
	env := srv.EnvironmentIDs()[0]
	if _, err := c.Accounts().Environment(ctx, env); err != nil {
		t.Fatal(err)
	}
	srv.RevokeTokens()
	e, err := c.Accounts().Environment(ctx, env)
	if err != nil {
		t.Fatalf("after revocation: %v", err)
	}
	if e.ID != env {
		t.Errorf("environment %q, want %q", e.ID, env)
	}
	st := srv.Stats()
	if got := [3]int{st.Count(routeToken, 200), st.Count(routeEnv, 401), st.Count(routeEnv, 200)}; got != [3]int{2, 1, 2} {
		t.Errorf("tokens, 401s, successes = %v, want [2 1 2]", got)
	}
}

func TestSimRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		status   int
		n        int
		minWait  time.Duration
		wantErr  int
		wantSent int
	}{
		{"429 honours Retry-After", http.StatusTooManyRequests, 1, time.Second, 0, 2},
		{"503 twice", http.StatusServiceUnavailable, 2, 0, 0, 3},
		{"500 then ok", http.StatusInternalServerError, 1, 0, 0, 2},
		{"400 not retried", http.StatusBadRequest, 1, 0, 400, 1},
		{"404 not retried", http.StatusNotFound, 1, 0, 404, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startSim(t, platformsim.Config{Seed: 1, Faults: platformsim.Faults{RetryAfter: time.Second}})
			c := simClient(t, srv)
			ctx := testCtx(t)
			env := srv.EnvironmentIDs()[0]
			if _, err := c.Accounts().Environment(ctx, env); err != nil { // token and connection ready
				t.Fatal(err)
			}
			srv.ResetStats()
			srv.FailNext(tt.n, tt.status)
			start := time.Now()
			_, err := c.Accounts().Environment(ctx, env)
			took := time.Since(start)
			if platform.StatusCode(err) != tt.wantErr || (err == nil) != (tt.wantErr == 0) {
				t.Fatalf("err = %v, want status %d", err, tt.wantErr)
			}
			if n := srv.Stats().Count(routeEnv, 0); n != tt.wantSent {
				t.Errorf("simulator saw %d requests, want %d", n, tt.wantSent)
			}
			if took < tt.minWait {
				t.Errorf("call took %s, want at least %s (Retry-After)", took, tt.minWait)
			}
		})
	}
}

func TestSimPagination(t *testing.T) {
	t.Run("properties", func(t *testing.T) {
		srv := startSim(t, platformsim.Config{Seed: 2, Properties: 230, Environments: 230})
		c := simClient(t, srv)
		ps, err := c.Accounts().Properties(testCtx(t), platformsim.DemoOrganizationID)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, p := range srv.Properties() {
			want = append(want, p.ID)
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.ID)
			if p.OrganizationID != platformsim.DemoOrganizationID {
				t.Errorf("property %s of organization %q", p.ID, p.OrganizationID)
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("got %d properties, want %d", len(got), len(want))
		}
		if n := srv.Stats().Count(routeProperties, 200); n != 3 {
			t.Errorf("%d pages fetched for 230 properties, want 3", n)
		}
	})
	t.Run("environments", func(t *testing.T) {
		srv := startSim(t, platformsim.Config{Seed: 3, Properties: 2, Environments: 250})
		c := simClient(t, srv)
		ctx := testCtx(t)
		all, err := c.Accounts().OrganizationEnvironments(ctx, platformsim.DemoOrganizationID)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range all {
			got = append(got, e.ID)
		}
		want := srv.EnvironmentIDs()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("got %d environments, want %d", len(got), len(want))
		}
		// 125 environments per property: 2 pages each.
		if n := srv.Stats().Count(routeEnvs, 200); n != 4 {
			t.Errorf("%d environment pages fetched, want 4", n)
		}
		// The lookups the exporter's discovery uses for static
		// environments agree with the listing.
		env, err := c.Accounts().Environment(ctx, all[0].ID)
		if err != nil || env.Name != all[0].Name || env.PropertyID != all[0].PropertyID {
			t.Fatalf("Environment(%s) = %+v, %v; listed as %+v", all[0].ID, env, err, all[0])
		}
		prop, err := c.Accounts().Property(ctx, env.PropertyID)
		if err != nil || prop.ID != env.PropertyID || prop.Slug == "" {
			t.Errorf("Property(%s) = %+v, %v", env.PropertyID, prop, err)
		}
	})
}

func TestSimErrors(t *testing.T) {
	srv := startSim(t, platformsim.Config{Seed: 1})
	ctx := testCtx(t)
	t.Run("404 decoded", func(t *testing.T) {
		c := simClient(t, srv)
		_, err := c.Accounts().Environment(ctx, "00000000-0000-0000-0000-000000000000")
		var e *platform.Error
		if !errors.As(err, &e) || e.Status != 404 || e.Code == "" || e.Title == "" {
			t.Fatalf("err = %v, want a decoded 404", err)
		}
	})
	t.Run("400 details kept", func(t *testing.T) {
		c := simClient(t, srv)
		body := map[string]any{
			"date_range": map[string]string{"start": "2026-11-01T00:00:00Z", "end": "2026-11-01T01:00:00Z"},
			"dimensions": []string{"time"}, "metrics": []string{"no_such_metric"}, "filters": map[string][]string{},
			"time_granularity": "HOUR",
		}
		err := c.Metrics().Do(ctx, http.MethodPost, "/datasets/edge_errors/data", nil, body, nil)
		var e *platform.Error
		if !errors.As(err, &e) || e.Status != 400 || len(e.Details) < 2 {
			t.Fatalf("err = %v, want a 400 with details for the metric and the missing environment filter", err)
		}
		sources := map[string]bool{}
		for _, d := range e.Details {
			if d.Description == "" {
				t.Errorf("detail %+v has no description", d)
			}
			sources[d.Source] = true
		}
		if len(sources) < 2 {
			t.Errorf("details %+v: want distinct sources", e.Details)
		}
	})
	t.Run("bad secret", func(t *testing.T) {
		c := simClient(t, srv, func(cfg *platform.Config) { cfg.ClientSecret = "wrong" })
		_, err := c.Accounts().Environment(ctx, srv.EnvironmentIDs()[0])
		var e *platform.Error
		if !errors.As(err, &e) || e.Status != 401 || e.Code != "invalid_client" {
			t.Fatalf("err = %v, want the token endpoint's 401 invalid_client", err)
		}
	})
	t.Run("scope not granted", func(t *testing.T) {
		c := simClient(t, srv)
		err := c.Service("metrics", "v1", "app.waf").Do(ctx, http.MethodGet, "/datasets", nil, nil, nil)
		if platform.StatusCode(err) != 401 {
			t.Fatalf("err = %v, want 401", err)
		}
	})
}
