package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	ch "github.com/ClickHouse/clickhouse-go/v2"
)

// HasHTTPClient reports whether clickhouse-go's HTTP client can talk to
// the server's HTTP interface: it sends the client_protocol_version
// parameter (ClickHouse 23.3 on, PR #46360; older servers refuse it as an
// unknown setting, code 115) and asks for displayName().
func (v Version) HasHTTPClient() bool { return v.AtLeast(23, 3) }

// UnsupportedServerError says that a ClickHouse server answered but cannot
// serve edgepipe over its DSN's protocol: its HTTP interface is older than
// clickhouse-go's HTTP client (HasHTTPClient). Retrying does not help; a
// native DSN does.
type UnsupportedServerError struct {
	// Addr is the server's address, Version what it said it is.
	Addr    string
	Version Version
	// Err is the client's error.
	Err error
}

// Error implements error.
func (e *UnsupportedServerError) Error() string {
	return fmt.Sprintf("ClickHouse %s at %s cannot be used over HTTP: its HTTP interface predates the one clickhouse-go speaks (ClickHouse 23.3 on): %v; use its native protocol instead (clickhouse://HOST:9000/DB)",
		e.Version, e.Addr, e.Err)
}

// Unwrap returns the client's error.
func (e *UnsupportedServerError) Unwrap() error { return e.Err }

// httpUnsupported returns err, or an *UnsupportedServerError wrapping it
// when the server behind opts answers a plain HTTP request for its version
// with one that clickhouse-go's HTTP client cannot talk to.
func httpUnsupported(ctx context.Context, opts *ch.Options, addr string, err error) error {
	v, perr := httpVersion(ctx, opts)
	if perr != nil || v.HasHTTPClient() {
		return err
	}
	return &UnsupportedServerError{Addr: addr, Version: v, Err: err}
}

// httpVersion asks the server for its version over HTTP the way every
// ClickHouse version answers: the query in the body, TabSeparated output,
// no parameter beyond the database.
func httpVersion(ctx context.Context, opts *ch.Options) (Version, error) {
	scheme := "http"
	client := &http.Client{}
	if opts.TLS != nil {
		scheme = "https"
		client.Transport = &http.Transport{TLSClientConfig: opts.TLS.Clone()}
	}
	u := url.URL{Scheme: scheme, Host: opts.Addr[0], Path: "/" + strings.TrimPrefix(opts.HttpUrlPath, "/")}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader("SELECT version()"))
	if err != nil {
		return Version{}, err
	}
	if opts.Auth.Username != "" {
		req.SetBasicAuth(opts.Auth.Username, opts.Auth.Password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Version{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return Version{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Version{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return ParseVersion(string(body))
}

// CheckDSN checks, without connecting, what Open would refuse in a DSN and
// its options: a DSN that does not parse, a cluster over HTTP, TLS options
// for a DSN without TLS, a CA file that cannot be read.
func CheckDSN(dsn, cluster string, tls TLSOptions) error {
	opts, err := ParseDSN(dsn)
	if err != nil {
		return err
	}
	switch scheme, _, _ := strings.Cut(dsn, "://"); scheme {
	case "clickhouse", "tcp", "http", "https":
	default:
		return fmt.Errorf("ClickHouse DSN %s: want clickhouse://HOST:9000/DB (native protocol), http://HOST:8123/DB or https://HOST:8443/DB?secure=true", RedactDSN(dsn))
	}
	if opts.Protocol == ch.HTTP && cluster != "" {
		return fmt.Errorf("ClickHouse DSN %s: a cluster needs the native protocol (clickhouse://HOST:9000/DB): the schema is checked on every node through the native port system.clusters lists", RedactDSN(dsn))
	}
	if err := tls.apply(opts); err != nil {
		return fmt.Errorf("ClickHouse DSN %s: %w", RedactDSN(dsn), err)
	}
	return nil
}

// Preflight connects once, at a program's start, to find a server that
// answers but can never be used (an *UnsupportedServerError: an HTTP DSN to
// a server older than 23.3), so that the program stops at once with the
// reason instead of retrying forever. A server out of reach is not an
// error here: writers wait for it.
func Preflight(ctx context.Context, dsn string, opts ...Option) error {
	db, err := Open(ctx, dsn, opts...)
	if err == nil {
		return db.Close()
	}
	var unsupported *UnsupportedServerError
	if errors.As(err, &unsupported) {
		return err
	}
	return nil
}
