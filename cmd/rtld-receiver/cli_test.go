package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// receiverBin is cmd/rtld-receiver built as `make build` builds it.
func receiverBin(t *testing.T) string {
	t.Helper()
	return testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/rtld-receiver")
}

// TestHelpListsEveryFlag: `rtld-receiver --help` lists every flag of the
// application and of the run command, each dead-letter command's and the
// check command's --help every flag of that command, checked against the
// flag set.
func TestHelpListsEveryFlag(t *testing.T) {
	model := newCommandLine(io.Discard, io.Discard).app.Model()
	for _, tc := range []struct {
		args []string
		cmd  string
	}{
		{[]string{"--help"}, cmdRun},
		{[]string{"dead-letter", "list", "--help"}, cmdDeadLetterList},
		{[]string{"dead-letter", "replay", "--help"}, cmdDeadLetterReplay},
		{[]string{"check", "--help"}, cmdCheck},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			testenv.CheckHelp(t, receiverBin(t), tc.args, testenv.FlagNames(model, tc.cmd), 40)
		})
	}
}

func TestVersion(t *testing.T) {
	stdout, stderr, code := testenv.RunCommand(t, receiverBin(t), []string{"--version"})
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "rtld-receiver, version ") || !strings.Contains(stdout, "go version:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestMistypedFlags: each error names the flag (and for an enum the values
// it takes), says "try --help", and the receiver exits 1 before doing
// anything.
func TestMistypedFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--kafka.compression=brotli"}, []string{"rtld-receiver: --kafka.compression: ", "none,gzip,snappy,lz4,zstd", "brotli"}},
		{[]string{"--ingest.body-timeout=30"}, []string{`rtld-receiver: --ingest.body-timeout: time: missing unit in duration "30"`}},
		{[]string{"--spool.max-bytes=lots"}, []string{"rtld-receiver: --spool.max-bytes: "}},
		{[]string{"--kafka.broker=k:9092"}, []string{"rtld-receiver: unknown long flag '--kafka.broker'"}},
		{[]string{"dead-letter", "replay", "--sink=s3"}, []string{"rtld-receiver: --sink: ", "kafka,clickhouse", "s3"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			stdout, stderr, code := testenv.RunCommand(t, receiverBin(t), tc.args)
			if code != 1 || stdout != "" || !strings.HasSuffix(stderr, "; try --help\n") {
				t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
		})
	}
}

// TestServing runs the receiver binary with the ingest password in a file
// given by --rtld.password-file and checks over loopback: a batch with that
// password is accepted and one with another is refused, and the password
// shows nowhere (log at debug level, process arguments); the landing page
// at GET / while ingest keeps its paths; edgepipe_rtld_receiver_build_info;
// nothing logged at warn or error but that it has no sink.
func TestServing(t *testing.T) {
	const user, password = "platform", "ingest-secret-93ab4e"
	pwFile := filepath.Join(t.TempDir(), "rtld-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := testenv.StartCommand(t, receiverBin(t), []string{"--no-register", "--spool.dir=" + t.TempDir(), "--environment-id=env-1",
		"--rtld.password-file=" + pwFile, "--web.listen-address=127.0.0.1:0", "--log.level=debug"},
		"EDGEPIPE_RTLD_USERNAME="+user, "EDGEPIPE_RTLD_PASSWORD=", "EDGEPIPE_RTLD_PASSWORD_FILE=", "EDGEPIPE_ENVIRONMENT_ID=")
	addr := r.ListenAddr(30 * time.Second)
	base := "http://" + addr
	do := func(method, path, user, pass string, body []byte) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	batch := func(seq int) []byte {
		var recs []string
		for i := range 2000 {
			recs = append(recs, fmt.Sprintf(`{"status_code":200,"bytes_out":%d,"path":"/%s"}`, i, strings.Repeat("p", 200)))
		}
		return []byte(fmt.Sprintf(`{"account_number":"ACME","agent_id":"agent-1","datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[%s]}`,
			seq, strings.Join(recs, ",")))
	}

	t.Run("password from the file", func(t *testing.T) {
		if code, body := do(http.MethodPost, "/ingest/env-1", user, password, batch(1)); code != http.StatusOK {
			t.Errorf("batch with the file's password: %d %s", code, body)
		}
		if code, _ := do(http.MethodPost, "/ingest/env-1", user, "not-"+password, batch(2)); code != http.StatusUnauthorized {
			t.Errorf("batch with another password: %d, want 401", code)
		}
		_, metrics := do(http.MethodGet, "/metrics", "", "", nil)
		for where, text := range map[string]string{"the log": r.Log(), "the process arguments": testenv.ProcessArgs(t, r.Pid()), "/metrics": metrics} {
			if strings.Contains(text, password) {
				t.Errorf("the password appears in %s", where)
			}
		}
	})
	t.Run("landing page", func(t *testing.T) {
		code, body := do(http.MethodGet, "/", "", "", nil)
		if code != http.StatusOK || !strings.Contains(body, "edgepipe rtld-receiver") || !strings.Contains(body, `href="/metrics"`) {
			t.Errorf("GET /: %d %.500s", code, body)
		}
		// Ingest keeps its paths: an unknown environment and a path that is
		// not ingest answer as before.
		if code, _ := do(http.MethodPost, "/ingest/env-2", user, password, batch(3)); code != http.StatusNotFound && code != http.StatusForbidden {
			t.Errorf("batch for an environment not served: %d", code)
		}
		if code, _ := do(http.MethodPost, "/", user, password, batch(4)); code == http.StatusOK {
			t.Errorf("POST / accepted")
		}
	})
	t.Run("build_info", func(t *testing.T) {
		_, metrics := do(http.MethodGet, "/metrics", "", "", nil)
		if !regexp.MustCompile(`\nedgepipe_rtld_receiver_build_info\{[^}]*goversion="go[^}]*version="[^"]+"[^}]*\} 1\n`).MatchString(metrics) {
			t.Errorf("no edgepipe_rtld_receiver_build_info with a version in /metrics")
		}
	})
	// (A scraper that goes away is logged at debug level by the same
	// handler as on the exporter, see internal/cli; the receiver's /metrics
	// is too small to be cut off reliably.)
	for _, line := range regexp.MustCompile(`(?m)^.*level=(ERROR|WARN).*$`).FindAllString(r.Log(), -1) {
		if !strings.Contains(line, "no sink configured") { // the one warning expected
			t.Errorf("logged at warn or error: %s", line)
		}
	}
	if err := r.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}
