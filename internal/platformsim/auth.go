package platformsim

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"math"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

type token struct {
	clientID string
	scopes   []string
	expires  time.Time
}

// scopeCovers reports whether holding scope have grants scope want: equal, or
// have is a broader scope (`app` covers `app.metrics` and `app.metrics:read`).
func scopeCovers(have, want string) bool {
	if have == want {
		return true
	}
	return strings.HasPrefix(want, have) && (want[len(have)] == '.' || want[len(have)] == ':')
}

func covered(have []string, want string) bool {
	for _, h := range have {
		if scopeCovers(h, want) {
			return true
		}
	}
	return false
}

// tokenError writes the spec's Error object plus the standard OAuth2 error
// fields (RFC 6749 5.2: error, error_description), so OAuth2 libraries
// report the reason too.
func tokenError(w http.ResponseWriter, status int, code, title, description string, d ErrorDetail) {
	if status == http.StatusUnauthorized && code == "invalid_client" {
		w.Header().Set("WWW-Authenticate", `Basic realm="token"`)
	}
	writeJSON(w, status, struct {
		errorBody
		OAuthError       string `json:"error"`
		OAuthDescription string `json:"error_description"`
	}{
		errorBody:        errorBody{Type: "Error", Code: code, StatusCode: status, Title: title, Description: description, Details: []ErrorDetail{d}},
		OAuthError:       code,
		OAuthDescription: description,
	})
}

// handleToken implements POST /connect/token (spec 5.1): client credentials
// from the form body (client_secret_post) or HTTP basic auth
// (client_secret_basic).
func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/x-www-form-urlencoded" {
		tokenError(w, http.StatusBadRequest, "invalid_request", "Bad Request",
			"The token request must be a form (Content-Type: application/x-www-form-urlencoded).",
			detail("Content-Type", "got "+strconv.Quote(r.Header.Get("Content-Type"))))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		tokenError(w, http.StatusBadRequest, "invalid_request", "Bad Request", "Malformed form body.", detail("body", err.Error()))
		return
	}
	form := r.PostForm
	if gt := form.Get("grant_type"); gt != "client_credentials" {
		tokenError(w, http.StatusBadRequest, "unsupported_grant_type", "Bad Request",
			"Only grant_type client_credentials is supported.", detail("grant_type", "got "+strconv.Quote(gt)))
		return
	}
	id, secret := form.Get("client_id"), form.Get("client_secret")
	if u, p, ok := r.BasicAuth(); ok {
		// RFC 6749 2.3.1: both are form-urlencoded before basic encoding.
		if x, err := url.QueryUnescape(u); err == nil {
			u = x
		}
		if x, err := url.QueryUnescape(p); err == nil {
			p = x
		}
		id, secret = u, p
	}
	var client *Client
	for i := range s.cfg.Clients {
		c := &s.cfg.Clients[i]
		idOK := subtle.ConstantTimeCompare([]byte(c.ID), []byte(id)) == 1
		secOK := subtle.ConstantTimeCompare([]byte(c.Secret), []byte(secret)) == 1
		if idOK && secOK {
			client = c
		}
	}
	if client == nil {
		tokenError(w, http.StatusUnauthorized, "invalid_client", "Unauthorized",
			"Unknown client or wrong client secret.", detail("client_id", "client authentication failed"))
		return
	}
	var scopes []string
	raw := form.Get("scope")
	for _, sc := range strings.FieldsFunc(raw, func(r rune) bool { return r == ' ' || r == '+' }) {
		if !covered(client.Scopes, sc) {
			tokenError(w, http.StatusUnauthorized, "invalid_scope", "Unauthorized",
				"The client may not request scope "+strconv.Quote(sc)+".", detail("scope", "scope "+strconv.Quote(sc)+" is not granted to this client"))
			return
		}
		scopes = append(scopes, sc)
	}
	if len(scopes) == 0 {
		scopes = append(scopes, client.Scopes...)
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	now := s.now()
	s.mu.Lock()
	for k, t := range s.tokens { // forget long-expired tokens
		if now.Sub(t.expires) > time.Hour {
			delete(s.tokens, k)
		}
	}
	s.tokens[tok] = token{clientID: client.ID, scopes: scopes, expires: now.Add(s.cfg.TokenLifetime)}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": tok,
		"expires_in":   int64(math.Round(s.cfg.TokenLifetime.Seconds())),
		"token_type":   "Bearer",
		"scope":        strings.Join(scopes, " "),
	})
}

// RevokeTokens invalidates every issued token, so the next API request with
// one is answered 401 (to test a client's refresh-and-retry).
func (s *Server) RevokeTokens() {
	s.mu.Lock()
	s.tokens = map[string]token{}
	s.mu.Unlock()
}

