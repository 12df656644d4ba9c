package deploytest

import (
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/edgepipe/edgepipe/internal/ociimage"
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

// dockerInstruction is one instruction of a Dockerfile: its keyword in
// upper case and its arguments, continued lines joined.
type dockerInstruction struct {
	cmd, args string
}

// parseDockerfile returns the instructions of a Dockerfile (comments,
// parser directives and blank lines left out).
func parseDockerfile(text string) []dockerInstruction {
	var out []dockerInstruction
	var cur strings.Builder
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, dockerInstruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// distrolessStaticNonroot is what gcr.io/distroless/static-debian12:nonroot
// gives an image built on it, from distroless's static/static.bzl and
// common/BUILD.bazel: its configuration, and the paths edgepipe relies on
// with their owners and modes.
var distrolessStaticNonroot = struct {
	env   []string
	paths map[string]imagePath
}{
	env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
	paths: map[string]imagePath{
		"/etc/passwd":                        {mode: 0o644},
		"/etc/group":                         {mode: 0o644},
		"/etc/nsswitch.conf":                 {mode: 0o644},
		"/etc/ssl/certs/ca-certificates.crt": {mode: 0o644},
		"/usr/share/zoneinfo":                {mode: fs.ModeDir | 0o755},
		"/usr/share/zoneinfo/Etc/UTC":        {mode: 0o644},
		"/tmp":                               {mode: fs.ModeDir | fs.ModeSticky | 0o777},
		"/root":                              {mode: fs.ModeDir | 0o700},
		"/home/nonroot":                      {mode: fs.ModeDir | 0o700, uid: 65532, gid: 65532},
	},
}

// imagePath is a path's type, permissions and owner in an image.
type imagePath struct {
	mode     fs.FileMode
	uid, gid int
}

// dockerfileImage is what the Dockerfile's runtime stage builds: the
// configuration (labels with the build arguments' names, e.g.
// "${VERSION}") and the paths it promises with their modes and owners.
type dockerfileImage struct {
	config v1.Config
	paths  map[string]imagePath
}

// parseDockerfileImage reads the runtime stage of the Dockerfile: it must
// build on distroless static nonroot, and its COPY instructions put the
// binaries and the directories the build stage made (mkdir, chmod) into
// the image.
func parseDockerfileImage(t *testing.T) dockerfileImage {
	t.Helper()
	ins := parseDockerfile(readFile(t, "../../Dockerfile"))
	last := -1
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	if last < 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	if base := ins[last].args; base != "gcr.io/distroless/static-debian12:nonroot" {
		t.Fatalf("runtime stage FROM %s: the comparison with `make image` models gcr.io/distroless/static-debian12:nonroot", base)
	}
	img := dockerfileImage{
		config: v1.Config{Env: distrolessStaticNonroot.env, ExposedPorts: map[string]struct{}{}, Labels: map[string]string{}},
		paths:  maps.Clone(distrolessStaticNonroot.paths),
	}
	buildDirs := dockerBuildDirs(t, ins[:last])
	for _, in := range ins[last+1:] {
		img.apply(t, in, buildDirs)
	}
	return img
}

// dockerBuildDirs returns the directories the build stage creates under
// /out with `mkdir -p`, with the mode a `chmod` gives them (else 0755).
func dockerBuildDirs(t *testing.T, build []dockerInstruction) map[string]fs.FileMode {
	t.Helper()
	dirs := map[string]fs.FileMode{}
	for _, in := range build {
		if in.cmd != "RUN" {
			continue
		}
		for _, m := range regexp.MustCompile(`mkdir -p ((?:/out/\S+ ?)+)`).FindAllStringSubmatch(in.args, -1) {
			for d := range strings.FieldsSeq(strings.TrimRight(m[1], ";")) {
				dirs[strings.TrimRight(d, ";")] = 0o755
			}
		}
		for _, m := range regexp.MustCompile(`chmod (0[0-7]{3}) ((?:/out/\S+ ?)+)`).FindAllStringSubmatch(in.args, -1) {
			mode, err := strconv.ParseUint(m[1], 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			for d := range strings.FieldsSeq(m[2]) {
				dirs[strings.TrimRight(d, ";")] = fs.FileMode(mode)
			}
		}
	}
	return dirs
}

// apply records what one runtime-stage instruction does to the image.
func (img *dockerfileImage) apply(t *testing.T, in dockerInstruction, buildDirs map[string]fs.FileMode) {
	t.Helper()
	c := &img.config
	switch in.cmd {
	case "ARG":
	case "USER":
		c.User = in.args
	case "WORKDIR":
		c.WorkingDir = in.args
	case "EXPOSE":
		for p := range strings.FieldsSeq(in.args) {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			c.ExposedPorts[p] = struct{}{}
		}
	case "ENTRYPOINT":
		c.Entrypoint = jsonArgs(t, in)
	case "CMD":
		c.Cmd = jsonArgs(t, in)
	case "LABEL":
		for _, m := range regexp.MustCompile(`(\S+)="([^"]*)"`).FindAllStringSubmatch(in.args, -1) {
			c.Labels[m[1]] = m[2]
		}
	case "COPY":
		img.copy(t, in, buildDirs)
	default:
		t.Fatalf("runtime stage instruction %s is not modelled by the comparison with `make image`: %s %s", in.cmd, in.cmd, in.args)
	}
}

// copy records a COPY --from=build: files (the binaries, 0755 as go build
// writes them) into a directory, or a directory's content.
func (img *dockerfileImage) copy(t *testing.T, in dockerInstruction, buildDirs map[string]fs.FileMode) {
	t.Helper()
	f := strings.Fields(in.args)
	uid, gid := 0, 0
	var srcs []string
	for _, a := range f[:len(f)-1] {
		switch {
		case a == "--from=build":
		case strings.HasPrefix(a, "--chown="):
			u, g, _ := strings.Cut(strings.TrimPrefix(a, "--chown="), ":")
			var err1, err2 error
			uid, err1 = strconv.Atoi(u)
			gid, err2 = strconv.Atoi(g)
			if err1 != nil || err2 != nil {
				t.Fatalf("COPY %s: --chown by number expected", in.args)
			}
		case strings.HasPrefix(a, "--"):
			t.Fatalf("COPY option %s is not modelled", a)
		default:
			srcs = append(srcs, a)
		}
	}
	if !strings.HasPrefix(in.args, "--from=build ") {
		t.Fatalf("COPY %s: only COPY --from=build is modelled", in.args)
	}
	dst := f[len(f)-1]
	for _, src := range srcs {
		if dir, ok := strings.CutSuffix(src, "/"); ok { // a directory's content
			for d, mode := range buildDirs {
				if rel, ok := strings.CutPrefix(d, dir+"/"); ok {
					img.paths[path.Join(dst, rel)] = imagePath{mode: fs.ModeDir | mode, uid: uid, gid: gid}
				}
			}
			continue
		}
		img.paths[path.Join(dst, path.Base(src))] = imagePath{mode: 0o755, uid: uid, gid: gid}
	}
}

func jsonArgs(t *testing.T, in dockerInstruction) []string {
	t.Helper()
	var args []string
	if err := json.Unmarshal([]byte(in.args), &args); err != nil {
		t.Fatalf("%s %s: not the JSON (exec) form: %v", in.cmd, in.args, err)
	}
	return args
}

// TestDockerfileMatchesImageLayout checks the Dockerfile and `make image`
// (internal/ociimage) describe one image: the same user, working
// directory, entrypoint, arguments, ports, environment and labels (the
// version and revision from the same build variables), and every path the
// Dockerfile puts into the image or takes from distroless is where
// ociimage puts it, with the same owner. The image `make image` builds is
// compared with the same model in TestImage.
func TestDockerfileMatchesImageLayout(t *testing.T) {
	want := parseDockerfileImage(t)
	got := ociimage.ImageConfig("${VERSION}", "${REVISION}")
	checkConfig(t, "make image's configuration", got, want.config)
	for _, c := range ociimage.Commands {
		p := path.Join(ociimage.BinDir, c)
		if _, ok := want.paths[p]; !ok {
			t.Errorf("the Dockerfile does not put %s into the image", p)
		}
	}
	for _, p := range []string{ociimage.HomeDir, ociimage.SpoolDir, ociimage.StateDir} {
		if got := want.paths[p]; got.uid != ociimage.UID || got.gid != ociimage.GID || !got.mode.IsDir() {
			t.Errorf("the Dockerfile's %s: %+v, want a directory of %d:%d", p, got, ociimage.UID, ociimage.GID)
		}
	}
	for _, p := range []string{ociimage.CACertsFile, ociimage.ZoneInfoDir} {
		if _, ok := want.paths[p]; !ok {
			t.Errorf("%s is not where distroless has it", p)
		}
	}
}

// checkConfig compares an image configuration with the Dockerfile's.
func checkConfig(t *testing.T, what string, got, want v1.Config) {
	t.Helper()
	g, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Errorf("%s:\n%s\nthe Dockerfile's:\n%s", what, g, w)
	}
}
