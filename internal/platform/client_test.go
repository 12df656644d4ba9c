package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func okHandler(w http.ResponseWriter, r *http.Request, n int) {
	writeJSON(w, http.StatusOK, map[string]any{"n": n, "path": r.URL.Path, "query": r.URL.RawQuery})
}

func TestNewValidates(t *testing.T) {
	good := Config{BaseURL: "https://api.example", AuthURL: "https://id.example", ClientID: "a", ClientSecret: testClientSecret}
	tests := []struct {
		name   string
		mutate func(*Config)
		ok     bool
	}{
		{"good", func(*Config) {}, true},
		{"no base", func(c *Config) { c.BaseURL = "" }, false},
		{"no scheme", func(c *Config) { c.BaseURL = "api.example" }, false},
		{"ftp", func(c *Config) { c.AuthURL = "ftp://id.example" }, false},
		{"query", func(c *Config) { c.BaseURL = "https://api.example/?x=1" }, false},
		{"no id", func(c *Config) { c.ClientID = "" }, false},
		{"no secret", func(c *Config) { c.ClientSecret = "" }, false},
		{"negative timeout", func(c *Config) { c.Timeout = -1 }, false},
		{"burst over budget", func(c *Config) {
			c.RateLimits = map[string]Limits{"metrics": {Read: RateLimit{Requests: 5, Burst: 6}}}
		}, false},
		{"unlimited", func(c *Config) {
			c.RateLimits = map[string]Limits{"metrics": {Read: RateLimit{Requests: -1}}}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mutate(&c)
			_, err := New(c)
			if (err == nil) != tt.ok {
				t.Fatalf("New: err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), c.ClientSecret) && c.ClientSecret != "" {
				t.Fatalf("error leaks the secret: %v", err)
			}
		})
	}
}

func TestServiceURLsAndScopes(t *testing.T) {
	f := newFakeAPI(t, okHandler)
	c := f.client(f.config())
	ctx := ctxT(t)
	for _, tt := range []struct {
		svc  *Service
		want string
	}{
		{c.Metrics(), "/metrics/v1/datasets"},
		{c.Accounts().Service, "/accounts/v0.1/datasets"},
		{c.RTLD(), "/rtld/v1/datasets"},
		{c.Service("config", "v0.1", "app.config"), "/config/v0.1/datasets"},
	} {
		var out struct{ Path string }
		// The fake refuses a token whose scope is not app.<service>.
		if err := tt.svc.Do(ctx, http.MethodGet, "datasets", nil, nil, &out); err != nil {
			t.Fatalf("%s: %v", tt.want, err)
		}
		if out.Path != tt.want {
			t.Errorf("path = %q, want %q", out.Path, tt.want)
		}
	}
	// One token per scope, reused by a second call.
	if err := c.Metrics().Do(ctx, http.MethodGet, "/x", url.Values{"a": {"1 2"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if tok, _ := f.counts(); tok != 4 {
		t.Errorf("token requests = %d, want 4 (one per scope)", tok)
	}
	if first, second := c.Metrics(), c.Metrics(); first != second {
		t.Error("Metrics() returns a new Service each time; want shared token and limiter state")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.userAgents) != 1 || !f.userAgents["edgepipe/test"] {
		t.Errorf("user agents seen = %v, want only edgepipe/test (token requests included)", f.userAgents)
	}
}

func TestDoSendsJSONAndDecodes(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Accept") != "application/json" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"description": "headers"})
			return
		}
		var in map[string]any
		if err := jsonDecode(r, &in); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"description": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"echo": in, "q": r.URL.Query().Get("page")})
	})
	c := f.client(f.config())
	var out struct {
		Echo map[string]any
		Q    string
	}
	err := c.Metrics().Do(ctxT(t), http.MethodPost, "/datasets/x/data", url.Values{"page": {"3"}}, map[string]any{"k": "v"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if out.Echo["k"] != "v" || out.Q != "3" {
		t.Errorf("out = %+v", out)
	}
}

func TestTokenRefreshAcrossExpiry(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, okHandler)
	f.lifetime = time.Second // early refresh margin 200 ms
	c := f.client(f.config())
	ctx := ctxT(t)
	svc := c.Metrics()
	deadline := time.Now().Add(2600 * time.Millisecond)
	calls := 0
	for time.Now().Before(deadline) {
		if err := svc.Do(ctx, http.MethodGet, "/datasets", nil, nil, nil); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		calls++
		time.Sleep(50 * time.Millisecond)
	}
	tokens, api := f.counts()
	f.mu.Lock()
	expired := f.expiredSeen
	f.mu.Unlock()
	if expired != 0 {
		t.Errorf("the API saw %d expired tokens; want refresh before expiry", expired)
	}
	if api != calls {
		t.Errorf("API calls = %d, want %d (no 401 retries needed)", api, calls)
	}
	// 2.6 s of 1 s tokens refreshed 0.2 s early: 3 or 4 tokens, far fewer
	// than the calls made.
	if tokens < 3 || tokens > 4 {
		t.Errorf("token requests = %d over %d calls, want 3..4", tokens, calls)
	}
}

