package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// maxEarlyRefresh caps how long before its expiry a token is replaced.
const maxEarlyRefresh = time.Minute

// earlyRefresh is how long before expiry a token of the given lifetime is
// replaced: a fifth of the lifetime, at most a minute. A fixed margin would not
// do: with the oauth2 package's default of 10 s, every token that lives 5 s
// would count as expired on arrival.
func earlyRefresh(lifetime time.Duration) time.Duration {
	return min(lifetime/5, maxEarlyRefresh)
}

// tokenSource hands out one scope's access token, fetching it with the
// client-credentials grant and reusing it until shortly before it expires.
// Concurrent callers share one fetch. It is safe for concurrent use.
type tokenSource struct {
	scope   string
	cc      *clientcredentials.Config
	hc      *http.Client
	timeout time.Duration
	observe func(status int, took time.Duration)

	fetching chan struct{} // one slot: held while a token is being fetched

	mu        sync.Mutex
	tok       *oauth2.Token
	refreshAt time.Time
}

func newTokenSource(cfg *Config, hc *http.Client, scope string, observe func(int, time.Duration)) *tokenSource {
	var scopes []string
	if scope != "" {
		scopes = []string{scope}
	}
	return &tokenSource{
		scope: scope,
		cc: &clientcredentials.Config{
			ClientID:     cfg.ClientID,
			ClientSecret: cfg.ClientSecret,
			TokenURL:     TokenURL(cfg.AuthURL),
			Scopes:       scopes,
			AuthStyle:    oauth2.AuthStyleInParams,
		},
		hc:       hc,
		timeout:  cfg.Timeout,
		observe:  observe,
		fetching: make(chan struct{}, 1),
	}
}

// current returns the cached token when it is still fresh.
func (ts *tokenSource) current(now time.Time) *oauth2.Token {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.tok != nil && now.Before(ts.refreshAt) {
		return ts.tok
	}
	return nil
}

// Token returns a fresh access token, fetching one when needed.
func (ts *tokenSource) Token(ctx context.Context) (*oauth2.Token, error) {
	if t := ts.current(time.Now()); t != nil {
		return t, nil
	}
	select {
	case ts.fetching <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-ts.fetching }()
	// Another caller may have fetched while we waited.
	if t := ts.current(time.Now()); t != nil {
		return t, nil
	}
	start := time.Now()
	fctx, cancel := context.WithTimeout(context.WithValue(ctx, oauth2.HTTPClient, ts.hc), ts.timeout)
	defer cancel()
	t, err := ts.cc.Token(fctx)
	took := time.Since(start)
	if err != nil {
		err = tokenError(err)
		ts.observe(StatusCode(err), took)
		return nil, fmt.Errorf("fetch access token (scope %q): %w", ts.scope, err)
	}
	ts.observe(http.StatusOK, took)
	if t.AccessToken == "" {
		return nil, fmt.Errorf("fetch access token (scope %q): empty access_token in response", ts.scope)
	}
	refreshAt := time.Now().Add(100 * 365 * 24 * time.Hour) // no expiry given: keep until a 401
	if !t.Expiry.IsZero() {
		// Measure the lifetime from the moment we asked, which is earlier
		// than the server's issue time: the margin errs on the safe side.
		lifetime := t.Expiry.Sub(start)
		refreshAt = t.Expiry.Add(-earlyRefresh(lifetime))
	}
	ts.mu.Lock()
	ts.tok, ts.refreshAt = t, refreshAt
	ts.mu.Unlock()
	return t, nil
}

// Invalidate drops tok if it is still the cached token, so that the next
// Token call fetches a new one. Called after the API refused tok with 401.
func (ts *tokenSource) Invalidate(tok *oauth2.Token) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.tok == tok {
		ts.tok = nil
	}
}

// tokenError turns the oauth2 package's error into an *Error where the token
// endpoint answered, keeping network errors recognisable.
func tokenError(err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.Response != nil {
		return newError(re.Response.StatusCode, re.Response.Header, re.Body)
	}
	// Anything else (connection refused, attempt timeout, malformed JSON
	// from a proxy): the oauth2 package does not tell them apart; treat as
	// transient. The caller checks its own context before retrying.
	return &networkError{err: err}
}
