package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	testClientID     = "test-client"
	testClientSecret = "s3cret-value-never-logged"
)

// fakeAPI is a minimal platform for unit tests: a token endpoint issuing
// tokens of a set lifetime, and API routes that check them and then defer to
// a per-test handler. The full simulator (internal/platformsim) is used by the
// integration tests.
type fakeAPI struct {
	t        *testing.T
	srv      *httptest.Server
	lifetime time.Duration

	mu          sync.Mutex
	tokens      map[string]fakeToken
	tokenCalls  int
	tokenStatus []int // statuses the next token calls answer with, 0 = issue
	apiCalls    int
	expiredSeen int
	userAgents  map[string]bool
	handler     func(w http.ResponseWriter, r *http.Request, n int)
}

type fakeToken struct {
	scope   string
	expires time.Time
}

func newFakeAPI(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, n int)) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, lifetime: time.Minute, tokens: map[string]fakeToken{}, userAgents: map[string]bool{}, handler: handler}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /connect/token", f.token)
	mux.HandleFunc("/", f.api)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) token(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokenCalls++
	n := f.tokenCalls
	f.userAgents[r.UserAgent()] = true
	var status int
	if len(f.tokenStatus) > 0 {
		status, f.tokenStatus = f.tokenStatus[0], f.tokenStatus[1:]
	}
	f.mu.Unlock()
	if status != 0 {
		writeJSON(w, status, map[string]any{"error": "invalid_client", "error_description": "injected"})
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.PostForm.Get("grant_type") != "client_credentials" ||
		r.PostForm.Get("client_id") != testClientID || r.PostForm.Get("client_secret") != testClientSecret {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "invalid_client"})
		return
	}
	tok := fmt.Sprintf("tok-%d-%s", n, strings.ReplaceAll(r.PostForm.Get("scope"), " ", "+"))
	f.mu.Lock()
	f.tokens[tok] = fakeToken{scope: r.PostForm.Get("scope"), expires: time.Now().Add(f.lifetime)}
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": tok, "token_type": "Bearer", "scope": r.PostForm.Get("scope"),
		"expires_in": int(f.lifetime / time.Second),
	})
}

func (f *fakeAPI) api(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.apiCalls++
	n := f.apiCalls
	f.userAgents[r.UserAgent()] = true
	tok, ok := f.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	expired := ok && time.Now().After(tok.expires)
	if expired {
		f.expiredSeen++
	}
	f.mu.Unlock()
	if !ok || expired {
		writeJSON(w, http.StatusUnauthorized, map[string]any{
			"@type": "Error", "code": "unauthenticated", "status_code": 401, "title": "Unauthorized",
			"description": "token missing, invalid or expired",
		})
		return
	}
	if svc := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)[0]; tok.scope != "app."+svc {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"code": "insufficient_scope", "description": "scope " + tok.scope})
		return
	}
	f.handler(w, r, n)
}

// revoke forgets every issued token, as a secret rotation would.
func (f *fakeAPI) revoke() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = map[string]fakeToken{}
}

func (f *fakeAPI) counts() (tokenCalls, apiCalls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenCalls, f.apiCalls
}

// config returns a client configuration for f with fast retries.
func (f *fakeAPI) config() Config {
	return Config{
		BaseURL:      f.srv.URL,
		AuthURL:      f.srv.URL,
		ClientID:     testClientID,
		ClientSecret: testClientSecret,
		Timeout:      5 * time.Second,
		Retry:        RetryConfig{MaxAttempts: 4, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxElapsed: 10 * time.Second},
		Version:      "test",
	}
}

func (f *fakeAPI) client(cfg Config) *Client {
	f.t.Helper()
	c, err := New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// recordingObserver keeps every ObserveRequest call.
type recordingObserver struct {
	mu    sync.Mutex
	calls []observed
}

type observed struct {
	service, method string
	status          int
}

func (o *recordingObserver) ObserveRequest(service, method string, status int, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, observed{service, method, status})
}

func (o *recordingObserver) all() []observed {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]observed(nil), o.calls...)
}

// syncBuffer is a bytes.Buffer safe for a logger shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func debugLogger(buf *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func jsonDecode(r *http.Request, v any) error {
	return json.NewDecoder(r.Body).Decode(v)
}