// requireScope returns middleware that admits a request only with a valid,
// unexpired bearer token covering scope (401 Error object otherwise), and
// then applies the configured faults.
func (s *Server) requireScope(scope string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tok, ok := s.authorize(w, r, scope)
			if !ok {
				return
			}
			if s.cfg.RateLimits && s.rateLimited(w, r, tok.clientID) {
				return
			}
			if s.injectFault(w, r) {
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func (s *Server) authorize(w http.ResponseWriter, r *http.Request, scope string) (token, bool) {
	unauth := func(code, desc string) (token, bool) {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, code, "Unauthorized", desc, detail("Authorization", desc))
		return token{}, false
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return unauth("missing_token", "The Authorization header is missing.")
	}
	word, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(word, "bearer") || tok == "" || strings.ContainsAny(tok, " \t") {
		return unauth("malformed_token", "The Authorization header must be `Bearer <ACCESS_TOKEN>`.")
	}
	s.mu.Lock()
	t, found := s.tokens[strings.ToLower(tok)]
	s.mu.Unlock()
	if !found {
		return unauth("invalid_token", "The access token is invalid.")
	}
	if !s.now().Before(t.expires) {
		return unauth("expired_token", "Unauthenticated access: the access token has expired.")
	}
	if !covered(t.scopes, scope) {
		return unauth("insufficient_scope", "The access token's scope does not include "+scope+".")
	}
	return t, true
}

// rateLimit is one row of spec section 8.
type rateLimit struct {
	n      int
	window time.Duration
}

// rateLimits returns the limits of a request's service and method class.
func rateLimits(r *http.Request) (class string, limits []rateLimit) {
	seg, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch seg {
	case "cache":
		return seg, []rateLimit{{2000, 5 * time.Minute}}
	case "accounts", "config":
		if read {
			return seg + " GET", []rateLimit{{2000, 5 * time.Minute}}
		}
		return seg + " write", []rateLimit{{600, 5 * time.Minute}}
	case "waf", "bot-security", "api-security":
		return seg, []rateLimit{{300, time.Hour}, {1000, 24 * time.Hour}}
	}
	return "", nil
}

// rateLimited counts the request against its client's window and answers
// 429 with Retry-After when a limit is exceeded.
func (s *Server) rateLimited(w http.ResponseWriter, r *http.Request, clientID string) bool {
	class, limits := rateLimits(r)
	if len(limits) == 0 {
		return false
	}
	now := s.now()
	key := clientID + "\x00" + class
	longest := limits[len(limits)-1].window
	s.mu.Lock()
	if s.windows == nil {
		s.windows = map[string][]time.Time{}
	}
	times := s.windows[key]
	drop := 0
	for drop < len(times) && !times[drop].After(now.Add(-longest)) {
		drop++
	}
	times = times[drop:]
	var wait time.Duration
	for _, l := range limits {
		inWindow := 0
		first := -1
		for i, t := range times {
			if t.After(now.Add(-l.window)) {
				if first < 0 {
					first = i
				}
				inWindow++
			}
		}
		if inWindow >= l.n {
			// Free once the oldest request that keeps the count at n leaves.
			oldest := times[first+inWindow-l.n]
			if d := oldest.Add(l.window).Sub(now); d > wait {
				wait = d
			}
		}
	}
	if wait == 0 {
		times = append(times, now)
	}
	s.windows[key] = times
	s.mu.Unlock()
	if wait == 0 {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	writeError(w, http.StatusTooManyRequests, "rate_limited", "Too Many Requests",
		fmt.Sprintf("Rate limit of the %s service exceeded; retry after the Retry-After delay.", class))
	return true
}

// injectFault applies latency and at most one failure; it reports whether it
// answered the request.
func (s *Server) injectFault(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	f := s.faults
	status := 0
	if len(s.failNext) > 0 {
		status = s.failNext[0]
		s.failNext = s.failNext[1:]
	} else {
		x := s.rng.Float64()
		switch {
		case x < f.Rate429:
			status = http.StatusTooManyRequests
		case x < f.Rate429+f.Rate5xx:
			status = http.StatusInternalServerError
			if s.rng.IntN(2) == 0 {
				status = http.StatusServiceUnavailable
			}
		}
	}
	s.mu.Unlock()
	if f.Latency > 0 {
		t := time.NewTimer(f.Latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return true
		}
	}
	switch status {
	case 0:
		return false
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(f.RetryAfter.Seconds()))))
		writeError(w, status, "rate_limited", "Too Many Requests", "Rate limit exceeded; retry after the Retry-After delay.")
	default:
		writeError(w, status, "server_error", http.StatusText(status), "Simulated server failure.")
	}
	return true
}
