package cli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/alecthomas/units"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// testApp is an App with a flag of each kind kingpin offers and a default
// command with flags of its own, like the exporter's.
type testApp struct {
	app      *App
	interval time.Duration
	size     units.Base2Bytes
	count    int
	mode     string
	list     []string
	on       bool
	poll     time.Duration
}

func newTestApp(stdout, stderr io.Writer) *testApp {
	t := &testApp{app: New("prog", "A test program.", stdout, stderr)}
	t.app.Flag("interval", "An interval.").Default("1m").DurationVar(&t.interval)
	t.app.Flag("size", "A size.").Default("1MiB").BytesVar(&t.size)
	t.app.Flag("count", "A count.").Envar("TEST_CLI_COUNT").Default("1").IntVar(&t.count)
	t.app.Flag("mode", "A mode.").Default("lz4").EnumVar(&t.mode, "none", "gzip", "lz4")
	t.app.Flag("item", "Repeatable.").StringsVar(&t.list)
	t.app.Flag("on", "A switch.").Default("true").BoolVar(&t.on)
	run := t.app.Command("run", "The default command.").Default()
	run.Flag("poll", "A flag of the default command.").Default("5s").DurationVar(&t.poll)
	other := t.app.Command("other", "Another command.")
	other.Flag("other-flag", "A flag of another command.").String()
	return t
}

func TestParseErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string // TEST_CLI_COUNT
		want []string
	}{
		{args: []string{"--interval=1"}, want: []string{`--interval: time: missing unit in duration "1"`}},
		{args: []string{"--size=lots"}, want: []string{"--size: "}},
		{args: []string{"--count=x"}, want: []string{"--count: ", `"x"`}},
		{args: []string{"--count=x", "run"}, want: []string{"--count: "}},
		{env: "many", want: []string{"--count: ", `"many"`}},
		{args: []string{"--mode=brotli"}, want: []string{"--mode: ", "none,gzip,lz4", "brotli"}},
		{args: []string{"--poll=1"}, want: []string{"--poll: ", "missing unit"}},
		{args: []string{"run", "--poll=soon"}, want: []string{"--poll: "}},
		{args: []string{"other", "--poll=1s"}, want: []string{"unknown long flag '--poll'"}},
		{args: []string{"--nope"}, want: []string{"unknown long flag '--nope'"}},
		// kingpin drops a flag without its value when there is a default
		// command; Parse does not.
		{args: []string{"--interval"}, want: []string{"expected argument for flag '--interval'"}},
		{args: []string{"--poll", "--on"}, want: []string{"expected argument for flag '--poll'"}},
		{args: []string{"run", "--poll"}, want: []string{"expected argument for flag '--poll'"}},
	} {
		t.Run(strings.Join(tc.args, " ")+tc.env, func(t *testing.T) {
			t.Setenv("TEST_CLI_COUNT", tc.env)
			_, err := newTestApp(io.Discard, io.Discard).app.Parse(tc.args)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(tc.want, "; try --help") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Count(err.Error(), "try --help") != 1 {
				t.Errorf("error %q: want one \"try --help\"", err)
			}
		})
	}
}

// TestParseKeepsFlagKinds: wrapping the values to name them keeps booleans
// (--no-…), repeated flags, defaults and the default command working.
func TestParseKeepsFlagKinds(t *testing.T) {
	t.Setenv("TEST_CLI_COUNT", "7")
	a := newTestApp(io.Discard, io.Discard)
	cmd, err := a.app.Parse([]string{"--no-on", "--item", "a", "--item=b,c", "--mode=gzip", "--poll", "2s"})
	if err != nil {
		t.Fatal(err)
	}
	if cmd != "run" || a.on || !slices.Equal(a.list, []string{"a", "b,c"}) || a.mode != "gzip" || a.poll != 2*time.Second ||
		a.count != 7 || a.interval != time.Minute || a.size != units.MiB {
		t.Errorf("command %q, flags %+v", cmd, a)
	}
	// Parsing twice (tests do) wraps nothing twice.
	if _, err := a.app.Parse([]string{"--interval=1"}); err == nil || strings.Count(err.Error(), "--interval:") != 1 {
		t.Errorf("second parse: %v", err)
	}
}

