package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestDockerfileBuildsLikeMake checks the image builds the same commands
// with the same flags and version variables as `make build`, and that its
// runtime stage is non-root and exposes the default ports. (There is no
// Docker engine in CI; this keeps the Dockerfile honest without one.)
func TestDockerfileBuildsLikeMake(t *testing.T) {
	dockerfile := readFile(t, "../../Dockerfile")
	makefile := readFile(t, "../../Makefile")

	// Commands: Makefile CMDS, the Dockerfile's build loop and cmd/ agree.
	makeCmds := strings.Fields(firstMatch(t, makefile, `(?m)^CMDS\s*:?=\s*(.+)$`, "CMDS in Makefile"))
	dockerCmds := strings.Fields(firstMatch(t, dockerfile, `for cmd in ([a-z0-9 -]+); do`, "build loop in Dockerfile"))
	dirs, err := filepath.Glob("../../cmd/*")
	if err != nil {
		t.Fatal(err)
	}
	var cmdDirs []string
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			cmdDirs = append(cmdDirs, filepath.Base(d))
		}
	}
	for _, l := range [][]string{makeCmds, dockerCmds, cmdDirs} {
		sort.Strings(l)
	}
	if !slices.Equal(makeCmds, dockerCmds) || !slices.Equal(makeCmds, cmdDirs) {
		t.Errorf("commands differ: Makefile %v, Dockerfile %v, cmd/ %v", makeCmds, dockerCmds, cmdDirs)
	}

	// Version stamping: the same -X variables (Makefile spells packages via
	// make variables, the Dockerfile via shell variables).
	if got, want := xVars(t, dockerfile, `\$(\w+)`), xVars(t, makefile, `\$\((\w+)\)`); !slices.Equal(got, want) {
		t.Errorf("-X variables differ:\n Dockerfile %v\n Makefile   %v", got, want)
	}
	for _, flag := range []string{"-trimpath", "-s -w", "CGO_ENABLED=0"} {
		if !strings.Contains(makefile, flag) {
			t.Errorf("Makefile build lacks %s", flag)
		}
		if !strings.Contains(dockerfile, flag) {
			t.Errorf("Dockerfile build lacks %s", flag)
		}
	}

	// Go version of the builder = go.mod's go directive (major.minor).
	gomod := readFile(t, "../../go.mod")
	goVer := firstMatch(t, gomod, `(?m)^go (\d+\.\d+)`, "go directive")
	if v := firstMatch(t, dockerfile, `ARG GO_VERSION=(\S+)`, "GO_VERSION"); v != goVer {
		t.Errorf("Dockerfile builds with Go %s, go.mod says %s", v, goVer)
	}

	// Runtime stage: the last FROM, non-root, the default ports.
	stages := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(dockerfile, -1)
	if len(stages) < 2 {
		t.Fatalf("Dockerfile is not multi-stage (%d FROM)", len(stages))
	}
	runtime := dockerfile[stages[len(stages)-1][0]:]
	if !regexp.MustCompile(`(?m)^FROM (gcr\.io/distroless/static\S*|scratch)\b`).MatchString(runtime) {
		t.Errorf("runtime stage is not distroless static or scratch:\n%s", firstLine(runtime))
	}
	user := firstMatch(t, runtime, `(?m)^USER\s+(\S+)`, "USER in the runtime stage")
	if uid := strings.SplitN(user, ":", 2)[0]; uid == "0" || uid == "root" || uid == "" {
		t.Errorf("runtime USER %q is root", user)
	}
	if ports := strings.Fields(firstMatch(t, runtime, `(?m)^EXPOSE\s+(.+)$`, "EXPOSE")); !slices.Equal(ports, []string{"9780", "9781"}) {
		t.Errorf("EXPOSE %v, want 9780 9781 (exporter, receiver)", ports)
	}
	for _, c := range makeCmds {
		if !strings.Contains(runtime, "/out/"+c) {
			t.Errorf("runtime stage does not copy %s", c)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func firstMatch(t *testing.T, s, re, what string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %s (pattern %s)", what, re)
	}
	return strings.TrimSpace(m[1])
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// xVars returns the sorted "package.Var" targets of every -X in s, resolving
// package variables (VPKG and the like) defined in s by pkgRef's syntax.
func xVars(t *testing.T, s, pkgRef string) []string {
	t.Helper()
	defs := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)\s*:?=\s*(github\.com/[^\s;\\]+)`).FindAllStringSubmatch(s, -1) {
		defs[m[1]] = m[2]
	}
	var out []string
	for _, m := range regexp.MustCompile(`-X\s+(\S+?)\.(\w+)=`).FindAllStringSubmatch(s, -1) {
		pkg := m[1]
		if r := regexp.MustCompile(`^` + pkgRef + `$`).FindStringSubmatch(pkg); r != nil {
			p, ok := defs[r[1]]
			if !ok {
				t.Fatalf("-X uses undefined package variable %s", pkg)
			}
			pkg = p
		}
		out = append(out, pkg+"."+m[2])
	}
	if len(out) == 0 {
		t.Fatal("no -X flags found")
	}
	sort.Strings(out)
	return slices.Compact(out)
}
