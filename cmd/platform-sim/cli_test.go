package main

import (
	"io"
	"net/http"
	"net/url"
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

// simBin is cmd/platform-sim built as `make build` builds it.
func simBin(t *testing.T) string {
	t.Helper()
	return testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/platform-sim")
}

// TestHelpListsEveryFlag: --help lists every flag, checked against the flag
// set.
func TestHelpListsEveryFlag(t *testing.T) {
	app, _ := newCommandLine(io.Discard, io.Discard)
	testenv.CheckHelp(t, simBin(t), []string{"--help"}, testenv.FlagNames(app.Model()), 25)
}

func TestVersion(t *testing.T) {
	stdout, stderr, code := testenv.RunCommand(t, simBin(t), []string{"--version"})
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "platform-sim, version ") || !strings.Contains(stdout, "go version:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestMistypedFlags: each error names the flag (and for an enum the values
// it takes) and says "try --help"; the simulator exits 1.
func TestMistypedFlags(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want []string
	}{
		{"--fault.latency=5", []string{`platform-sim: --fault.latency: time: missing unit in duration "5"`}},
		{"--data.numbers=words", []string{"platform-sim: --data.numbers: ", "mixed,numbers,strings", "words"}},
		{"--seed=one", []string{"platform-sim: --seed: "}},
		{"--world.environment=3", []string{"platform-sim: unknown long flag '--world.environment'"}},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			stdout, stderr, code := testenv.RunCommand(t, simBin(t), []string{tc.arg})
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

// TestClientSecretFile: with --client-secret-file the demo client must
// present the file's secret (the documented one is refused), and the
// secret shows neither in the log nor in the process arguments.
func TestClientSecretFile(t *testing.T) {
	const secret = "sim-file-secret-5be1"
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sim := testenv.StartCommand(t, simBin(t), []string{"--web.listen-address=127.0.0.1:0", "--client-secret-file=" + f, "--log.level=debug"},
		envClientSecret+"=", envClientSecret+"_FILE=")
	base := sim.WaitLog(regexp.MustCompile(`API and auth URL (\S+)`), 30*time.Second)[1]
	token := func(secret string) int {
		resp, err := http.PostForm(base+"/connect/token", url.Values{
			"grant_type": {"client_credentials"}, "client_id": {platformsim.DemoClientID},
			"client_secret": {secret}, "scope": {platformsim.ScopeMetrics},
		})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := token(secret); code != http.StatusOK {
		t.Errorf("token with the file's secret: %d", code)
	}
	if code := token(platformsim.DemoClientSecret); code != http.StatusUnauthorized {
		t.Errorf("token with the documented secret: %d, want 401", code)
	}
	for where, text := range map[string]string{"the log": sim.Log(), "the process arguments": testenv.ProcessArgs(t, sim.Pid())} {
		if strings.Contains(text, secret) {
			t.Errorf("the secret appears in %s", where)
		}
	}
	if err := sim.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}
