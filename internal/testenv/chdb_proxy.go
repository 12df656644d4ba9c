package testenv

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// LosingProxy stands between a client and a ChDBServer's HTTP interface
// and loses the server's answer to the first INSERT into each table: the
// server stores the rows, the client gets 502 Bad Gateway, as after a
// timeout or a connection cut once the server had the rows. A writer that
// retries then sends rows the server already holds. The proxy records the
// insert_deduplication_token of every INSERT it forwards.
type LosingProxy struct {
	srv *httptest.Server

	mu     sync.Mutex
	lost   map[string]bool
	tokens map[string][]string // by table, in order
}

// LosingProxy starts a LosingProxy in front of s for the test.
func (s *ChDBServer) LosingProxy(t testing.TB) *LosingProxy {
	t.Helper()
	p := &LosingProxy{lost: map[string]bool{}, tokens: map[string][]string{}}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: s.HTTPAddr()})
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		table, ok := insertTable(q.Get("query"))
		if !ok {
			rp.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		p.tokens[table] = append(p.tokens[table], q.Get("insert_deduplication_token"))
		lose := !p.lost[table]
		p.mu.Unlock()
		if !lose {
			rp.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK { // not stored: the client gets the real answer
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		p.mu.Lock()
		p.lost[table] = true
		p.mu.Unlock()
		http.Error(w, "testenv: the proxy lost the server's answer", http.StatusBadGateway)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// DSN returns an http:// DSN for database through the proxy.
func (p *LosingProxy) DSN(database string) string { return p.srv.URL + "/" + database }

// Lost reports whether the proxy lost the answer to an INSERT into table
// (the server stored its rows).
func (p *LosingProxy) Lost(table string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost[table]
}

// Tokens returns the insert_deduplication_token of every INSERT into table
// forwarded so far, in order ("" for an INSERT without one).
func (p *LosingProxy) Tokens(table string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tokens[table]...)
}

// insertTable returns the table of "INSERT INTO [`db`.]`table` …".
func insertTable(query string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(query), "INSERT INTO ")
	if !ok {
		return "", false
	}
	name, _, _ := strings.Cut(rest, " ")
	if i := strings.LastIndex(name, "."); i >= 0 {
		name = name[i+1:]
	}
	return strings.Trim(name, "`"), true
}