func TestEarlyRefresh(t *testing.T) {
	for _, tt := range []struct{ lifetime, want time.Duration }{
		{5 * time.Second, time.Second},
		{time.Second, 200 * time.Millisecond},
		{300 * time.Second, time.Minute},
		{time.Hour, time.Minute},
	} {
		if got := earlyRefresh(tt.lifetime); got != tt.want {
			t.Errorf("earlyRefresh(%s) = %s, want %s", tt.lifetime, got, tt.want)
		}
	}
}

func TestUnauthorizedRefreshesOnceAndRetries(t *testing.T) {
	t.Run("revoked token", func(t *testing.T) {
		f := newFakeAPI(t, okHandler)
		c := f.client(f.config())
		ctx := ctxT(t)
		if err := c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		f.revoke()
		if err := c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil); err != nil {
			t.Fatalf("after revoke: %v", err)
		}
		if tok, api := f.counts(); tok != 2 || api != 3 {
			t.Errorf("token requests = %d, API calls = %d; want 2 and 3", tok, api)
		}
	})
	t.Run("always 401", func(t *testing.T) {
		f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": "nope", "title": "Unauthorized"})
		})
		c := f.client(f.config())
		err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil)
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusUnauthorized || e.Code != "nope" {
			t.Fatalf("err = %v, want *Error 401 nope", err)
		}
		if tok, api := f.counts(); tok != 2 || api != 2 {
			t.Errorf("token requests = %d, API calls = %d; want 2 and 2 (one re-authentication, no more)", tok, api)
		}
	})
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		statuses  []int // answers of successive calls; past the end: 200
		wantCalls int
		wantErr   int // status of the final *Error, 0 for success
	}{
		{"503 then ok", []int{503, 503}, 3, 0},
		{"500 502 504 then ok", []int{500, 502, 504}, 4, 0},
		{"429 then ok", []int{429}, 2, 0},
		{"always 500", []int{500, 500, 500, 500, 500, 500}, 4, 500},
		{"400 final", []int{400}, 1, 400},
		{"404 final", []int{404}, 1, 404},
		{"403 final", []int{403}, 1, 403},
		{"409 final", []int{409}, 1, 409},
		{"501 final", []int{501}, 1, 501},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n <= len(tt.statuses) {
					writeJSON(w, tt.statuses[n-1], map[string]any{"code": strconv.Itoa(tt.statuses[n-1]), "description": "injected"})
					return
				}
				okHandler(w, r, n)
			})
			obs := &recordingObserver{}
			cfg := f.config()
			cfg.Observer = obs
			c := f.client(cfg)
			err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil)
			if _, api := f.counts(); api != tt.wantCalls {
				t.Errorf("API calls = %d, want %d", api, tt.wantCalls)
			}
			if got := StatusCode(err); got != tt.wantErr || (tt.wantErr == 0) != (err == nil) {
				t.Fatalf("err = %v (status %d), want status %d", err, got, tt.wantErr)
			}
			var metricsCalls int
			for _, o := range obs.all() {
				if o.service == "metrics" {
					metricsCalls++
				}
			}
			if metricsCalls != tt.wantCalls {
				t.Errorf("observer saw %d metrics calls, want %d", metricsCalls, tt.wantCalls)
			}
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		header func() string
		min    time.Duration
	}{
		{"seconds", func() string { return "1" }, time.Second},
		// An HTTP date has second resolution: ask for 2 s ahead, expect
		// more than 1 s.
		{"http date", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					w.Header().Set("Retry-After", tt.header())
					writeJSON(w, http.StatusTooManyRequests, map[string]any{"title": "Too Many Requests"})
					return
				}
				okHandler(w, r, n)
			})
			c := f.client(f.config()) // backoff alone would wait ≤ 50 ms
			start := time.Now()
			if err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took < tt.min {
				t.Errorf("retried after %s, want at least %s (Retry-After)", took, tt.min)
			}
			if _, api := f.counts(); api != 2 {
				t.Errorf("API calls = %d, want 2", api)
			}
		})
	}
}

