package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rungroup "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
)

// records is a slog handler keeping every record, for assertions on levels.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// find returns the records at level whose message contains msg.
func (r *records) find(level slog.Level, msg string) []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.recs {
		if rec.Level == level && strings.Contains(rec.Message, msg) {
			out = append(out, rec)
		}
	}
	return out
}

// atLeast returns the messages of the records at level or above.
func (r *records) atLeast(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Level >= level {
			out = append(out, rec.Message)
		}
	}
	return out
}

// serve runs site on a loopback listener in a run group until the test
// ends, and returns its base URL.
func serve(t *testing.T, site Site, log *slog.Logger) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	site.Listener = l
	noConfig := ""
	srv, err := (&Web{Flags: &web.FlagConfig{WebConfigFile: &noConfig}}).NewServer(site, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var g rungroup.Group
	g.Add(ContextActor(ctx))
	g.Add(srv.Actor(5 * time.Second))
	done := make(chan error, 1)
	go func() { done <- g.Run() }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run group: %v", err)
		}
	})
	return "http://" + l.Addr().String()
}

// bigRegistry holds a few families of many long series: an exposition of
// several megabytes, more than the loopback socket buffers hold.
func bigRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	for f := range 8 {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: fmt.Sprintf("test_family_%d", f), Help: "A test family."}, []string{"a", "b"})
		for i := range 5000 {
			g.WithLabelValues(fmt.Sprintf("value-%06d-%s", i, strings.Repeat("x", 40)), "y").Set(float64(i))
		}
		reg.MustRegister(g)
	}
	return reg
}

// TestScraperGoneIsDebug: a scraper that reads the start of /metrics and
// resets the connection (curl … | head) is logged at debug level, not as an
// error; a collector that fails is still an error.
func TestScraperGoneIsDebug(t *testing.T) {
	rec := &records{}
	log := slog.New(rec)
	reg := bigRegistry(t)
	reg.MustRegister(failingCollector{})
	base := serve(t, Site{Metrics: MetricsHandler(reg, log)}, log)
	addr := strings.TrimPrefix(base, "http://")

	deadline := time.Now().Add(20 * time.Second)
	for len(rec.find(slog.LevelDebug, "went away")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no scrape met a closed connection in 20 s; records at warn or above: %q", rec.atLeast(slog.LevelWarn))
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\n\r\n", addr)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, "200") {
			t.Fatalf("status line %q, %v", line, err)
		}
		if err := c.(*net.TCPConn).SetLinger(0); err != nil { // close with a reset, as a killed curl does
			t.Fatal(err)
		}
		c.Close()
		time.Sleep(200 * time.Millisecond)
	}
	for _, msg := range rec.atLeast(slog.LevelWarn) {
		if !strings.Contains(msg, "serving /metrics") {
			t.Errorf("logged at warn or above: %q", msg)
		}
	}
	if errs := rec.find(slog.LevelError, "serving /metrics"); len(errs) == 0 {
		t.Error("the failing collector was not logged as an error")
	} else {
		for _, r := range errs {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "err" && !strings.Contains(a.Value.String(), "collector broke") {
					t.Errorf("error record %q: err %q", r.Message, a.Value)
				}
				return true
			})
		}
	}
}

// failingCollector fails every gather.
type failingCollector struct{}

var failingDesc = prometheus.NewDesc("test_failing", "Fails.", nil, nil)

func (failingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- failingDesc }
func (failingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(failingDesc, errors.New("collector broke"))
}

