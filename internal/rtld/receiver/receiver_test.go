package receiver_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestSpoolFullAnswers503AndLosesNothing fills a small spool while the only
// sink (Kafka) is down: ingest answers 503 with Retry-After, the simulator
// retries, and once the broker is back every record arrives.
func TestSpoolFullAnswers503AndLosesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kafka := testenv.Kafka(t)
	kafka.Pause()

	cert := newTestCert(t)
	sim, apiURL := startSimulator(t, cert, platformsim.Config{Seed: 3, Properties: 1, Environments: 1, Delivery: platformsim.DeliveryConfig{
		BatchSize: 250, AgentsPerEnvironment: 2, RetryInterval: 100 * time.Millisecond,
	}})
	env := sim.EnvironmentIDs()[0]

	srv := httptest.NewUnstartedServer(nil)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.tls}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	httpc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 10 * time.Second}

	client, err := platform.New(platform.Config{BaseURL: apiURL, AuthURL: apiURL, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	rcv, err := receiver.New(receiver.Config{
		SpoolDir: t.TempDir(), SpoolMaxBytes: 3 << 20, SpoolSegmentBytes: 256 << 10,
		Ingest:         rtld.IngestConfig{Username: "u", Password: "p", RetryAfter: time.Second, MaxDecodedBytes: 1 << 20},
		EnvironmentIDs: []string{env}, GapSaveInterval: 200 * time.Millisecond,
		Kafka:      &kafkasink.Config{Brokers: kafka.Brokers(), Topic: "full", CreateTopic: true, WriteTimeout: 2 * time.Second},
		ProfileAPI: client.RTLD(),
		Registrar:  &rtld.RegistrarConfig{EnvironmentIDs: []string{env}, PublicURL: srv.URL, Username: "u", Password: "p"},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = rcv.Handler()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rcv.Run(runCtx) }()
	defer func() {
		srv.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	var profile int64
	waitFor(t, "the profile", 20*time.Second, func() bool {
		profile, err = profileID(ctx, t, apiURL, env)
		return err == nil
	})
	const total = 8000
	if err := sim.DeliverRecords(ctx, profile, total); err != nil {
		t.Fatal(err)
	}
	unavailable := func() float64 {
		return scrape(httpc, srv.URL+"/metrics", `edgepipe_rtld_batches_received_total{status="unavailable"}`)
	}
	waitFor(t, "the spool to fill up and ingest to answer 503", 30*time.Second, func() bool { return unavailable() > 0 })
	if rcv.Spool().Stats().Bytes > 3<<20 {
		t.Fatalf("spool holds %d bytes, bound 3 MiB", rcv.Spool().Stats().Bytes)
	}
	// Readiness follows the spool.
	resp, err := httpc.Get(srv.URL + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz with a full spool: %d", resp.StatusCode)
		}
	}
	kafka.Resume()
	if err := sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	recs := kafka.WaitForRecords(t, "full", total, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		var v struct {
			UUID string `json:"uuid"`
		}
		_ = json.Unmarshal(r.Value, &v)
		seen[v.UUID] = true
	}
	for _, u := range sim.GeneratedUUIDs() {
		if !seen[u] {
			t.Fatalf("uuid %s lost", u)
		}
	}
	t.Logf("503 answers: %v; Kafka messages %d for %d records", unavailable(), len(recs), total)
}