func TestRetryAfterBeyondBudgetEndsCall(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Retry-After", "3600")
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"title": "slow down"})
	})
	c := f.client(f.config()) // MaxElapsed 10 s
	start := time.Now()
	err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != 429 || e.RetryAfter != time.Hour {
		t.Fatalf("err = %v, want *Error 429 with RetryAfter 1h", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("call took %s; a wait beyond the retry budget should end it at once", time.Since(start))
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 23, 4, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-3", 0},
		{"7", 7 * time.Second},
		{" 12 ", 12 * time.Second},
		{"999999999", 24 * time.Hour},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"Monday, 23-Nov-26 04:00:30 GMT", 30 * time.Second}, // RFC 850
		{"soon", 0},
	} {
		if got := parseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestNetworkErrorsRetried(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			// Drop the connection without an answer.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		okHandler(w, r, n)
	})
	obs := &recordingObserver{}
	cfg := f.config()
	cfg.Observer = obs
	c := f.client(cfg)
	// POST: net/http itself silently resends an idempotent request whose
	// reused connection died, which would hide the failure from the client.
	if err := c.Metrics().Do(ctxT(t), http.MethodPost, "/a", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	want := []observed{{"auth", "POST", 200}, {"metrics", "POST", 0}, {"metrics", "POST", 200}}
	if got := obs.all(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("observed %v, want %v", got, want)
	}
}

func TestAttemptTimeoutRetried(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		okHandler(w, r, n)
	})
	cfg := f.config()
	cfg.Timeout = 200 * time.Millisecond
	c := f.client(cfg)
	if err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, api := f.counts(); api != 2 {
		t.Errorf("API calls = %d, want 2", api)
	}
}

func TestContextCancelStopsRetries(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"title": "down"})
	})
	c := f.client(f.config())
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if StatusCode(err) != http.StatusServiceUnavailable {
		t.Errorf("err = %v: want the last API error kept too", err)
	}
	if took > 2*time.Second {
		t.Errorf("Do returned after %s; the context ended after 300 ms", took)
	}
	if _, api := f.counts(); api != 1 {
		t.Errorf("API calls = %d, want 1", api)
	}

	// An already cancelled context makes no call at all.
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	if err := c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, api := f.counts(); api != 1 {
		t.Errorf("API calls = %d after a cancelled call, want still 1", api)
	}
}

func TestTokenEndpointFailures(t *testing.T) {
	t.Run("bad secret is final", func(t *testing.T) {
		f := newFakeAPI(t, okHandler)
		cfg := f.config()
		cfg.ClientSecret = "wrong-secret-xyz"
		buf := &syncBuffer{}
		cfg.Logger = debugLogger(buf)
		c := f.client(cfg)
		err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil)
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusUnauthorized || e.Code != "invalid_client" {
			t.Fatalf("err = %v, want *Error 401 invalid_client", err)
		}
		if tok, api := f.counts(); tok != 1 || api != 0 {
			t.Errorf("token requests = %d, API calls = %d; want 1 and 0", tok, api)
		}
		if strings.Contains(err.Error(), "wrong-secret-xyz") || strings.Contains(buf.String(), "wrong-secret-xyz") {
			t.Error("the client secret appears in the error or the log")
		}
	})
	t.Run("token 503 retried", func(t *testing.T) {
		f := newFakeAPI(t, okHandler)
		f.tokenStatus = []int{503, 500}
		c := f.client(f.config())
		if err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		if tok, api := f.counts(); tok != 3 || api != 1 {
			t.Errorf("token requests = %d, API calls = %d; want 3 and 1", tok, api)
		}
	})
}

