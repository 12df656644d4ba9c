// Package platform is the foundation of edgepipe's platform API client: OAuth2
// client credentials per service scope, retries with exponential backoff and
// jitter, client-side rate limits per service and method class, the API's
// Error object as a typed error, the accounts service and the config
// service's TLS certificates. Packages for the other services
// (internal/metricsapi, internal/rtld) build on Service.Do.
package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"golang.org/x/oauth2"
)

// Names, versions and scopes of the services edgepipe consumes.
const (
	ServiceAccounts = "accounts"
	ServiceMetrics  = "metrics"
	ServiceRTLD     = "rtld"

	VersionAccounts = "v0.1"
	VersionMetrics  = "v1"
	VersionRTLD     = "v1"

	ScopeAccounts = "app.accounts"
	ScopeMetrics  = "app.metrics"
	ScopeRTLD     = "app.rtld"
)

// serviceAuth names token requests in Observer calls.
const serviceAuth = "auth"

// Defaults of Config.
const (
	DefaultTimeout          = 30 * time.Second
	DefaultMaxAttempts      = 5
	DefaultMaxElapsed       = 2 * time.Minute
	DefaultInitialInterval  = 500 * time.Millisecond
	DefaultMaxInterval      = 30 * time.Second
	DefaultMaxResponseBytes = 256 << 20
)

// maxErrorResponseBytes bounds how much of an error response is read.
const maxErrorResponseBytes = 64 << 10

// Observer receives one call per HTTP exchange with the platform, for
// self-metrics. status is the HTTP status, or 0 when no complete answer
// arrived (network error, timeout). Token requests are reported with service
// "auth" and method POST. Implementations must be safe for concurrent use and
// must not block.
type Observer interface {
	ObserveRequest(service, method string, status int, took time.Duration)
}

// DateObserver is told when the platform processed each API request: the
// Date header of every answer from an API service (spec section 1: "Date and
// time (UTC) at which the request was processed"), together with how long
// the exchange took, so the platform's clock can be followed (see
// schedule.PlatformClock). Answers of the token endpoint, which may be
// another host, are not reported. Implementations must be safe for
// concurrent use and must not block.
type DateObserver interface {
	ObserveDate(date time.Time, roundTrip time.Duration)
}

// Config configures a Client. BaseURL, AuthURL, ClientID and ClientSecret are
// required; everything else has a default.
type Config struct {
	// BaseURL is the API's base_url; service paths are
	// <BaseURL>/<service>/<version>/….
	BaseURL string
	// AuthURL is the auth_url; tokens come from <AuthURL>/connect/token (a
	// URL that already ends in /connect/token is used as is).
	AuthURL string
	// ClientID and ClientSecret are the API client's credentials. The secret
	// is never logged or printed.
	ClientID     string
	ClientSecret string
	// HTTPClient sends every request (default: a client with its own clone of
	// http.DefaultTransport). Its Timeout should be zero: Timeout below bounds
	// each attempt.
	HTTPClient *http.Client
	// Timeout bounds each attempt, the token request and the reading of the
	// response body included (default 30s).
	Timeout time.Duration
	// Retry bounds retries of failed requests.
	Retry RetryConfig
	// RateLimits overrides DefaultRateLimits per service name; a zero
	// RateLimit inside keeps that class's default.
	RateLimits map[string]Limits
	// MaxResponseBytes bounds a successful response body (default 256 MiB).
	MaxResponseBytes int64
	// Logger receives debug lines per request and warnings per retry
	// (default: discard).
	Logger *slog.Logger
	// Observer, when set, is told about every request.
	Observer Observer
	// DateObserver, when set, is told the Date header of every API answer
	// that carries a valid one.
	DateObserver DateObserver
	// Version is edgepipe's version, sent as User-Agent edgepipe/<Version>
	// (default "dev").
	Version string
}

// RetryConfig bounds the retries of one call. Requests answered with 429 or a
// server error (other than 501 and 505) and requests that got no answer are
// retried with exponential backoff and jitter, waiting at least what a
// Retry-After header asks; other answers are final.
type RetryConfig struct {
	// MaxAttempts is the number of attempts in all, the first included
	// (default 5; 1 disables retries). The single re-authentication after a
	// 401 does not count.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt until the last retry
	// starts (default 2m). A Retry-After beyond it ends the call at once.
	MaxElapsed time.Duration
	// InitialInterval is the first backoff (default 500ms); each further one
	// doubles, randomised by ±50%, up to MaxInterval (default 30s).
	InitialInterval time.Duration
	MaxInterval     time.Duration
}

// String renders the configuration without the client secret.
func (c Config) String() string {
	return fmt.Sprintf("platform.Config{BaseURL:%q AuthURL:%q ClientID:%q ClientSecret:%s Timeout:%s}",
		c.BaseURL, c.AuthURL, c.ClientID, redacted(c.ClientSecret), c.Timeout)
}

