package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
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
	for _, args := range [][]string{
		{"--fault.rate-429=1.5"},
		{"--data.numbers=words"},
		{"--web.listen-address=256.0.0.1:99999"},
	} {
		var logs strings.Builder
		if err := run(context.Background(), args, io.Discard, &logs); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
