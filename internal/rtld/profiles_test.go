package rtld

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// countingAPI counts the calls by method and can run a hook before one.
type countingAPI struct {
	api    ProfileAPI
	mu     sync.Mutex
	calls  map[string]int
	before func(method, path string)
}

func (c *countingAPI) Do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	c.mu.Lock()
	c.calls[method]++
	hook := c.before
	c.mu.Unlock()
	if hook != nil {
		hook(method, path)
	}
	return c.api.Do(ctx, method, path, query, in, out)
}

func (c *countingAPI) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[method]
}

// recordingObserver collects registration results.
type recordingObserver struct {
	mu  sync.Mutex
	got []RegistrationResult
}

func (o *recordingObserver) ObserveRegistration(_ string, r RegistrationResult) {
	o.mu.Lock()
	o.got = append(o.got, r)
	o.mu.Unlock()
}

// basicAuthReceiver is an HTTPS endpoint recording the basic-auth password
// of every delivery.
type basicAuthReceiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	passwords []string
}

func newBasicAuthReceiver(t *testing.T) *basicAuthReceiver {
	b := &basicAuthReceiver{}
	b.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pw, _ := r.BasicAuth()
		b.mu.Lock()
		b.passwords = append(b.passwords, pw)
		b.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

type registrarFixture struct {
	sim  *platformsim.Server
	api  *countingAPI
	envs []string
	rcv  *basicAuthReceiver
}

func newRegistrarFixture(t *testing.T) *registrarFixture {
	t.Helper()
	rcv := newBasicAuthReceiver(t)
	pool := x509.NewCertPool()
	pool.AddCert(rcv.srv.Certificate())
	sim, err := platformsim.New(platformsim.Config{Seed: 21, Delivery: platformsim.DeliveryConfig{
		TLSConfig: &tls.Config{RootCAs: pool}, RetryInterval: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	client, err := platform.New(platform.Config{BaseURL: base, AuthURL: base,
		ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret,
		Retry: platform.RetryConfig{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return &registrarFixture{sim: sim, api: &countingAPI{api: client.RTLD(), calls: map[string]int{}},
		envs: sim.EnvironmentIDs()[:2], rcv: rcv}
}

func (f *registrarFixture) config(password string) RegistrarConfig {
	return RegistrarConfig{EnvironmentIDs: f.envs, PublicURL: f.rcv.srv.URL + "/", Username: "edgepipe", Password: password}
}

func (f *registrarFixture) registrar(t *testing.T, cfg RegistrarConfig) *Registrar {
	t.Helper()
	r, err := NewRegistrar(f.api, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// profiles lists env's profiles through the API.
func (f *registrarFixture) profiles(t *testing.T, env string) []remoteProfile {
	t.Helper()
	ps, err := listAllRTLD[remoteProfile](context.Background(), f.api.api, profilesPath, url.Values{"environment_id": {env}})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func (f *registrarFixture) only(t *testing.T, env string) remoteProfile {
	t.Helper()
	ps := f.profiles(t, env)
	if len(ps) != 1 {
		t.Fatalf("environment %s has %d profiles, want 1", env, len(ps))
	}
	return ps[0]
}

// deliveredPassword makes the simulator deliver one record to profile id and
// returns the password it sent.
func (f *registrarFixture) deliveredPassword(t *testing.T, id int64) string {
	t.Helper()
	f.rcv.mu.Lock()
	n := len(f.rcv.passwords)
	f.rcv.mu.Unlock()
	if err := f.sim.DeliverRecords(context.Background(), id, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	f.rcv.mu.Lock()
	defer f.rcv.mu.Unlock()
	if len(f.rcv.passwords) <= n {
		t.Fatal("nothing delivered")
	}
	return f.rcv.passwords[len(f.rcv.passwords)-1]
}

func TestRegistrarCreatesIdempotentAndRefreshesPassword(t *testing.T) {
	f := newRegistrarFixture(t)
	obs := &recordingObserver{}
	cfg := f.config("first-password")
	cfg.Observer = obs
	r := f.registrar(t, cfg)
	ctx := context.Background()
	if err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(obs.got, []RegistrationResult{RegistrationCreated, RegistrationCreated}) {
		t.Errorf("results %v", obs.got)
	}
	for _, env := range f.envs {
		p := f.only(t, env)
		dm := p.DeliveryMethod
		if p.ProfileName != DefaultProfileName || !p.Enabled || dm.Type != "http_post" || dm.LogFormat != "json" ||
			dm.DestinationEndpoint != f.rcv.srv.URL+"/ingest/"+env || dm.Authentication == nil ||
			dm.Authentication.Type != "http_basic" || dm.Authentication.Username != "edgepipe" {
			t.Errorf("profile %+v", p)
		}
		if !slices.Equal(p.Fields, accesslog.FieldCodes()) {
			t.Errorf("fields %v, want every listed field", p.Fields)
		}
	}
	id := f.only(t, f.envs[0]).ID
	if pw := f.deliveredPassword(t, id); pw != "first-password" {
		t.Errorf("delivery used password %q", pw)
	}

	// A second check of the same process writes nothing.
	posts, puts := f.api.count("POST"), f.api.count("PUT")
	if err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.api.count("POST") != posts || f.api.count("PUT") != puts {
		t.Errorf("second check wrote: POST %d→%d, PUT %d→%d", posts, f.api.count("POST"), puts, f.api.count("PUT"))
	}
	if got := obs.got[len(obs.got)-2:]; !slices.Equal(got, []RegistrationResult{RegistrationUnchanged, RegistrationUnchanged}) {
		t.Errorf("results %v", got)
	}

	// A restart with a rotated password updates each profile once, in place.
	r2 := f.registrar(t, f.config("rotated-password"))
	for i, want := range []RegistrationResult{RegistrationUpdated, RegistrationUnchanged} {
		res, err := r2.ReconcileEnvironment(ctx, f.envs[0])
		if err != nil || res != want {
			t.Errorf("check %d after restart: %s, %v; want %s", i, res, err, want)
		}
	}
	if p := f.only(t, f.envs[0]); p.ID != id {
		t.Errorf("profile ID changed %d → %d", id, p.ID)
	}
	if pw := f.deliveredPassword(t, id); pw != "rotated-password" {
		t.Errorf("after restart delivery used password %q", pw)
	}
}

func TestRegistrarRepairsDrift(t *testing.T) {
	f := newRegistrarFixture(t)
	cfg := f.config("pw")
	cfg.Fields = []string{"timestamp", "uuid", "status_code", "host", "path"}
	r := f.registrar(t, cfg)
	ctx := context.Background()
	env := f.envs[0]
	if _, err := r.ReconcileEnvironment(ctx, env); err != nil {
		t.Fatal(err)
	}
	orig := f.only(t, env)
	edit := func(mut func(b map[string]any)) {
		t.Helper()
		b := map[string]any{
			"environment_id": env, "profile_name": DefaultProfileName, "enabled": true,
			"fields":      []string{"timestamp", "uuid", "status_code", "host", "path"},
			"description": "edited by a human",
			"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": orig.DeliveryMethod.DestinationEndpoint,
				"log_format": "json", "authentication": map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw"}},
		}
		mut(b)
		if err := f.api.api.Do(ctx, http.MethodPut, profilesPath+"/"+strconv.FormatInt(orig.ID, 10), nil, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	dm := func(b map[string]any) map[string]any { return b["delivery_method"].(map[string]any) }
	tests := []struct {
		name string
		mut  func(b map[string]any)
		want RegistrationResult
	}{
		{"description edited (kept)", func(_ map[string]any) {}, RegistrationUnchanged},
		{"custom header added (kept)", func(b map[string]any) { b["custom_request_headers"] = []string{"X-Request-Id"} }, RegistrationUnchanged},
		{"disabled", func(b map[string]any) { b["enabled"] = false }, RegistrationRepaired},
		{"destination changed", func(b map[string]any) { dm(b)["destination_endpoint"] = "https://elsewhere.example.com/x" }, RegistrationRepaired},
		{"format changed", func(b map[string]any) { dm(b)["log_format"] = "csv" }, RegistrationRepaired},
		{"username changed", func(b map[string]any) { dm(b)["authentication"].(map[string]any)["username"] = "someone" }, RegistrationRepaired},
		{"field removed", func(b map[string]any) { b["fields"] = []string{"uuid"} }, RegistrationRepaired},
		{"fields reordered (same set)", func(b map[string]any) {
			b["fields"] = []string{"uuid", "timestamp", "status_code", "host", "path"}
		}, RegistrationUnchanged},
		{"downsampling set (kept: the operator's cost decision)", func(b map[string]any) { b["downsampling_percent"] = 25 }, RegistrationUnchanged},
		{"filters", func(b map[string]any) { b["filters"] = map[string]any{"status_codes": []string{"5xx"}} }, RegistrationRepaired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			edit(tt.mut)
			res, err := r.ReconcileEnvironment(ctx, env)
			if err != nil || res != tt.want {
				t.Fatalf("result %s, %v; want %s", res, err, tt.want)
			}
			p := f.only(t, env)
			if d := drift(&p, r.desired(env, cfg.Fields, &p)); len(d) > 0 {
				t.Errorf("still drifted after the check: %v", d)
			}
			if p.Description != "edited by a human" {
				t.Errorf("description %q not kept", p.Description)
			}
			if strings.Contains(tt.name, "custom header") && !slices.Equal(p.CustomRequestHeaders, []string{"X-Request-Id"}) {
				t.Errorf("custom headers not kept: %+v", p)
			}
			if strings.Contains(tt.name, "downsampling") && (p.DownsamplingPercent == nil || *p.DownsamplingPercent != 25) {
				t.Errorf("downsampling_percent not kept: %v", percentString(p.DownsamplingPercent))
			}
		})
	}

	t.Run("deleted profile is recreated", func(t *testing.T) {
		if err := f.api.api.Do(ctx, http.MethodDelete, profilesPath+"/"+strconv.FormatInt(orig.ID, 10), url.Values{"environment_id": {env}}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if res, err := r.ReconcileEnvironment(ctx, env); err != nil || res != RegistrationCreated {
			t.Fatalf("result %s, %v", res, err)
		}
		if p := f.only(t, env); p.ID == orig.ID {
			t.Error("same ID after delete")
		}
	})
}

// TestRegistrarDownsampling: a configured downsampling_percent is set on
// create and restored when edited; without one, the profile's own is kept
// through the password refresh (a PUT replaces the whole profile).
func TestRegistrarDownsampling(t *testing.T) {
	ctx := context.Background()
	pct := func(p *remoteProfile) string { return percentString(p.DownsamplingPercent) }
	t.Run("configured", func(t *testing.T) {
		f := newRegistrarFixture(t)
		cfg := f.config("pw")
		quarter := 25.0
		cfg.DownsamplingPercent = &quarter
		r := f.registrar(t, cfg)
		env := f.envs[0]
		if res, err := r.ReconcileEnvironment(ctx, env); err != nil || res != RegistrationCreated {
			t.Fatalf("result %s, %v", res, err)
		}
		p := f.only(t, env)
		if pct(&p) != "25%" {
			t.Fatalf("created with downsampling %s, want 25%%", pct(&p))
		}
		b := map[string]any{
			"environment_id": env, "profile_name": DefaultProfileName, "enabled": true, "fields": p.Fields, "downsampling_percent": 75,
			"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": p.DeliveryMethod.DestinationEndpoint,
				"log_format": "json", "authentication": map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw"}},
		}
		if err := f.api.api.Do(ctx, http.MethodPut, profilesPath+"/"+strconv.FormatInt(p.ID, 10), nil, b, nil); err != nil {
			t.Fatal(err)
		}
		if res, err := r.ReconcileEnvironment(ctx, env); err != nil || res != RegistrationRepaired {
			t.Fatalf("after an edit to 75%%: result %s, %v; want repaired", res, err)
		}
		if p := f.only(t, env); pct(&p) != "25%" {
			t.Fatalf("downsampling %s after the repair, want 25%%", pct(&p))
		}
	})
	t.Run("kept", func(t *testing.T) {
		f := newRegistrarFixture(t)
		env := f.envs[0]
		if _, err := f.registrar(t, f.config("pw")).ReconcileEnvironment(ctx, env); err != nil {
			t.Fatal(err)
		}
		p := f.only(t, env)
		b := map[string]any{
			"environment_id": env, "profile_name": DefaultProfileName, "enabled": true, "fields": p.Fields, "downsampling_percent": 0.1,
			"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": p.DeliveryMethod.DestinationEndpoint,
				"log_format": "json", "authentication": map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw"}},
		}
		if err := f.api.api.Do(ctx, http.MethodPut, profilesPath+"/"+strconv.FormatInt(p.ID, 10), nil, b, nil); err != nil {
			t.Fatal(err)
		}
		// A new registrar (a restart) writes the profile once to set the
		// password: the PUT must carry the operator's 0.1%.
		r := f.registrar(t, f.config("pw"))
		if res, err := r.ReconcileEnvironment(ctx, env); err != nil || res != RegistrationUpdated {
			t.Fatalf("result %s, %v; want updated", res, err)
		}
		if p := f.only(t, env); pct(&p) != "0.1%" {
			t.Fatalf("downsampling %s after the restart's update, want the operator's 0.1%%", pct(&p))
		}
	})
}

func TestRegistrarReplicaRace(t *testing.T) {
	t.Run("create refused because another replica created it", func(t *testing.T) {
		f := newRegistrarFixture(t)
		other, err := NewRegistrar(f.api.api, f.config("pw"))
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		f.api.before = func(method, _ string) {
			if method == http.MethodPost {
				// Between our list and our create, the other replica wins.
				once.Do(func() {
					if _, err := other.ReconcileEnvironment(context.Background(), f.envs[0]); err != nil {
						t.Error(err)
					}
				})
			}
		}
		r := f.registrar(t, f.config("pw"))
		res, err := r.ReconcileEnvironment(context.Background(), f.envs[0])
		if err != nil || res != RegistrationUpdated {
			t.Fatalf("result %s, %v; want updated after losing the create race", res, err)
		}
		f.only(t, f.envs[0])
	})
	t.Run("many replicas at once", func(t *testing.T) {
		f := newRegistrarFixture(t)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 6)
		for range 6 {
			r := f.registrar(t, f.config("pw"))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs <- r.Reconcile(context.Background())
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		for _, env := range f.envs {
			f.only(t, env)
		}
	})
}

func TestRegistrarRunRepairsPeriodically(t *testing.T) {
	f := newRegistrarFixture(t)
	cfg := f.config("pw")
	cfg.Interval = 20 * time.Millisecond
	obs := &recordingObserver{}
	cfg.Observer = obs
	r := f.registrar(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("registration", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.got) >= len(f.envs) && !slices.Contains(obs.got, RegistrationFailed) && len(f.profiles(t, f.envs[0])) == 1
	})
	env := f.envs[0]
	p := f.only(t, env)
	err := f.api.api.Do(ctx, http.MethodPut, profilesPath+"/"+strconv.FormatInt(p.ID, 10), nil, map[string]any{
		"environment_id": env, "profile_name": DefaultProfileName, "enabled": false, "fields": []string{"uuid"},
		"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": "https://x.example.com/",
			"log_format": "json", "authentication": map[string]any{"type": "http_basic", "username": "u", "password": "p"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("repair", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return slices.Contains(obs.got, RegistrationRepaired)
	})
	if q := f.only(t, env); !q.Enabled || q.DeliveryMethod.DestinationEndpoint != r.Destination(env) {
		t.Errorf("not repaired: %+v", q)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRegistrarFailuresAreReported(t *testing.T) {
	f := newRegistrarFixture(t)
	obs := &recordingObserver{}
	cfg := f.config("pw")
	cfg.EnvironmentIDs = []string{f.envs[0], "00000000-0000-4000-8000-000000000000"}
	cfg.Observer = obs
	r := f.registrar(t, cfg)
	err := r.Reconcile(context.Background())
	var perr *platform.Error
	if err == nil || !errors.As(err, &perr) || perr.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "00000000-0000-4000-8000-000000000000") {
		t.Fatalf("err %v", err)
	}
	if !slices.Equal(obs.got, []RegistrationResult{RegistrationCreated, RegistrationFailed}) {
		t.Errorf("results %v", obs.got)
	}
	f.only(t, f.envs[0])
}

func TestNewRegistrarValidation(t *testing.T) {
	ok := RegistrarConfig{EnvironmentIDs: []string{"e"}, PublicURL: "https://rx.example.com", Username: "u", Password: "p"}
	tests := []struct {
		name string
		mut  func(c *RegistrarConfig)
		want string
	}{
		{"valid", func(_ *RegistrarConfig) {}, ""},
		{"http public URL", func(c *RegistrarConfig) { c.PublicURL = "http://rx.example.com" }, "https"},
		{"no public URL", func(c *RegistrarConfig) { c.PublicURL = "" }, "https"},
		{"public URL with query", func(c *RegistrarConfig) { c.PublicURL = "https://rx.example.com/?a=b" }, "https"},
		{"no environments", func(c *RegistrarConfig) { c.EnvironmentIDs = nil }, "environment"},
		{"no password", func(c *RegistrarConfig) { c.Password = "" }, "EDGEPIPE_RTLD_PASSWORD"},
		{"colon in username", func(c *RegistrarConfig) { c.Username = "a:b" }, "colon"},
		{"name too long", func(c *RegistrarConfig) { c.ProfileName = strings.Repeat("n", 37) }, "36"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mut(&c)
			_, err := NewRegistrar(&countingAPI{calls: map[string]int{}}, c)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("err %v, want %q", err, tt.want)
			}
		})
	}
	c := ok
	c.Password = "hunter2-secret"
	if s := fmt.Sprint(c) + fmt.Sprintf("%+v", c); strings.Contains(s, "hunter2") {
		t.Errorf("config prints the password: %s", s)
	}
	r, _ := NewRegistrar(&countingAPI{calls: map[string]int{}}, ok)
	if got := r.Destination("env-1"); got != "https://rx.example.com/ingest/env-1" {
		t.Errorf("destination %q", got)
	}
}
