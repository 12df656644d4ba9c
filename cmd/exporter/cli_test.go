package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// exporterBin is cmd/exporter built as `make build` builds it.
func exporterBin(t *testing.T) string {
	t.Helper()
	return testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/exporter")
}

// TestHelpListsEveryFlag: `exporter --help` lists every flag of the
// application and of the run command (the default), `exporter backfill
// --help` every flag of backfill, `exporter check --help` every flag of
// check, checked against the flag set.
func TestHelpListsEveryFlag(t *testing.T) {
	model := newCommandLine(io.Discard, io.Discard).app.Model()
	for _, tc := range []struct {
		args []string
		cmd  string
	}{
		{[]string{"--help"}, "run"},
		{[]string{"run", "--help"}, "run"},
		{[]string{"backfill", "--help"}, "backfill"},
		{[]string{"check", "--help"}, "check"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			testenv.CheckHelp(t, exporterBin(t), tc.args, testenv.FlagNames(model, tc.cmd), 20)
		})
	}
}

func TestVersion(t *testing.T) {
	stdout, stderr, code := testenv.RunCommand(t, exporterBin(t), []string{"--version"})
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "exporter, version ") || !strings.Contains(stdout, "go version:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestMistypedFlags: each error names the flag (and for an enum the values
// it takes), says "try --help", and the exporter exits 1 before doing
// anything.
func TestMistypedFlags(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want string
	}{
		{"--poll-interval=1", `exporter: --poll-interval: time: missing unit in duration "1"; try --help`},
		{"--otlp.queue-size=many", `exporter: --otlp.queue-size: `},
		{"--pol-interval=1m", `exporter: unknown long flag '--pol-interval'; try --help`},
		{"--log.format=yaml", `exporter: --log.format: `},
		{"--poll-interval", `exporter: expected argument for flag '--poll-interval'; try --help`},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			stdout, stderr, code := testenv.RunCommand(t, exporterBin(t), []string{"--simulate", tc.arg})
			if code != 1 || stdout != "" || !strings.HasPrefix(stderr, tc.want) || !strings.HasSuffix(stderr, "; try --help\n") {
				t.Errorf("exit %d, stdout %q, stderr %q; want stderr starting %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

// TestRefusedValues: values that parse but cannot work stop the exporter
// at start, before it serves or polls, with an error naming the flag.
func TestRefusedValues(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want string
	}{
		// 0 gave the sinks an already expired flush at shutdown.
		{"--shutdown-timeout=0s", "exporter: --shutdown-timeout must be positive, got 0s"},
		{"--prometheus.max-series=-1", "exporter: --prometheus.max-series must not be negative, got -1"},
		{"--inventory.interval=-1h", "exporter: --inventory.interval must not be negative (0 turns the certificate inventory off), got -1h0m0s"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			_, stderr, code := testenv.RunCommand(t, exporterBin(t), []string{"--simulate", "--web.listen-address=127.0.0.1:0", tc.arg})
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 1 and %q", code, stderr, tc.want)
			}
		})
	}
}

// TestServing runs the exporter binary against a simulator whose only
// client's secret is in a file given by --client-secret-file, and checks
// over loopback: the secret from the file is used (discovery succeeds) and
// shows nowhere (log at debug level, process arguments, environment); the
// landing page; edgepipe_exporter_build_info; and a scraper that closes
// the connection early is logged at debug level, not as an error.
func TestServing(t *testing.T) {
	const clientID, secret = "cli-test", "file-secret-7d1f0c"
	sim, err := platformsim.New(platformsim.Config{Seed: 5, Environments: 25, Clients: []platformsim.Client{{
		ID: clientID, Secret: secret, Scopes: []string{platformsim.ScopeMetrics, platformsim.ScopeAccounts, platformsim.ScopeConfig},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	secretFile := filepath.Join(t.TempDir(), "client-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	x := testenv.StartCommand(t, exporterBin(t), []string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
		"--client-secret-file=" + secretFile, "--web.listen-address=127.0.0.1:0", "--poll.jitter=0s", "--log.level=debug"},
		envClientID+"="+clientID, envClientSecret+"=", envClientSecret+"_FILE=", envEnvironmentIDs+"=", envOrganizations+"=")
	url := "http://" + x.ListenAddr(30*time.Second)

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, _ := get("/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready within 60 s: the secret from --client-secret-file was not accepted?")
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("secret from the file", func(t *testing.T) {
		_, metrics := get("/metrics")
		if !strings.Contains(metrics, "\nedgepipe_discovery_up 1\n") {
			t.Error("discovery did not succeed with the secret from the file")
		}
		for where, text := range map[string]string{"the log": x.Log(), "the process arguments": testenv.ProcessArgs(t, x.Pid()), "/metrics": metrics} {
			if strings.Contains(text, secret) {
				t.Errorf("the secret appears in %s", where)
			}
		}
	})
	t.Run("landing page", func(t *testing.T) {
		code, body := get("/")
		if code != http.StatusOK || !strings.Contains(body, "edgepipe exporter") || !strings.Contains(body, `href="/metrics"`) || strings.Contains(body, "debug/pprof") {
			t.Errorf("GET /: %d %.500s", code, body)
		}
	})
	t.Run("build_info", func(t *testing.T) {
		_, metrics := get("/metrics")
		if !regexp.MustCompile(`\nedgepipe_exporter_build_info\{[^}]*goversion="go[^}]*version="[^"]+"[^}]*\} 1\n`).MatchString(metrics) {
			t.Errorf("no edgepipe_exporter_build_info with a version in /metrics")
		}
	})
	t.Run("scraper closing early", func(t *testing.T) {
		scrapeAndHangUp(t, x, strings.TrimPrefix(url, "http://"))
		if errs := regexp.MustCompile(`(?m)^.*level=(ERROR|WARN).*$`).FindAllString(x.Log(), -1); len(errs) > 0 {
			t.Errorf("logged at warn or error:\n%s", strings.Join(errs, "\n"))
		}
	})
}

// scrapeAndHangUp reads the start of /metrics and resets the connection, as
// `curl … /metrics | head` does, until the program logs (at debug level)
// that the scraper went away.
func scrapeAndHangUp(t *testing.T, x *testenv.Command, addr string) {
	t.Helper()
	gone := regexp.MustCompile(`level=DEBUG .*msg="serving /metrics: the client went away"`)
	deadline := time.Now().Add(30 * time.Second)
	for !gone.MatchString(x.Log()) {
		if time.Now().After(deadline) {
			t.Fatal("no scrape met a closed connection within 30 s")
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\n\r\n", addr)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, " 200 ") {
			t.Fatalf("status line %q, %v", line, err)
		}
		if err := c.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		c.Close()
		time.Sleep(300 * time.Millisecond)
	}
}
