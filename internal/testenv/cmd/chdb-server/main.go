// Command chdb-server serves ClickHouse's HTTP interface in front of chDB,
// the ClickHouse engine as a library (libchdb.so from the npm registry's
// chdb package, loaded without cgo through chdb-go), so that tests can run
// the ClickHouse 26.x engine as a server: internal/testenv starts it
// (testenv.ChDB) on loopback ports, over HTTP and HTTPS, with a persistent
// data directory, and kills it like any server.
//
// It speaks as much of the HTTP interface as clickhouse-go v2's HTTP
// client and plain curl-style clients use:
//   - POST or GET to /, the query in the body or the "query" parameter
//     (for an INSERT the body is then its data, in the query's FORMAT,
//     optionally compressed: decompress=1 or Content-Encoding gzip);
//   - "database", "default_format", "client_protocol_version", "query_id",
//     "quota_key", "user", "password", and every other parameter as a
//     setting of the query;
//   - HTTP basic auth, X-ClickHouse-User / X-ClickHouse-Key, checked
//     against --user and $CHDB_SERVER_PASSWORD;
//   - Native output written for the client's protocol version (block info,
//     custom serialization flags), which chDB itself writes only for
//     version 0: the blocks are decoded and encoded again with
//     clickhouse-go's own codec;
//   - errors as a non-200 status, X-ClickHouse-Exception-Code and the
//     exception text ("Code: 60. DB::Exception: …");
//   - GET /ping answers "Ok.".
//
// chDB runs one query at a time in one session: requests are serialized.
// Compressed responses (compress=1), query parameters (param_*) and
// sessions (session_id) are refused with an error.
//
// The library comes from $CHDB_LIB_PATH, read when the program starts
// (chdb-go loads it in an init function and panics without it).
package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	chcompress "github.com/ClickHouse/ch-go/compress"
	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	chdb "github.com/chdb-io/chdb-go/chdb-purego"
)

func main() {
	path := flag.String("path", "", "data directory (created if missing)")
	httpAddr := flag.String("http", "127.0.0.1:8123", "HTTP listen address (empty: none)")
	httpsAddr := flag.String("https", "", "HTTPS listen address (empty: none; needs --cert and --key)")
	cert := flag.String("cert", "", "PEM certificate of the HTTPS listener")
	key := flag.String("key", "", "PEM key of the HTTPS listener")
	user := flag.String("user", "default", "the one user accepted; its password comes from $CHDB_SERVER_PASSWORD (none when unset)")
	config := flag.String("config", "", "a ClickHouse configuration file for the engine (e.g. remote_servers)")
	flag.Parse()
	if *path == "" {
		slog.Error("chdb-server: --path is required")
		os.Exit(2)
	}
	conn := *path
	if *config != "" {
		conn += "?config-file=" + *config
	}
	if err := run(*path, conn, *httpAddr, *httpsAddr, *cert, *key, *user, os.Getenv("CHDB_SERVER_PASSWORD")); err != nil {
		slog.Error("chdb-server", "err", err)
		os.Exit(1)
	}
}

func run(path, connString, httpAddr, httpsAddr, cert, key, user, password string) error {
	if err := os.MkdirAll(filepath.Join(path, "tmp"), 0o755); err != nil {
		return err
	}
	conn, err := chdb.NewConnectionFromConnString(connString)
	if err != nil {
		return fmt.Errorf("open chDB at %s: %w", path, err)
	}
	e := &engine{conn: conn, tmp: filepath.Join(path, "tmp")}
	if err := e.init(); err != nil {
		return err
	}
	srv := &server{engine: e, user: user, password: password}
	var servers []*http.Server
	errc := make(chan error, 2)
	listen := func(addr string, tls bool) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, hs)
		go func() {
			if tls {
				errc <- hs.ServeTLS(l, cert, key)
			} else {
				errc <- hs.Serve(l)
			}
		}()
		slog.Info("chdb-server: listening", "version", e.version, "addr", l.Addr().String(), "tls", tls)
		return nil
	}
	if httpAddr != "" {
		if err := listen(httpAddr, false); err != nil {
			return err
		}
	}
	if httpsAddr != "" {
		if err := listen(httpsAddr, true); err != nil {
			return err
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		slog.Info("chdb-server: shutting down", "signal", s.String())
	case err := <-errc:
		slog.Error("chdb-server: serve", "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, hs := range servers {
		_ = hs.Shutdown(ctx)
	}
	e.close()
	return nil
}

// engine is the chDB session; one query at a time.
type engine struct {
	mu      sync.Mutex
	conn    chdb.ChdbConn
	tmp     string
	seq     int
	version string
}

// init reads the version and sets the defaults a ClickHouse server has
// where chDB's differ.
func (e *engine) init() error {
	out, err := e.conn.Query("SELECT version()", "TabSeparated")
	if err != nil {
		return fmt.Errorf("chDB: %w", err)
	}
	e.version = strings.TrimSpace(out.String())
	out.Free()
	return nil
}

func (e *engine) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.conn.Close()
}