// TestHelpListsEveryFlag: --help prints, to stdout, every flag of the
// application and of its default command, checked against the flag set;
// "<command> --help" every flag of that command.
func TestHelpListsEveryFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		cmds []string // whose flags must be listed besides the application's
	}{
		{args: []string{"--help"}, cmds: []string{"run"}},
		{args: []string{"-h"}, cmds: []string{"run"}},
		{args: []string{"other", "--help"}, cmds: []string{"other"}},
		{args: []string{"help", "run"}, cmds: []string{"run"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			a := newTestApp(&stdout, &stderr)
			if _, err := a.app.Parse(tc.args); !errors.Is(err, ErrPrinted) {
				t.Fatalf("Parse: %v, want ErrPrinted", err)
			}
			names := testenv.FlagNames(a.app.Model(), tc.cmds...)
			if len(names) < 10 {
				t.Fatalf("flag set too small: %v", names)
			}
			for _, n := range names {
				if !strings.Contains(stdout.String(), "--"+n) && !strings.Contains(stdout.String(), "--[no-]"+n) {
					t.Errorf("help lacks --%s:\n%s", n, stdout.String())
				}
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr: %s", stderr.String())
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var stdout bytes.Buffer
	a := newTestApp(&stdout, io.Discard)
	if _, err := a.app.Parse([]string{"--version"}); !errors.Is(err, ErrPrinted) {
		t.Fatalf("Parse: %v, want ErrPrinted", err)
	}
	if !strings.HasPrefix(stdout.String(), "prog, version "+Version()) || !strings.Contains(stdout.String(), "go version:") {
		t.Errorf("--version printed %q", stdout.String())
	}
}

func TestLoggerFlags(t *testing.T) {
	var stderr bytes.Buffer
	a := newTestApp(io.Discard, &stderr)
	if _, err := a.app.Parse([]string{"--log.level=warn", "--log.format=json"}); err != nil {
		t.Fatal(err)
	}
	log := a.app.Logger()
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	if out := stderr.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("log output %q", out)
	}
	if _, err := newTestApp(io.Discard, io.Discard).app.Parse([]string{"--log.level=loud"}); err == nil || !strings.Contains(err.Error(), "--log.level: ") {
		t.Errorf("--log.level=loud: %v", err)
	}
}

func TestSplitList(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"a,b", "c"}, []string{"a", "b", "c"}},
		{[]string{" a , ,b ,", ""}, []string{"a", "b"}},
	} {
		if got := SplitList(tc.in...); !slices.Equal(got, tc.want) {
			t.Errorf("SplitList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flagFile := write("flag", "from-flag-file\n")
	envFile := write("env", "from-env-file\r\n")
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name          string
		args          []string
		env, envFile  string
		want, wantErr string
	}{
		{name: "unset"},
		{name: "environment", env: "from-env", want: "from-env"},
		{name: "file named by the variable", env: "from-env", envFile: envFile, want: "from-env-file"},
		{name: "flag wins", args: []string{"--secret-file=" + flagFile}, env: "from-env", envFile: envFile, want: "from-flag-file"},
		{name: "flag's file missing", args: []string{"--secret-file=" + missing}, env: "from-env", wantErr: "--secret-file: "},
		{name: "variable's file missing", envFile: missing, wantErr: "TEST_CLI_SECRET_FILE: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TEST_CLI_SECRET", tc.env)
			t.Setenv("TEST_CLI_SECRET_FILE", tc.envFile)
			app := kingpin.New("x", "")
			s := SecretFlag(app, "secret-file", "TEST_CLI_SECRET", "File holding the secret.")
			if _, err := app.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := s.Read()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Read = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestPlatform(t *testing.T) {
	t.Setenv(EnvEnvironmentIDs, "e1, e2,,e3")
	t.Setenv(EnvAPIURL, "https://api.example")
	t.Setenv(EnvAuthURL, "")
	t.Setenv(EnvClientID, "id")
	t.Setenv(EnvClientSecret, "")
	t.Setenv(EnvClientID+"_FILE", "")
	t.Setenv(EnvClientSecret+"_FILE", "")
	app := kingpin.New("x", "")
	p := AddPlatformFlags(app)
	if _, err := app.Parse(nil); err != nil {
		t.Fatal(err)
	}
	p.Resolve()
	if p.AuthURL != "https://api.example" || !slices.Equal(p.EnvironmentIDs, []string{"e1", "e2", "e3"}) {
		t.Errorf("resolved %+v", p)
	}
	if _, _, err := p.Credentials(); err == nil || !strings.Contains(err.Error(), EnvClientSecret) {
		t.Errorf("missing secret: %v", err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app = kingpin.New("x", "")
	p = AddPlatformFlags(app)
	if _, err := app.Parse([]string{"--client-secret-file=" + secret, "--auth.url=https://id.example", "--environment-id=a,b"}); err != nil {
		t.Fatal(err)
	}
	p.Resolve()
	id, s, err := p.Credentials()
	if err != nil || id != "id" || s != "s3cret" || p.AuthURL != "https://id.example" || !slices.Equal(p.EnvironmentIDs, []string{"a", "b"}) {
		t.Errorf("credentials %q %q %v, platform %+v", id, s, err, p)
	}
}
