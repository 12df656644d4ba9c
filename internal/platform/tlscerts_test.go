package platform_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

const routeTLSCerts = "GET /config/v0.1/tls-certs"

// TestSimTLSCertificates lists an environment with 250 certificates (three
// pages of 100) and one with a few (one page), and gets one by ID: every
// field equals the simulator's.
func TestSimTLSCertificates(t *testing.T) {
	t.Parallel()
	srv := startSim(t, platformsim.Config{Seed: 4})
	c := simClient(t, srv).ConfigService()
	ctx := testCtx(t)
	big, small := srv.EnvironmentIDs()[0], srv.EnvironmentIDs()[1]
	if _, err := srv.AddTLSCertificates(big, 250-1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env   string
		pages int
	}{{big, 3}, {small, 1}} {
		srv.ResetStats()
		got, err := c.TLSCertificates(ctx, tc.env)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := srv.TLSCertificates(tc.env)
		if len(got) != len(want) {
			t.Fatalf("%d certificates, want %d", len(got), len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.ID != w.ID || g.EnvironmentID != tc.env || g.CommonName != w.CommonName || g.Serial != w.Serial ||
				g.Status != w.Status || g.ActivationError != w.ActivationError || g.Generated != w.Generated ||
				!g.Expiration.Equal(w.Expiration) || !g.CreatedAt.Equal(w.CreatedAt) || strings.Join(g.AlternativeNames, ",") != strings.Join(w.AlternativeNames, ",") {
				t.Fatalf("certificate %d = %+v, want %+v", i, g, w)
			}
		}
		if n := srv.Stats().Count(routeTLSCerts, 200); n != tc.pages {
			t.Errorf("%d certificates in %d requests, want %d (pages of %d)", len(got), n, tc.pages, platform.PageSize)
		}
	}
	want, _ := srv.TLSCertificates(small)
	one, err := c.TLSCertificate(ctx, want[0].ID)
	if err != nil || one.ID != want[0].ID || !one.Expiration.Equal(want[0].Expiration) {
		t.Fatalf("TLSCertificate = %+v, %v", one, err)
	}
}

// TestSimTLSCertificatesWithoutScope: a client the platform did not grant
// app.config gets an error IsRefused recognises, naming the scope, after one
// token request and no API request.
func TestSimTLSCertificatesWithoutScope(t *testing.T) {
	t.Parallel()
	srv := startSim(t, platformsim.Config{Seed: 4, Clients: []platformsim.Client{
		platformsim.DemoClient(platformsim.ScopeMetrics, platformsim.ScopeAccounts)}})
	c := simClient(t, srv)
	_, err := c.ConfigService().TLSCertificates(testCtx(t), srv.EnvironmentIDs()[0])
	if err == nil || !platform.IsRefused(err) || !strings.Contains(err.Error(), platform.ScopeConfig) {
		t.Fatalf("err = %v, want a refusal naming %s", err, platform.ScopeConfig)
	}
	st := srv.Stats()
	if n, api := st.Count(routeToken, 0), st.Count(routeTLSCerts, 0); n != 1 || api != 0 {
		t.Errorf("%d token requests and %d API requests, want 1 and 0 (a refusal is final)", n, api)
	}
	// The other services still work.
	if _, err := c.Accounts().Environment(testCtx(t), srv.EnvironmentIDs()[0]); err != nil {
		t.Fatal(err)
	}
}

func TestIsRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&platform.Error{Status: 401, Code: "insufficient_scope"}, true},
		{&platform.Error{Status: 403}, true},
		{&platform.Error{Status: 400, Code: "invalid_scope"}, true},
		{&platform.Error{Status: 400, Code: "invalid_client"}, true},
		{&platform.Error{Status: 400, Code: "invalid_parameter"}, false},
		{&platform.Error{Status: 404}, false},
		{&platform.Error{Status: 429}, false},
		{errors.New("connection refused"), false},
		{fmt.Errorf("wrapped: %w", &platform.Error{Status: 401}), true},
	} {
		if got := platform.IsRefused(tc.err); got != tc.want {
			t.Errorf("IsRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