// request is one query as the HTTP interface received it.
type request struct {
	query    string
	data     []byte // an INSERT's data (nil: none)
	database string
	format   string // output format
	protocol uint64 // client_protocol_version
	settings [][2]string
	setNames []string
}

// exec runs r and returns its output in r.format.
func (e *engine) exec(r *request) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	db := r.database
	if db == "" {
		db = "default"
	}
	if _, err := e.query("USE "+quoteIdent(db), "TabSeparated"); err != nil {
		return nil, err
	}
	for _, s := range r.settings {
		if _, err := e.query("SET "+quoteIdent(s[0])+" = "+quoteString(s[1]), "TabSeparated"); err != nil {
			e.resetSettings(r.setNames)
			return nil, err
		}
		r.setNames = append(r.setNames, s[0])
	}
	defer e.resetSettings(r.setNames)
	q := r.query
	if r.data != nil {
		e.seq++
		file := filepath.Join(e.tmp, "insert-"+strconv.Itoa(e.seq)+".data")
		if err := os.WriteFile(file, r.data, 0o600); err != nil {
			return nil, errStd("write the INSERT's data: %v", err)
		}
		defer os.Remove(file)
		var err error
		if q, err = insertFromFile(q, file); err != nil {
			return nil, err
		}
	}
	return e.query(q, r.format)
}

func (e *engine) resetSettings(names []string) {
	for _, n := range names {
		if _, err := e.query("SET "+quoteIdent(n)+" = DEFAULT", "TabSeparated"); err != nil {
			slog.Warn("chdb-server: reset setting", "setting", n, "err", err)
		}
	}
}

func (e *engine) query(q, format string) ([]byte, error) {
	res, err := e.conn.Query(q, format)
	if err != nil {
		return nil, err
	}
	if res == nil {
		return nil, nil
	}
	defer res.Free()
	if err := res.Error(); err != nil {
		return nil, err
	}
	return bytes.Clone(res.Buf()), nil
}

// formatClause matches a trailing FORMAT clause of an INSERT.
var formatClause = regexp.MustCompile(`(?is)\s+FORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$`)

// settingsClause matches a trailing SETTINGS clause of an INSERT (without
// its FORMAT).
var settingsClause = regexp.MustCompile(`(?is)\s+SETTINGS\s+[^()]*$`)

// insertFromFile turns "INSERT INTO t (a, b) [SETTINGS …] FORMAT F" into
// "INSERT INTO t (a, b) FROM INFILE 'file' [SETTINGS …] FORMAT F": chDB
// takes the query as a C string, so binary data cannot follow it inline.
func insertFromFile(q, file string) (string, error) {
	m := formatClause.FindStringSubmatchIndex(q)
	if m == nil {
		return "", &serverError{code: 73, name: "UNKNOWN_FORMAT", msg: "an INSERT with data needs a FORMAT clause"}
	}
	format := q[m[2]:m[3]]
	stmt := q[:m[0]]
	settings := ""
	if s := settingsClause.FindStringIndex(stmt); s != nil {
		stmt, settings = stmt[:s[0]], stmt[s[0]:]
	}
	return stmt + " FROM INFILE " + quoteString(file) + settings + " FORMAT " + format, nil
}

// serverError is an exception of the server's own, in ClickHouse's form.
type serverError struct {
	code int
	name string
	msg  string
}

func (e *serverError) Error() string {
	return fmt.Sprintf("Code: %d. DB::Exception: chdb-server: %s. (%s)", e.code, e.msg, e.name)
}

// errStd is a serverError of code 1001 (STD_EXCEPTION).
func errStd(format string, args ...any) error {
	return &serverError{code: 1001, name: "STD_EXCEPTION", msg: fmt.Sprintf(format, args...)}
}

// server is the HTTP interface.
type server struct {
	engine         *engine
	user, password string
}

// parameters of the HTTP interface that are not settings.
var nonSettings = map[string]bool{
	"query": true, "database": true, "default_format": true, "client_protocol_version": true,
	"query_id": true, "quota_key": true, "user": true, "password": true, "decompress": true,
	"compress": false, "session_id": false, "session_timeout": false, "session_check": false,
	"buffer_size": true, "wait_end_of_query": true,
}

func (s *server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/ping" {
		_, _ = io.WriteString(w, "Ok.\n")
		return
	}
	if req.URL.Path != "/" {
		http.NotFound(w, req)
		return
	}
	if !s.authorized(req) {
		s.fail(w, &serverError{code: 516, name: "AUTHENTICATION_FAILED", msg: s.user + ": Authentication failed: password is incorrect, or there is no user with such name"})
		return
	}
	r, err := s.parse(req)
	if err != nil {
		s.fail(w, err)
		return
	}
	out, err := s.engine.exec(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	if r.format == "Native" && r.protocol > 0 && len(out) > 0 {
		if out, err = nativeForProtocol(out, r.protocol); err != nil {
			s.fail(w, errStd("re-encode Native output: %v", err))
			return
		}
	}
	w.Header().Set("X-ClickHouse-Server-Display-Name", "chdb-server")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
}