func TestConcurrentCallsShareOneToken(t *testing.T) {
	f := newFakeAPI(t, okHandler)
	c := f.client(f.config())
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if tok, _ := f.counts(); tok != 1 {
		t.Errorf("token requests = %d for 20 concurrent calls, want 1", tok)
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"title": "boom"})
			return
		}
		okHandler(w, r, n)
	})
	buf := &syncBuffer{}
	cfg := f.config()
	cfg.Logger = debugLogger(buf)
	c := f.client(cfg)
	f.revoke()
	if err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	cfg.Logger.Info("config", "platform", cfg)
	log := buf.String()
	if !strings.Contains(log, "retrying") || !strings.Contains(log, "client_secret=[redacted]") {
		t.Fatalf("log lacks the retry warning or the redacted config:\n%s", log)
	}
	if strings.Contains(log, testClientSecret) || strings.Contains(log, "tok-") {
		t.Errorf("log leaks a secret or a token:\n%s", log)
	}
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
		if strings.Contains(s, testClientSecret) {
			t.Errorf("printing Config leaks the secret: %s", s)
		}
	}
}

func TestResponseSizeLimit(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		writeJSON(w, http.StatusOK, map[string]any{"pad": strings.Repeat("x", 4096)})
	})
	cfg := f.config()
	cfg.MaxResponseBytes = 1024
	c := f.client(cfg)
	var out map[string]any
	err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, &out)
	if err == nil || !strings.Contains(err.Error(), "larger than 1024 bytes") {
		t.Fatalf("err = %v, want a size-limit error", err)
	}
	if _, api := f.counts(); api != 1 {
		t.Errorf("API calls = %d, want 1 (not retried)", api)
	}
}

func TestRateLimitWaits(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, okHandler)
	cfg := f.config()
	// 4 reads per 2 s with a burst of 2: the steady rate is 1 per second.
	cfg.RateLimits = map[string]Limits{"metrics": {Read: RateLimit{Requests: 4, Per: 2 * time.Second, Burst: 2}}}
	c := f.client(cfg)
	ctx := ctxT(t)
	start := time.Now()
	for i := range 3 {
		if err := c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("3 calls took %s; the third should wait about 1 s for the limiter", took)
	}
	// Writes have their own budget (default 2000 per 5 min): not held up.
	start = time.Now()
	if err := c.Metrics().Do(ctx, http.MethodPost, "/a", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("a write waited %s behind the read budget", took)
	}
	// A context that ends before the limiter would allow the call fails fast.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_ = c.Metrics().Do(ctx, http.MethodGet, "/a", nil, nil, nil) // use the token
	if err := c.Metrics().Do(short, http.MethodGet, "/a", nil, nil, nil); err == nil || !strings.Contains(err.Error(), "rate limit") {
		t.Errorf("err = %v, want a client-side rate limit error", err)
	}
}

