package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// releaseVersion returns the VERSION file's version (without a "v").
func releaseVersion(t *testing.T) string {
	t.Helper()
	v := readFile(t, "../../VERSION")
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+\n$`).MatchString(v) {
		t.Fatalf("VERSION %q is not one semantic version (MAJOR.MINOR.PATCH) and a newline", v)
	}
	return strings.TrimSpace(v)
}

// TestVersionStamp checks the version is written down once: the VERSION
// file is the chart's appVersion and the changelog's newest release, and
// both `make build` and the Dockerfile stamp v<VERSION> when no git tag
// says otherwise. The Makefile runs in a scratch git repository: without a
// tag, with a tag, and with a change on top of the tag.
func TestVersionStamp(t *testing.T) {
	version := releaseVersion(t)

	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, chartDir+"/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != version {
		t.Errorf("Chart.yaml appVersion %q, VERSION %q", chart.AppVersion, version)
	}
	changelog := readFile(t, "../../CHANGELOG.md")
	if got := firstMatch(t, changelog, `(?m)^## \[([0-9][^\]]*)\]`, "a release in CHANGELOG.md"); got != version {
		t.Errorf("newest release in CHANGELOG.md is %s, VERSION %s", got, version)
	}
	if !strings.Contains(changelog, "## [Unreleased]") {
		t.Error("CHANGELOG.md has no Unreleased section")
	}

	// make version in a scratch repository holding the Makefile and VERSION.
	git := testenv.Binary(t, "git")
	mk := testenv.Binary(t, "make")
	dir := t.TempDir()
	for _, f := range []string{"Makefile", "VERSION"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(readFile(t, "../../"+f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// Isolated from the user's git configuration.
	gitEnv := []string{"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CEILING_DIRECTORIES=" + filepath.Dir(dir)}
	makeVersion := func() string { return run(gitEnv, mk, "-s", "--no-print-directory", "version") }

	if got := makeVersion(); got != "v"+version {
		t.Errorf("make version outside a git repository: %q, want v%s", got, version)
	}
	run(gitEnv, git, "init", "-q")
	run(gitEnv, git, "add", ".")
	run(gitEnv, git, "commit", "-qm", "scratch")
	if got := makeVersion(); got != "v"+version {
		t.Errorf("make version without a tag: %q, want v%s", got, version)
	}
	run(gitEnv, git, "tag", "v9.8.7")
	if got := makeVersion(); got != "v9.8.7" {
		t.Errorf("make version at tag v9.8.7: %q", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("9.9.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := makeVersion(); got != "v9.8.7-dirty" {
		t.Errorf("make version with a change on top of tag v9.8.7: %q, want v9.8.7-dirty", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte(version+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The Dockerfile's build stage: VERSION has no default of its own, and
	// its fallback, run by a shell in the build context, gives make's.
	dockerfile := readFile(t, "../../Dockerfile")
	build := dockerfile[:regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(dockerfile, -1)[1][0]]
	if arg := firstMatch(t, build, `(?m)^ARG VERSION(=.*)?$`, "ARG VERSION in the build stage"); arg != "" && arg != "=" {
		t.Errorf("build stage has ARG VERSION%s: a default other than empty hides the VERSION file", arg)
	}
	fallback := firstMatch(t, build, `(?m)^\s*(VERSION=\$\{VERSION:-[^;]*\});`, "the VERSION fallback in the build stage")
	for _, tc := range []struct{ arg, want string }{{"", "v" + version}, {"v2.0.0", "v2.0.0"}} {
		got := run([]string{"VERSION=" + tc.arg}, "sh", "-c", fallback+`; echo "$VERSION"`)
		if got != tc.want {
			t.Errorf("Dockerfile with --build-arg VERSION=%q stamps %q, want %q (%s)", tc.arg, got, tc.want, fallback)
		}
	}
	if strings.Contains(readFile(t, "../../.dockerignore"), "VERSION") {
		t.Error(".dockerignore leaves VERSION out of the build context")
	}
}