// GoString is String, so that %#v does not print the secret either.
func (c Config) GoString() string { return c.String() }

// LogValue renders the configuration for log/slog without the client secret.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.String("auth_url", c.AuthURL),
		slog.String("client_id", c.ClientID),
		slog.String("client_secret", redacted(c.ClientSecret)),
	)
}

func redacted(s string) string {
	if s == "" {
		return "unset"
	}
	return "[redacted]"
}

// Client talks to the platform API. It is safe for concurrent use; create one
// per process and share it.
type Client struct {
	cfg       Config
	hc        *http.Client
	tokenHC   *http.Client
	userAgent string
	log       *slog.Logger

	mu       sync.Mutex
	tokens   map[string]*tokenSource // by scope
	limiters map[string]limiterPair  // by service name
	services map[string]*Service     // by name, version, scope
}

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Retry.MaxAttempts == 0 {
		c.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if c.Retry.MaxElapsed == 0 {
		c.Retry.MaxElapsed = DefaultMaxElapsed
	}
	if c.Retry.InitialInterval == 0 {
		c.Retry.InitialInterval = DefaultInitialInterval
	}
	if c.Retry.MaxInterval == 0 {
		c.Retry.MaxInterval = DefaultMaxInterval
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	errs = append(errs, checkURL("base URL", c.BaseURL), checkURL("auth URL", c.AuthURL))
	if c.ClientID == "" || c.ClientSecret == "" {
		errs = append(errs, errors.New("client ID and client secret are required"))
	}
	if c.Timeout < 0 || c.Retry.MaxAttempts < 0 || c.Retry.MaxElapsed < 0 ||
		c.Retry.InitialInterval < 0 || c.Retry.MaxInterval < 0 || c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("negative timeout, retry or size setting"))
	}
	for _, name := range slices.Sorted(maps.Keys(c.RateLimits)) {
		l := c.RateLimits[name]
		if err := l.Read.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s read %w", name, err))
		}
		if err := l.Write.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s write %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// New validates cfg, fills in defaults and returns a Client. It does not
// contact the platform; the first call fetches the first token.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("platform: invalid configuration: %w", err)
	}
	cfg.BaseURL, cfg.AuthURL = trimURL(cfg.BaseURL), trimURL(cfg.AuthURL)
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ua := "edgepipe/" + cfg.Version
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	tokenHC := *hc
	tokenHC.Transport = userAgentTransport{base: base, userAgent: ua}
	return &Client{
		cfg:       cfg,
		hc:        hc,
		tokenHC:   &tokenHC,
		userAgent: ua,
		log:       log,
		tokens:    map[string]*tokenSource{},
		limiters:  map[string]limiterPair{},
		services:  map[string]*Service{},
	}, nil
}

// trimURL is a base URL as the client uses it: without surrounding space
// and trailing slashes.
func trimURL(raw string) string { return strings.TrimRight(strings.TrimSpace(raw), "/") }

// checkURL refuses a base URL the client cannot use.
func checkURL(what, raw string) error {
	raw = trimURL(raw)
	if raw == "" {
		return fmt.Errorf("%s is required", what)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s %q: want http(s)://host[/path]", what, raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s %q: must not carry a query or fragment", what, raw)
	}
	return nil
}

// TokenURL is where a client of the auth_url authURL gets its tokens:
// <authURL>/connect/token (an authURL that already ends so is used as is).
func TokenURL(authURL string) string {
	authURL = trimURL(authURL)
	if strings.HasSuffix(authURL, "/connect/token") {
		return authURL
	}
	return authURL + "/connect/token"
}

// userAgentTransport sets User-Agent on requests the oauth2 package sends.
type userAgentTransport struct {
	base      http.RoundTripper
	userAgent string
}

func (t userAgentTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", t.userAgent)
	return t.base.RoundTrip(r)
}

// CloseIdleConnections closes the keep-alive connections of the client's
// HTTP transport; call it when done with the Client.
func (c *Client) CloseIdleConnections() {
	c.hc.CloseIdleConnections()
}

// Metrics is the metrics service (/metrics/v1, scope app.metrics).
func (c *Client) Metrics() *Service {
	return c.Service(ServiceMetrics, VersionMetrics, ScopeMetrics)
}

// RTLD is the real-time log delivery service (/rtld/v1, scope app.rtld).
func (c *Client) RTLD() *Service {
	return c.Service(ServiceRTLD, VersionRTLD, ScopeRTLD)
}

// Accounts is the accounts service (/accounts/v0.1, scope app.accounts).
func (c *Client) Accounts() *Accounts {
	return &Accounts{Service: c.Service(ServiceAccounts, VersionAccounts, ScopeAccounts)}
}

