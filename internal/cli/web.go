package cli

import (
	"context"
	"errors"
	"fmt"
	"log" //nolint:depguard // http.Server.ErrorLog takes a *log.Logger: serverLogWriter passes its lines on to slog
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
)

// Web is a program's HTTP listener: exporter-toolkit's flags
// --web.listen-address (repeatable), --web.config.file (TLS and basic
// auth) and --web.systemd-socket.
type Web struct {
	// Flags are the parsed flags.
	Flags *web.FlagConfig
	// describeMetrics is the hidden --web.describe-metrics (describe.go).
	describeMetrics string
}

// AddWebFlags adds the --web.* flags to fg, listening on defaultAddress
// unless told otherwise, and the hidden --web.describe-metrics.
func AddWebFlags(fg FlagGroup, defaultAddress string) *Web {
	w := &Web{Flags: kingpinflag.AddFlags(fg, defaultAddress)}
	fg.Flag("web.describe-metrics", "Once started, write every metric family /metrics can serve (name, type, help, labels) "+
		"to this file as JSON and exit instead of serving, for docs/reference (make docs).").
		Hidden().PlaceHolder("FILE").StringVar(&w.describeMetrics)
	return w
}

// Site is what a program serves on its listener.
type Site struct {
	// Landing describes the program on the landing page at GET /: Name,
	// Description and Links (the version is filled in).
	Landing web.LandingConfig
	// Metrics serves /metrics (see MetricsHandler).
	Metrics http.Handler
	// Registry is the registry Metrics serves, which the hidden
	// --web.describe-metrics describes.
	Registry *prometheus.Registry
	// Handler serves every other path (nil: 404).
	Handler http.Handler
	// Server holds the timeouts and limits of the http.Server (its Handler
	// and ErrorLog are set by NewServer); nil: a 10 s ReadHeaderTimeout.
	Server *http.Server
	// Listener, when set, is served instead of the listeners of the
	// --web.* flags (tests listen on 127.0.0.1:0 themselves).
	Listener net.Listener
}

// Server serves a Site through exporter-toolkit.
type Server struct {
	srv      *http.Server
	flags    *web.FlagConfig
	listener net.Listener
	log      *slog.Logger
}