func TestRateLimiterBudget(t *testing.T) {
	for _, tt := range []struct {
		l         RateLimit
		wantBurst int
		wantRate  float64 // per second
	}{
		{RateLimit{Requests: 2000, Per: 5 * time.Minute}, 100, 1900.0 / 300},
		{RateLimit{Requests: 600, Per: 5 * time.Minute}, 30, 570.0 / 300},
		{RateLimit{Requests: 10, Per: time.Second, Burst: 4}, 4, 6},
		{RateLimit{Requests: 1, Per: time.Second}, 1, 1},
	} {
		lim := tt.l.limiter()
		if lim.Burst() != tt.wantBurst || float64(lim.Limit()) < tt.wantRate*0.999 || float64(lim.Limit()) > tt.wantRate*1.001 {
			t.Errorf("%+v: burst %d rate %.4f/s, want %d and %.4f/s", tt.l, lim.Burst(), float64(lim.Limit()), tt.wantBurst, tt.wantRate)
		}
		// The budget holds over one window: burst plus refill.
		if tt.l.Requests > 1 {
			if got := float64(lim.Burst()) + float64(lim.Limit())*tt.l.Per.Seconds(); got > float64(tt.l.Requests)+0.001 {
				t.Errorf("%+v: %.1f requests fit in one window, budget %d", tt.l, got, tt.l.Requests)
			}
		}
	}
	def := DefaultRateLimits()
	if def["accounts"].Read.Requests != 2000 || def["accounts"].Write.Requests != 600 || def["cache"].Write.Requests != 2000 {
		t.Errorf("defaults do not match spec section 8: %+v", def)
	}
	merged := limitsFor("accounts", map[string]Limits{"accounts": {Write: RateLimit{Requests: 10}}})
	if merged.Read.Requests != 2000 || merged.Write.Requests != 10 {
		t.Errorf("override merge = %+v", merged)
	}
}

func TestUnreachablePlatformBounded(t *testing.T) {
	f := newFakeAPI(t, okHandler)
	cfg := f.config()
	f.srv.Close() // connection refused from now on
	cfg.Retry.MaxAttempts = 3
	obs := &recordingObserver{}
	cfg.Observer = obs
	c := f.client(cfg)
	err := c.Metrics().Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil)
	if err == nil || StatusCode(err) != 0 {
		t.Fatalf("err = %v, want a network error without an API status", err)
	}
	if !strings.Contains(err.Error(), "after 3 attempts") {
		t.Errorf("err = %q, want the attempt count", err)
	}
	want := []observed{{"auth", "POST", 0}, {"auth", "POST", 0}, {"auth", "POST", 0}}
	if got := obs.all(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("observed %v, want %v", got, want)
	}
}

// dateRecorder keeps every ObserveDate call.
type dateRecorder struct {
	mu    sync.Mutex
	dates []time.Time
}

func (d *dateRecorder) ObserveDate(date time.Time, rtt time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rtt < 0 {
		date = time.Time{} // a negative round trip is a bug: fail below
	}
	d.dates = append(d.dates, date)
}

// TestDateObserverSeesAPIAnswers checks that the Date header of every API
// answer, errors included, reaches the DateObserver, and that the token
// endpoint's answers and a missing or malformed Date do not.
func TestDateObserverSeesAPIAnswers(t *testing.T) {
	platformTime := time.Date(2026, 11, 23, 9, 20, 7, 0, time.UTC) // an hour behind this machine, say
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		switch n {
		case 1:
			w.Header().Set("Date", platformTime.Format(http.TimeFormat))
			writeJSON(w, http.StatusOK, map[string]any{})
		case 2:
			w.Header().Set("Date", platformTime.Add(time.Second).Format(http.TimeFormat))
			writeJSON(w, http.StatusNotFound, map[string]any{"code": "not_found"})
		case 3:
			w.Header()["Date"] = nil // net/http adds none then
			writeJSON(w, http.StatusOK, map[string]any{})
		default:
			w.Header().Set("Date", "yesterday")
			writeJSON(w, http.StatusOK, map[string]any{})
		}
	})
	rec := &dateRecorder{}
	cfg := f.config()
	cfg.DateObserver = rec
	c := f.client(cfg)
	svc := c.Metrics()
	if err := svc.Do(ctxT(t), http.MethodGet, "/a", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := svc.Do(ctxT(t), http.MethodGet, "/b", nil, nil, nil); StatusCode(err) != http.StatusNotFound {
		t.Fatalf("err = %v, want the 404", err)
	}
	for range 2 {
		if err := svc.Do(ctxT(t), http.MethodGet, "/c", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []time.Time{platformTime, platformTime.Add(time.Second)}
	if len(rec.dates) != len(want) {
		t.Fatalf("observed %v, want %v (the token endpoint and answers without a valid Date are not reported)", rec.dates, want)
	}
	for i := range want {
		if !rec.dates[i].Equal(want[i]) {
			t.Errorf("date %d = %v, want %v", i, rec.dates[i], want[i])
		}
	}
}
