package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func parseCommon(t *testing.T, args ...string) (*commonFlags, *runFlags, error) {
	t.Helper()
	cl := newCommandLine(io.Discard, io.Discard)
	if _, err := cl.app.Parse(args); err != nil {
		return nil, nil, err
	}
	return cl.common, cl.run, cl.common.resolve()
}

func TestFlags(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string
		check   func(*testing.T, *commonFlags, *runFlags)
	}{
		{name: "simulate needs nothing", args: []string{"--simulate"}, check: func(t *testing.T, _ *commonFlags, rf *runFlags) {
			if rf.pollInterval != time.Minute || rf.settleWindow != 0 || (*rf.web.Flags.WebListenAddresses)[0] != ":9780" {
				t.Errorf("defaults: poll %v settle %v listen %v", rf.pollInterval, rf.settleWindow, *rf.web.Flags.WebListenAddresses)
			}
		}},
		{name: "no api url", args: []string{"--environment-id=e1"}, wantErr: "--api.url"},
		{name: "nothing to serve", args: []string{"--api.url=http://x"}, env: map[string]string{envClientID: "id", envClientSecret: "s"}, wantErr: "nothing to serve"},
		{name: "no credentials", args: []string{"--api.url=http://x", "--environment-id=e1"}, wantErr: envClientSecret},
		{name: "env lists split on commas", args: []string{"--api.url=http://x"},
			env: map[string]string{envClientID: "id", envClientSecret: "s", envEnvironmentIDs: "e1, e2,,e3", envOrganizations: "o1"},
			check: func(t *testing.T, c *commonFlags, _ *runFlags) {
				if !slices.Equal(c.environmentIDs, []string{"e1", "e2", "e3"}) || !slices.Equal(c.organizationIDs, []string{"o1"}) {
					t.Errorf("envs %v orgs %v", c.environmentIDs, c.organizationIDs)
				}
				if c.authURL != "http://x" || c.clientSecret != "s" {
					t.Errorf("auth url %q", c.authURL)
				}
			}},
		{name: "flags repeat and split", args: []string{"--api.url=http://x", "--environment-id=e1,e2", "--environment-id=e3", "--client-secret-file=" + secretFile},
			env: map[string]string{envClientID: "id", envEnvironmentIDs: "ignored"},
			check: func(t *testing.T, c *commonFlags, _ *runFlags) {
				if !slices.Equal(c.environmentIDs, []string{"e1", "e2", "e3"}) || c.clientSecret != "from-file" {
					t.Errorf("envs %v secret %q", c.environmentIDs, c.clientSecret)
				}
			}},
		{name: "bad granularity", args: []string{"--simulate", "--granularity=minute"}, wantErr: "--granularity"},
		{name: "bad shard", args: []string{"--simulate", "--shard.index=3", "--shard.count=3"}, wantErr: "--shard"},
		{name: "hourly", args: []string{"--simulate", "--granularity=hour", "--shard.index=1", "--shard.count=3"}, check: func(t *testing.T, c *commonFlags, _ *runFlags) {
			if c.granularity != "HOUR" || c.shard.Index != 1 || c.shard.Count != 3 {
				t.Errorf("%v %+v", c.granularity, c.shard)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{envClientID, envClientSecret, envEnvironmentIDs, envOrganizations, "EDGEPIPE_API_URL", "EDGEPIPE_AUTH_URL"} {
				t.Setenv(k, tc.env[k])
			}
			c, rf, err := parseCommon(t, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, c, rf)
			}
		})
	}
}

// TestSimulateWithBasicAuth runs `exporter --simulate` (real clock) with a
// --web.config.file requiring basic auth: ready after the first polls,
// /metrics refused without credentials and served with them.
func TestSimulateWithBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("scrape-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webCfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webCfg, []byte("basic_auth_users:\n  prom: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{envClientID, envClientSecret, envEnvironmentIDs, envOrganizations, "EDGEPIPE_API_URL", "EDGEPIPE_AUTH_URL"} {
		t.Setenv(k, "")
	}
	c, rf, err := parseCommon(t, "--simulate", "--web.config.file="+webCfg, "--poll.jitter=0s")
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHost(c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.sim.cfg = platformsim.Config{Environments: 3}
	defer h.close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runExporter(ctx, h, rf, nil, runDeps{listener: l}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	url := "http://" + l.Addr().String()
	get := func(path string, auth bool) int {
		req, _ := http.NewRequest(http.MethodGet, url+path, nil)
		if auth {
			req.SetBasicAuth("prom", "scrape-pw")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	deadline := time.Now().Add(15 * time.Second)
	for get("/readyz", true) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("not ready 15s after start with --simulate")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := get("/metrics", false); code != http.StatusUnauthorized {
		t.Errorf("/metrics without credentials: %d, want 401", code)
	}
	if code := get("/metrics", true); code != http.StatusOK {
		t.Errorf("/metrics with credentials: %d", code)
	}
	if !slices.Equal(c.organizationIDs, []string{platformsim.DemoOrganizationID}) {
		t.Errorf("--simulate serves %v, want the demo organization", c.organizationIDs)
	}
}