func TestServerErrorLogLevels(t *testing.T) {
	for _, tc := range []struct {
		line string
		want slog.Level
	}{
		{"http: TLS handshake error from 127.0.0.1:5000: EOF", slog.LevelDebug},
		{"http: TLS handshake error from 127.0.0.1:5000: read tcp 127.0.0.1:9781->127.0.0.1:5000: read: connection reset by peer", slog.LevelDebug},
		{"http: TLS handshake error from 127.0.0.1:5000: read tcp 127.0.0.1:9781->127.0.0.1:5000: i/o timeout", slog.LevelDebug},
		{"http: TLS handshake error from 127.0.0.1:5000: remote error: tls: bad certificate", slog.LevelWarn},
		{"http: panic serving 127.0.0.1:5000: boom", slog.LevelWarn},
		{"http: Accept error: accept tcp [::]:9780: accept4: too many open files; retrying in 5ms", slog.LevelWarn},
	} {
		rec := &records{}
		ServerErrorLog(slog.New(rec)).Print(tc.line)
		if got := rec.find(tc.want, strings.TrimSpace(tc.line)); len(got) != 1 {
			t.Errorf("%q: records %+v, want one at %v", tc.line, rec.recs, tc.want)
		}
	}
}

// TestRouter: GET / is the landing page with the program's name and
// version, /metrics the metrics, and everything else reaches the program's
// handler with its path as sent (no cleaning, no redirect).
func TestRouter(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusTeapot)
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(BuildInfo("test-prog"))
	base := serve(t, Site{
		Landing: web.LandingConfig{Name: "edgepipe test-prog", Description: "A test.", Links: []web.LandingLinks{{Address: "/metrics", Text: "Metrics"}}},
		Metrics: MetricsHandler(reg, slog.New(slog.DiscardHandler)),
		Handler: next,
	}, slog.New(slog.DiscardHandler))
	do := func(method, path string) (int, string) {
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = path // as sent
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(http.MethodGet, "/"); code != 200 || !strings.Contains(body, "edgepipe test-prog") || !strings.Contains(body, version.Version) {
		t.Errorf("GET /: %d %.300s", code, body)
	}
	if code, body := do(http.MethodGet, "/metrics"); code != 200 || !strings.Contains(body, "edgepipe_test_prog_build_info{") {
		t.Errorf("GET /metrics: %d %.300s", code, body)
	}
	for _, path := range []string{"/ingest/env-1", "/ingest//x/../y", "/metrics/"} {
		if code, _ := do(http.MethodPost, path); code != http.StatusTeapot {
			t.Errorf("POST %s: %d, want the program's handler", path, code)
		}
	}
	if code, _ := do(http.MethodPost, "/"); code != http.StatusTeapot {
		t.Errorf("POST /: %d, want the program's handler", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"POST /ingest/env-1", "POST /ingest//x/../y", "POST /metrics/", "POST /"}; strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("the program's handler saw %q, want %q", seen, want)
	}
}

// TestActorAnswersRequestsInFlight: interrupting the group shuts the
// server down only after the request being served is answered, and the
// actors added after the server stop after that.
func TestActorAnswersRequestsInFlight(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	noConfig := ""
	srv, err := (&Web{Flags: &web.FlagConfig{WebConfigFile: &noConfig}}).NewServer(Site{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			close(entered)
			<-release
			_, _ = io.WriteString(w, "answered") // a client gone is the test's business, not the handler's
		}),
		Listener: l,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	var g rungroup.Group
	g.Add(ContextActor(ctx))
	g.Add(srv.Actor(10 * time.Second))
	workers, stopWorkers := context.WithCancel(context.Background())
	g.Add(func() error { <-workers.Done(); note("workers stopped"); return nil }, func(error) { stopWorkers() })
	done := make(chan error, 1)
	go func() { done <- g.Run() }()

	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + l.Addr().String() + "/slow")
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		note("answered")
		answer <- string(b)
	}()
	<-entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("the group ended (%v) with a request in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if got := <-answer; got != "answered" {
		t.Errorf("request in flight: %q", got)
	}
	if err := <-done; err != nil {
		t.Errorf("run group: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(order, ",") != "answered,workers stopped" {
		t.Errorf("order %q: the workers must stop after the request in flight is answered", order)
	}
}

func TestMetricNamespace(t *testing.T) {
	for program, want := range map[string]string{"exporter": "edgepipe_exporter", "rtld-receiver": "edgepipe_rtld_receiver"} {
		if got := MetricNamespace(program); got != want {
			t.Errorf("MetricNamespace(%q) = %q, want %q", program, got, want)
		}
	}
}
