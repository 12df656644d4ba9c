package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// TestServeAndShutdown runs the command on a free port, gets a token and a
// dataset list over HTTP as curl would, and stops it.
func TestServeAndShutdown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret string // EDGEPIPE_SIM_CLIENT_SECRET
	}{
		{"demo secret", ""},
		{"secret from environment", "s3cr3t-from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := platformsim.DemoClientSecret
			if tc.secret != "" {
				t.Setenv("EDGEPIPE_SIM_CLIENT_SECRET", tc.secret)
				want = tc.secret
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			var logs strings.Builder
			go func() {
				done <- run(ctx, []string{"--web.listen-address=127.0.0.1:0", "--seed=3", "--world.environments=30"}, pw, &logs)
				pw.Close()
			}()
			sc := bufio.NewScanner(pr)
			var base string
			var out []string
			for sc.Scan() {
				line := sc.Text()
				out = append(out, line)
				if rest, ok := strings.CutPrefix(line, "platform-sim: API and auth URL "); ok {
					base = rest
				}
				if strings.HasPrefix(line, "platform-sim: client ID") {
					break
				}
			}
			go func() { _, _ = io.Copy(io.Discard, pr) }() // the logs, unread
			if base == "" {
				t.Fatalf("no URL printed: %v", out)
			}
			joined := strings.Join(out, "\n")
			if !strings.Contains(joined, platformsim.DemoOrganizationID) || strings.Contains(joined, want) {
				t.Fatalf("output must name the organization and not the secret: %s", joined)
			}
			resp, err := http.PostForm(base+"/connect/token", url.Values{
				"grant_type": {"client_credentials"}, "client_id": {platformsim.DemoClientID},
				"client_secret": {want}, "scope": {"app.metrics"},
			})
			if err != nil {
				t.Fatal(err)
			}
			var tok struct {
				AccessToken string `json:"access_token"`
			}
			err = json.NewDecoder(resp.Body).Decode(&tok)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("token: %d %v", resp.StatusCode, err)
			}
			if tc.secret != "" {
				r, err := http.PostForm(base+"/connect/token", url.Values{
					"grant_type": {"client_credentials"}, "client_id": {platformsim.DemoClientID},
					"client_secret": {platformsim.DemoClientSecret},
				})
				if err != nil {
					t.Fatal(err)
				}
				r.Body.Close()
				if r.StatusCode != http.StatusUnauthorized {
					t.Fatalf("documented secret still accepted after override: %d", r.StatusCode)
				}
			}
			req, _ := http.NewRequest(http.MethodGet, base+"/metrics/v1/datasets", nil)
			req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				t.Fatalf("datasets: %d", r.StatusCode)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no shutdown")
			}
			if strings.Contains(logs.String(), want) {
				t.Fatal("secret in logs")
			}
			if !strings.Contains(logs.String(), "environments=30") {
				t.Fatalf("logs: %s", logs.String())
			}
		})
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fault.rate-429=1.5"}, "--fault.rate-429 must be between 0 and 1"},
		{[]string{"--data.numbers=words"}, "--data.numbers"},
		{[]string{"--web.listen-address=256.0.0.1:99999"}, "listen"},
		{[]string{"--traffic.scale=0"}, "--traffic.scale must be more than 0"},
		{[]string{"--traffic.scale=5000"}, "--traffic.scale must be more than 0 and at most 1000"},
		{[]string{"--delivery.fault.drop-ack-percent=120"}, "--delivery.fault.drop-ack-percent must be between 0 and 100"},
		{[]string{"--delivery.fault.drop-batch-percent=e1=101"}, "--delivery.fault.drop-batch-percent e1=101: want a percent"},
		{[]string{"--delivery.fault.drop-record-percent=e1=much"}, "--delivery.fault.drop-record-percent e1=much: want a percent"},
		{[]string{"--delivery.fault.late=e1=soon"}, "--delivery.fault.late e1=soon: want a duration"},
		{[]string{"--web.listen-address=127.0.0.1:0", "--delivery.fault.late=not-an-environment=10m"}, `no environment "not-an-environment"`},
	} {
		var logs strings.Builder
		err := run(context.Background(), tc.args, io.Discard, &logs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// TestDeliveryFaultFlags: the --delivery.fault.* flags become the
// simulator's per-environment faults, several for one environment.
func TestDeliveryFaultFlags(t *testing.T) {
	app, f := newCommandLine(io.Discard, io.Discard)
	if _, err := app.Parse([]string{"--traffic.scale=0.25", "--delivery.fault.drop-ack-percent=5",
		"--delivery.fault.drop-batch-percent=e1=10", "--delivery.fault.drop-record-percent=e2=2.5",
		"--delivery.fault.late=e1=7m", "--no-delivery.live"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	want := platformsim.DeliveryFaults{DropAckPercent: 5, Environments: map[string]platformsim.EnvironmentFaults{
		"e1": {DropBatchPercent: 10, Late: 7 * time.Minute}, "e2": {DropRecordPercent: 2.5}}}
	if !reflect.DeepEqual(cfg.Delivery.Faults, want) || cfg.TrafficScale != 0.25 || cfg.Delivery.Live {
		t.Errorf("faults %+v, scale %v, live %v", cfg.Delivery.Faults, cfg.TrafficScale, cfg.Delivery.Live)
	}
}
