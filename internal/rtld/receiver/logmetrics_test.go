package receiver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestLogMetricsCountSpooledBatchesOnce: a batch resent before the gap
// tracker has read its first copy is acknowledged as a duplicate by ingest,
// not stored again, and counted once in edgepipe_rtld_records_received_total
// and in the log metrics; refused batches are not counted at all. The
// receiver's workers are not started here, so the gap tracker never reads
// the first copy: the window a fast resend meets in production.
func TestLogMetricsCountSpooledBatchesOnce(t *testing.T) {
	rcv, err := receiver.New(receiver.Config{
		SpoolDir:   t.TempDir(),
		Ingest:     rtld.IngestConfig{Username: "u", Password: "p"},
		LogMetrics: &logmetrics.Config{},
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcv.Close() })
	srv := httptest.NewServer(rcv.Handler())
	t.Cleanup(srv.Close)
	recs := []string{
		`{"status_code":200,"cache_status":"TCP_HIT","pop":"FRA","bytes_out":100,"total_time":0.01}`,
		`{"status_code":404,"cache_status":"TCP_MISS","pop":"FRA","bytes_out":50,"total_time":0.2}`,
	}
	body := gzipBytes(t, jsonBatch("agent-1", 0, recs))
	url := srv.URL + "/ingest/env"
	for i, want := range []string{rtld.StatusAccepted, rtld.StatusDuplicate} {
		if code, answer := postBatch(t, srv.Client(), url, "u", "p", body, true); code != http.StatusOK || !strings.Contains(answer, want) {
			t.Fatalf("post %d: %d %s, want %s", i, code, answer, want)
		}
	}
	// Refused: wrong credentials, malformed.
	if code, _ := postBatch(t, srv.Client(), url, "u", "wrong", gzipBytes(t, jsonBatch("agent-1", 1, recs)), true); code != http.StatusUnauthorized {
		t.Fatalf("wrong password: %d", code)
	}
	if code, _ := postBatch(t, srv.Client(), url, "u", "p", gzipBytes(t, []byte(`[{"status_code":200},`)), true); code != http.StatusBadRequest {
		t.Fatalf("malformed: %d", code)
	}
	exp := scrapeText(t, srv.Client(), srv.URL+"/metrics")
	mfs := parseText(t, exp)
	if got := testenv.SampleSum(mfs, "edgepipe_rtld_records_received_total", map[string]string{"status": "accepted"}); got != 2 {
		t.Fatalf("ingest accepted %v records, want 2 (the batch stored once)", got)
	}
	if got := testenv.SampleSum(mfs, "edgepipe_rtld_records_received_total", map[string]string{"status": "duplicate"}); got != 2 {
		t.Fatalf("ingest acknowledged %v records as duplicates, want 2", got)
	}
	if got := testenv.SampleSum(mfs, logmetrics.RequestsName, map[string]string{"environment_id": "env"}); got != 2 {
		t.Errorf("cdn_logs_requests_total %v, want 2", got)
	}
	if got := testenv.SampleSum(mfs, logmetrics.ResponseBytesName, nil); got != 150 {
		t.Errorf("cdn_logs_response_bytes_total %v, want 150", got)
	}
	testenv.CheckMetrics(t, exp)
}