// Service returns the service at <BaseURL>/<name>/<version>, authorised with
// tokens of scope. Services of one scope share their tokens, services of one
// name share their rate limits (Config.RateLimits[name]).
func (c *Client) Service(name, version, scope string) *Service {
	key := name + "\x00" + version + "\x00" + scope
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.services[key]; ok {
		return s
	}
	ts := c.tokenSourceLocked(scope)
	lp, ok := c.limiters[name]
	if !ok {
		l := limitsFor(name, c.cfg.RateLimits)
		lp = limiterPair{read: l.Read.limiter(), write: l.Write.limiter()}
		c.limiters[name] = lp
	}
	s := &Service{
		c:       c,
		name:    name,
		base:    c.cfg.BaseURL + "/" + strings.Trim(name, "/") + "/" + strings.Trim(version, "/"),
		tokens:  ts,
		limiter: lp,
	}
	c.services[key] = s
	return s
}

// tokenSourceLocked returns the token source of scope, making it on first
// use; c.mu is held.
func (c *Client) tokenSourceLocked(scope string) *tokenSource {
	ts, ok := c.tokens[scope]
	if !ok {
		ts = newTokenSource(&c.cfg, c.tokenHC, scope, func(status int, took time.Duration) {
			c.observe(serviceAuth, http.MethodPost, status, took)
			c.log.Debug("platform token request", "scope", scope, "status", status, "took", took)
		})
		c.tokens[scope] = ts
	}
	return ts
}

// Token fetches an access token for scope, or reuses the one the client
// holds, and returns the scope the token endpoint says it granted (its
// "scope" field; "" when it sent none). An error wraps the token
// endpoint's *Error when it answered: IsRefused tells a refusal, and its
// Code whether the client ("invalid_client") or the scope
// ("invalid_scope") was refused.
func (c *Client) Token(ctx context.Context, scope string) (granted string, err error) {
	c.mu.Lock()
	ts := c.tokenSourceLocked(scope)
	c.mu.Unlock()
	tok, err := ts.Token(ctx)
	if err != nil {
		return "", err
	}
	if s, ok := tok.Extra("scope").(string); ok {
		granted = s
	}
	return granted, nil
}

func (c *Client) observe(service, method string, status int, took time.Duration) {
	if c.cfg.Observer != nil {
		c.cfg.Observer.ObserveRequest(service, method, status, took)
	}
}

// Service is one API service (such as /metrics/v1) with its token scope and
// rate limits. It is safe for concurrent use.
type Service struct {
	c       *Client
	name    string
	base    string
	tokens  *tokenSource
	limiter limiterPair
}

// Name is the service's path segment ("metrics").
func (s *Service) Name() string { return s.name }

// URL is the service's base URL, <BaseURL>/<service>/<version>.
func (s *Service) URL() string { return s.base }

// Do sends one API call and decodes the JSON answer into out. path is
// relative to the service ("/datasets"); query may be nil; in, when not nil,
// is sent as the JSON body; out, when not nil, receives the decoded body of a
// 2xx answer. The call waits for the service's rate limit, authenticates
// (fetching or refreshing the token as needed, and once more after a 401),
// bounds each attempt by Config.Timeout and retries per Config.Retry. An
// answer other than 2xx yields an error wrapping *Error. ctx cancels
// everything, waits included.
//
// Writes are retried like reads: a POST whose answer was lost may have taken
// effect, so callers of non-idempotent writes must tolerate a repeat (for
// example, look an object up by its unique name after a conflict).
func (s *Service) Do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	if !strings.HasPrefix(path, "/") && path != "" {
		path = "/" + path
	}
	fail := func(err error) error {
		return fmt.Errorf("%s %s %s: %w", s.name, method, path, err)
	}
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fail(fmt.Errorf("encode request body: %w", err))
		}
		body = b
	}
	u := s.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	cfg := s.c.cfg.Retry
	eb := backoff.NewExponentialBackOff()
	eb.InitialInterval = cfg.InitialInterval
	eb.MaxInterval = cfg.MaxInterval
	eb.Multiplier = 2
	eb.RandomizationFactor = 0.5

	limiter := s.limiter.forMethod(method)
	var (
		attempts int
		last     error
		reauthed bool
	)
	op := func() (struct{}, error) {
		attempts++
		if err := limiter.Wait(ctx); err != nil {
			if cerr := context.Cause(ctx); cerr != nil {
				err = cerr
			}
			return struct{}{}, backoff.Permanent(fmt.Errorf("client-side rate limit: %w", err))
		}
		err := s.attempt(ctx, method, path, u, body, out, &reauthed)
		last = err
		return struct{}{}, s.classify(ctx, err)
	}
	notify := func(err error, wait time.Duration) {
		s.c.log.Warn("platform request failed, retrying",
			"service", s.name, "method", method, "path", path,
			"attempt", attempts, "wait", wait, "err", err)
	}
	_, err := backoff.Retry(ctx, op,
		backoff.WithBackOff(eb),
		backoff.WithMaxTries(uint(cfg.MaxAttempts)),
		backoff.WithMaxElapsedTime(cfg.MaxElapsed),
		backoff.WithNotify(notify))
	if err == nil {
		return nil
	}
	var ra *retryAfterError
	if errors.As(err, &ra) {
		err = ra.err
	}
	if last != nil && !errors.Is(err, last) {
		// The context ended while waiting to retry: keep the reason for
		// the retries too.
		return fail(fmt.Errorf("%w (after %d attempts; last error: %w)", err, attempts, last))
	}
	if attempts > 1 {
		return fail(fmt.Errorf("%w (after %d attempts)", err, attempts))
	}
	return fail(err)
}