// NewServer prepares the server of site; Run serves it. With
// --web.describe-metrics it writes the description of site.Registry instead
// and returns ErrPrinted: the program has started up, and stops there.
func (w *Web) NewServer(site Site, logger *slog.Logger) (*Server, error) {
	if w.describeMetrics != "" {
		if err := writeMetricsJSON(w.describeMetrics, site.Registry); err != nil {
			return nil, err
		}
		return nil, ErrPrinted
	}
	lc := site.Landing
	lc.Version = version.Version
	lc.Profiling = "false" // no /debug/pprof here
	landing, err := web.NewLandingPage(lc)
	if err != nil {
		return nil, fmt.Errorf("landing page: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	if site.Server != nil {
		srv = site.Server
	}
	srv.Handler = &router{metrics: site.Metrics, landing: landing, next: site.Handler}
	srv.ErrorLog = ServerErrorLog(logger)
	return &Server{srv: srv, flags: w.Flags, listener: site.Listener, log: logger}, nil
}

// Run serves until Shutdown, then returns nil; any other end is an error.
func (s *Server) Run() error {
	var err error
	if s.listener != nil {
		err = web.Serve(s.listener, s.srv, s.flags, s.log)
	} else {
		err = web.ListenAndServe(s.srv, s.flags, s.log)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("web server: %w", err)
}

// Shutdown stops taking connections and waits until the requests being
// served are answered, or ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Actor returns the server as an actor of a run group
// (github.com/oklog/run): execute serves; interrupt shuts the server down
// and returns once the requests in flight are answered (at most timeout),
// so actors added after it stop only then.
func (s *Server) Actor(timeout time.Duration) (execute func() error, interrupt func(error)) {
	return s.Run, func(error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			s.log.Warn("web server: shutdown", "err", err)
		}
	}
}

// ContextActor returns an actor of a run group that ends, with no error,
// when ctx does (a signal), and whose interrupt ends it.
func ContextActor(ctx context.Context) (execute func() error, interrupt func(error)) {
	ctx, cancel := context.WithCancel(ctx)
	return func() error { <-ctx.Done(); return nil }, func(error) { cancel() }
}

// router sends /metrics and the landing page to their handlers and the rest
// to the program's handler, unchanged (no path cleaning or redirects).
type router struct {
	metrics, landing, next http.Handler
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/metrics" && rt.metrics != nil:
		rt.metrics.ServeHTTP(w, r)
	case r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		rt.landing.ServeHTTP(w, r)
	case rt.next != nil:
		rt.next.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

// MetricNamespace is the prefix of program's build_info metric:
// "edgepipe_" and the program's name in snake case
// (edgepipe_rtld_receiver for rtld-receiver).
func MetricNamespace(program string) string {
	return "edgepipe_" + strings.ReplaceAll(program, "-", "_")
}

// BuildInfo returns the standard collector of
// <MetricNamespace(program)>_build_info, which is 1 and labeled with the
// build's version, revision, branch, Go version, OS and architecture.
func BuildInfo(program string) prometheus.Collector {
	return versioncollector.NewCollector(MetricNamespace(program))
}

// MetricsHandler serves reg's metrics (promhttp). A metric that fails to
// gather is logged as an error and the others are served; a scraper that
// went away while the answer was written is logged once, at debug level.
func MetricsHandler(reg *prometheus.Registry, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// promhttp reports a failed write once per metric family: a
		// handler per request lets its log tell the first from the rest.
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog:      &promhttpLog{log: logger},
			ErrorHandling: promhttp.ContinueOnError,
			Registry:      reg,
		}).ServeHTTP(w, r)
	})
}

// promhttpLog is promhttp's error log for one request on a slog logger.
type promhttpLog struct {
	log  *slog.Logger
	gone bool // the scraper went away (logged)
}

func (l *promhttpLog) Println(v ...any) {
	var err error
	for _, x := range v {
		if e, ok := x.(error); ok {
			err = e
		}
	}
	if err != nil && ClientGone(err) {
		if !l.gone {
			l.gone = true
			l.log.Debug("serving /metrics: the client went away", "err", err)
		}
		return
	}
	l.log.Error("serving /metrics", "err", strings.TrimSpace(fmt.Sprintln(v...)))
}

// LogServeError logs err, met while serving what (e.g. "/metrics"): at
// debug level when the client went away (ClientGone), as an error
// otherwise.
func LogServeError(logger *slog.Logger, what string, err error) {
	if ClientGone(err) {
		logger.Debug("serving "+what+": the client went away", "err", err)
		return
	}
	logger.Error("serving "+what, "err", err)
}

// ClientGone reports whether err means that the other end closed the
// connection (a scraper's `| head`, a timeout on its side): broken pipe,
// connection reset or aborted, a closed connection, a canceled request.
// That is the client's business, not an error of the server.
func ClientGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled)
}

// ServerErrorLog returns the http.Server error log for logger: a TLS
// handshake the client abandoned (EOF, reset, timeout) at debug level,
// everything else (a bad client certificate, a panic in a handler) as a
// warning.
func ServerErrorLog(logger *slog.Logger) *log.Logger {
	return log.New(serverLogWriter{logger}, "", 0)
}

type serverLogWriter struct{ log *slog.Logger }

// clientGoneSuffixes end the http.Server's log lines about connections the
// client closed.
var clientGoneSuffixes = []string{": EOF", "connection reset by peer", "broken pipe", "i/o timeout"}

func (w serverLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	for _, s := range clientGoneSuffixes {
		if strings.HasSuffix(msg, s) {
			level = slog.LevelDebug
		}
	}
	w.log.Log(context.Background(), level, msg, "component", "http")
	return len(p), nil
}