// TestLogMetricsThroughPrometheus is the log metrics' must-show: three
// environments' records delivered by the simulator over HTTPS, with a third
// of the acknowledgements lost (so the platform resends those batches),
// read by a real Prometheus scraping the receiver binary:
// sum by (environment_id) (cdn_logs_requests_total) is each environment's
// number of unique records, the native histogram (Prometheus with
// native-histograms, protobuf scrape) and the classic one (the text
// exposition) count them too, and promtool finds nothing in the exposition.
func TestLogMetricsThroughPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the receiver, the simulator and Prometheus")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cert := newTestCert(t)
	sim, apiURL := startSimulator(t, cert, platformsim.Config{
		Seed: 19, Properties: 1, Environments: 3,
		Delivery: platformsim.DeliveryConfig{
			BatchSize: 40, AgentsPerEnvironment: 3, RetryInterval: 20 * time.Millisecond,
			RequestTimeout: 10 * time.Second,
			Faults:         platformsim.DeliveryFaults{DropAckPercent: 30},
		},
	})
	envs := sim.EnvironmentIDs()
	p, base := startSimulatedReceiver(t, cert, apiURL, envs, "--spool.dir="+filepath.Join(t.TempDir(), "spool"))
	addr := strings.TrimPrefix(base, "https://")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 30 * time.Second}
	prom := testenv.PrometheusWith(t, testenv.PrometheusOptions{
		Jobs:           []testenv.ScrapeJob{{Name: "rtld", Targets: []string{addr}, Scheme: "https"}},
		EnableFeatures: []string{"native-histograms"},
	})

	want := map[string]float64{}
	for i, env := range envs {
		profile := waitProfile(ctx, t, apiURL, env)
		n := 600 + 300*i
		if err := sim.DeliverRecords(ctx, profile, n); err != nil {
			t.Fatal(err)
		}
		want[env] = float64(n)
	}
	if err := sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	st := sim.Delivered()
	t.Logf("simulator: %+v", st)
	if st.RecordsDropped != 0 || st.AcksDropped == 0 {
		t.Fatalf("simulator dropped %d records and %d acknowledgements: want none and some", st.RecordsDropped, st.AcksDropped)
	}
	metrics := base + "/metrics"
	if d := scrape(client, metrics, `edgepipe_rtld_batches_received_total{status="duplicate"}`); d < 1 {
		t.Fatalf("the receiver saw %v duplicate batches: the test needs resends", d)
	}

	// Through Prometheus: the counters, and the native histogram's count.
	byEnv := func(q string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range prom.QueryVector(t, q) {
			out[string(s.Metric["environment_id"])] = float64(s.Value)
		}
		return out
	}
	var got, native map[string]float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = byEnv(`sum by (environment_id) (cdn_logs_requests_total)`)
		native = byEnv(`histogram_count(sum by (environment_id) (cdn_logs_total_time_seconds))`)
		if fmt.Sprint(got) == fmt.Sprint(want) && fmt.Sprint(native) == fmt.Sprint(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sum by (environment_id) (cdn_logs_requests_total) = %v, want the unique records %v", got, want)
	}
	if fmt.Sprint(native) != fmt.Sprint(want) {
		t.Errorf("native histogram counts %v, want %v", native, want)
	}
	// A quantile of the native histogram, in seconds: the simulator's
	// total_time is a few milliseconds to a second.
	for _, s := range prom.QueryVector(t, `histogram_quantile(0.95, sum by (environment_id) (cdn_logs_total_time_seconds))`) {
		if v := float64(s.Value); !(v > 0.001 && v < 5) {
			t.Errorf("p95 of total_time in %s: %v s", s.Metric["environment_id"], v)
		}
	}
	if v := prom.QueryVector(t, `count(cdn_logs_requests_total{status_class="2xx", pop!=""})`); len(v) != 1 || v[0].Value < 2 {
		t.Errorf("label sets with 2xx and a pop: %v", v)
	}

	// The text exposition: the classic histogram counts the same, and
	// promtool finds nothing.
	exp := scrapeText(t, client, metrics)
	testenv.CheckMetrics(t, exp)
	mfs := parseText(t, exp)
	for env, n := range want {
		var count uint64
		for _, m := range mfs[logmetrics.TotalTimeName].GetMetric() {
			if hasLabel(m, "environment_id", env) {
				count += m.GetHistogram().GetSampleCount()
			}
		}
		if float64(count) != n {
			t.Errorf("classic histogram of %s counts %d, want %v", env, count, n)
		}
		bytesOut := testenv.SampleSum(mfs, logmetrics.ResponseBytesName, map[string]string{"environment_id": env})
		if bytesOut < 150*n || math.IsNaN(bytesOut) {
			t.Errorf("%s: %v response bytes for %v records", env, bytesOut, n)
		}
	}
	t.Logf("requests %v; duplicate batches at ingest %v", got,
		scrape(client, metrics, `edgepipe_rtld_batches_received_total{status="duplicate"}`))
	if err := p.stop(); err != nil {
		t.Fatalf("receiver exit: %v", err)
	}
}

// scrapeText fetches url's exposition in the text format.
func scrapeText(t *testing.T, client *http.Client, url string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

func parseText(t *testing.T, exp []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(exp))
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