// classify tells backoff.Retry what to do after err.
func (s *Service) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := context.Cause(ctx); cerr != nil {
		return backoff.Permanent(err)
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		if !apiErr.Temporary() {
			return backoff.Permanent(err)
		}
		if apiErr.RetryAfter > 0 {
			// Honour the server's wait, plus up to 10% jitter so that
			// clients told the same moment do not return in lockstep.
			wait := apiErr.RetryAfter + time.Duration(rand.Int64N(int64(apiErr.RetryAfter/10)+1))
			return &retryAfterError{err: err, wait: wait}
		}
		return err
	}
	var netErr *networkError
	if errors.As(err, &netErr) {
		return err
	}
	return backoff.Permanent(err)
}

// retryAfterError carries an API error together with the wait its
// Retry-After asked for, in the form backoff.Retry understands.
type retryAfterError struct {
	err  error
	wait time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// As lets backoff.Retry find a *backoff.RetryAfterError in the chain.
func (e *retryAfterError) As(target any) bool {
	if t, ok := target.(**backoff.RetryAfterError); ok {
		*t = &backoff.RetryAfterError{Duration: e.wait}
		return true
	}
	return false
}

// attempt makes one attempt: token, request, and after a first 401 of the
// call one more request with a new token.
func (s *Service) attempt(ctx context.Context, method, path, u string, body []byte, out any, reauthed *bool) error {
	for {
		tok, err := s.tokens.Token(ctx)
		if err != nil {
			return err
		}
		status, header, data, err := s.send(ctx, method, path, u, tok, body)
		if err != nil {
			return err
		}
		if status == http.StatusUnauthorized && !*reauthed {
			*reauthed = true
			s.tokens.Invalidate(tok)
			s.c.log.Debug("platform token refused, fetching a new one", "service", s.name, "path", path)
			continue
		}
		if status < 200 || status > 299 {
			return newError(status, header, data)
		}
		if out == nil || len(bytes.TrimSpace(data)) == 0 {
			return nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode response (%d bytes): %w", len(data), err)
		}
		return nil
	}
}

// send performs one HTTP exchange and reads the whole body within limits.
func (s *Service) send(ctx context.Context, method, path, u string, tok *oauth2.Token, body []byte) (int, http.Header, []byte, error) {
	actx, cancel := context.WithTimeout(ctx, s.c.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, method, u, rd)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", s.c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := s.c.hc.Do(req)
	if err != nil {
		took := time.Since(start)
		s.c.observe(s.name, method, 0, took)
		s.c.log.Debug("platform request", "service", s.name, "method", method, "path", path, "err", err, "took", took)
		if cerr := context.Cause(ctx); cerr != nil {
			return 0, nil, nil, cerr
		}
		return 0, nil, nil, &networkError{err: err}
	}
	defer resp.Body.Close()
	limit := s.c.cfg.MaxResponseBytes
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		limit = maxErrorResponseBytes
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	took := time.Since(start)
	if err != nil {
		s.c.observe(s.name, method, 0, took)
		if cerr := context.Cause(ctx); cerr != nil {
			return 0, nil, nil, cerr
		}
		return 0, nil, nil, &networkError{err: fmt.Errorf("read response: %w", err)}
	}
	s.c.observe(s.name, method, resp.StatusCode, took)
	if s.c.cfg.DateObserver != nil {
		if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			s.c.cfg.DateObserver.ObserveDate(d, took)
		}
	}
	s.c.log.Debug("platform request", "service", s.name, "method", method, "path", path,
		"status", resp.StatusCode, "bytes", len(data), "took", took)
	if int64(len(data)) > limit {
		if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
			return 0, nil, nil, fmt.Errorf("response larger than %d bytes", limit)
		}
		data = data[:limit] // an error body: its start is enough
	}
	return resp.StatusCode, resp.Header, data, nil
}