// authorized checks the request's credentials against the one user.
func (s *server) authorized(req *http.Request) bool {
	user, pass, ok := req.BasicAuth()
	if !ok {
		user, pass = req.Header.Get("X-ClickHouse-User"), req.Header.Get("X-ClickHouse-Key")
	}
	q := req.URL.Query()
	if user == "" {
		user, pass = q.Get("user"), q.Get("password")
	}
	if user == "" {
		user = "default"
	}
	return user == s.user && subtle.ConstantTimeCompare([]byte(pass), []byte(s.password)) == 1
}

// parse reads the query, its data and settings from the request.
func (s *server) parse(req *http.Request) (*request, error) {
	params := req.URL.Query()
	for k := range params {
		if known, listed := nonSettings[k]; listed && !known || strings.HasPrefix(k, "param_") {
			return nil, errStd("the parameter %s is not supported by this test server", k)
		}
	}
	body, err := readBody(req, params.Get("decompress") == "1")
	if err != nil {
		return nil, errStd("read the request body: %v", err)
	}
	r := &request{database: params.Get("database"), format: params.Get("default_format")}
	if r.format == "" {
		r.format = "TabSeparated"
	}
	if v := params.Get("client_protocol_version"); v != "" {
		if r.protocol, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, &serverError{code: 27, name: "CANNOT_PARSE_INPUT_ASSERTION_FAILED", msg: "client_protocol_version " + strconv.Quote(v)}
		}
	}
	switch q := params.Get("query"); {
	case q != "" && isInsert(q) && len(body) > 0:
		r.query, r.data = q, body
	case q != "":
		r.query = q + " " + string(body)
	default:
		r.query = string(body)
	}
	if strings.TrimSpace(r.query) == "" {
		return nil, &serverError{code: 62, name: "SYNTAX_ERROR", msg: "empty query"}
	}
	for k, vs := range params {
		if _, listed := nonSettings[k]; !listed {
			r.settings = append(r.settings, [2]string{k, vs[len(vs)-1]})
		}
	}
	return r, nil
}

func readBody(req *http.Request, decompress bool) ([]byte, error) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			return nil, err
		}
		body = zr
	} else if enc := req.Header.Get("Content-Encoding"); enc != "" {
		return nil, fmt.Errorf("Content-Encoding %s not supported", enc)
	}
	if decompress {
		body = chcompress.NewReader(body)
	}
	return io.ReadAll(body)
}

var insertRe = regexp.MustCompile(`(?is)^\s*INSERT\s`)

func isInsert(q string) bool { return insertRe.MatchString(q) }

// codeRe finds the exception code in chDB's error text.
var codeRe = regexp.MustCompile(`Code:\s*(\d+)\.`)

// fail answers with ClickHouse's error form.
func (s *server) fail(w http.ResponseWriter, err error) {
	msg := err.Error()
	code := "1001"
	if m := codeRe.FindStringSubmatch(msg); m != nil {
		code = m[1]
	} else {
		msg = "Code: 1001. DB::Exception: " + msg + ". (STD_EXCEPTION)"
	}
	status := http.StatusInternalServerError
	switch code {
	case "62":
		status = http.StatusBadRequest
	case "60", "81":
		status = http.StatusNotFound
	case "516", "192", "193", "194":
		status = http.StatusUnauthorized
	}
	w.Header().Set("X-ClickHouse-Exception-Code", code)
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+" (version "+s.engine.version+")\n")
}

// nativeForProtocol re-encodes chDB's Native output (written for protocol
// version 0: no block info, no serialization flags) for a client of
// protocol version revision, as a server does over HTTP when the client
// sends client_protocol_version.
func nativeForProtocol(out []byte, revision uint64) ([]byte, error) {
	reader := chproto.NewReader(bufio.NewReader(bytes.NewReader(out)))
	var buf chproto.Buffer
	for {
		block := proto.Block{ServerContext: &column.ServerContext{Revision: revision, Timezone: time.UTC}}
		if err := block.Decode(reader, 0); err != nil {
			if errors.Is(err, io.EOF) {
				return buf.Buf, nil
			}
			return nil, err
		}
		if err := block.Encode(&buf, revision); err != nil {
			return nil, err
		}
	}
}

func quoteIdent(s string) string {
	return "`" + strings.NewReplacer("\\", "\\\\", "`", "\\`").Replace(s) + "`"
}

func quoteString(s string) string {
	return "'" + strings.NewReplacer("\\", "\\\\", "'", "\\'").Replace(s) + "'"
}
