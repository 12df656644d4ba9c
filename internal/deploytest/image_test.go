package deploytest

import (
	"archive/tar"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/edgepipe/edgepipe/internal/ociimage"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// exporterShutdownTimeout is the exporter's --shutdown-timeout default,
// which the chart keeps: SIGTERM must stop it within that.
const exporterShutdownTimeout = 10 * time.Second

// builtImage is the image `make image` built and loaded into a podman.
type builtImage struct {
	pm       *testenv.Podman
	ref      string // e.g. ghcr.io/edgepipe/edgepipe:0.1.0
	version  string // `make version`
	revision string // the commit
}

// TestImage builds the image with `make image` (offline, into a podman of
// its own), checks it against the Dockerfile, and runs both programs in it
// the way the Helm chart runs them: the chart's command, arguments,
// security context (read-only root file system, no capabilities, no
// privilege escalation), volumes and probes, on the image's own user. The
// receiver's spool on a volume must be written by that user and survive
// the container: what the first receiver accepted reaches ClickHouse from
// a second one. SIGTERM must stop each within its shutdown timeout.
func TestImage(t *testing.T) {
	img := makeImage(t)
	// The chart's default tag is its appVersion, which is `make image`'s
	// tag at a release (TestChartImageIsMakeImage); between releases the
	// tag is set as a user would.
	_, tag, _ := strings.Cut(img.ref, ":")
	m := render(t, valuesFile(t, "image: {tag: \""+tag+"\"}"))
	pods := map[string]podSpec{}
	for key, w := range m.workloads(t) {
		spec := w.Spec.Template.Spec
		if len(spec.Containers) != 1 || spec.TerminationGracePeriodSeconds == nil {
			t.Fatalf("%s: %d containers, grace period %v; want 1 and one", key, len(spec.Containers), spec.TerminationGracePeriodSeconds)
		}
		pods[spec.Containers[0].Name] = spec
	}
	for _, name := range []string{"exporter", "receiver"} {
		if c := pods[name].Containers; len(c) == 0 || c[0].Image != img.ref {
			t.Fatalf("the chart's %s runs image %v, `make image` built %s", name, c, img.ref)
		}
	}

	t.Run("layout", func(t *testing.T) { checkImageLayout(t, img) })
	t.Run("version", func(t *testing.T) {
		for _, c := range ociimage.Commands {
			out := img.pm.Run(t, "run", "--rm", "--network=none", "--entrypoint", "/usr/local/bin/"+c, img.ref, "--version")
			if want := fmt.Sprintf("%s, version %s ", c, img.version); !strings.HasPrefix(out, want) || !strings.Contains(out, "revision: "+img.revision) {
				t.Errorf("%s --version in the image:\n%s\nwant %q… and revision %s", c, out, want, img.revision)
			}
		}
	})
	t.Run("exporter", func(t *testing.T) {
		t.Parallel()
		runExporter(t, img, pods["exporter"])
	})
	t.Run("receiver", func(t *testing.T) {
		t.Parallel()
		runReceiver(t, img, pods["receiver"])
	})
}

// makeImage runs `make image` into a temporary bin directory with a podman
// of its own, and returns what it loaded there.
func makeImage(t *testing.T) builtImage {
	t.Helper()
	pm := testenv.NewPodman(t)
	mk := testenv.Binary(t, "make")
	makeOut := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(mk, append([]string{"--no-print-directory", "-C", "../.."}, args...)...)
		cmd.Env = append(os.Environ(), pm.Env()...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	img := builtImage{pm: pm, ref: makeOut("-s", "image-ref"), version: makeOut("-s", "version")}
	rev, err := exec.Command(testenv.Binary(t, "git"), "-C", "../..", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	img.revision = strings.TrimSpace(string(rev))
	start := time.Now()
	out := makeOut("image", "BIN="+t.TempDir(), "PODMAN="+pm.Bin())
	t.Logf("make image (%s):\n%s", time.Since(start).Round(time.Second), out)
	if !strings.Contains(out, "Loaded image: "+img.ref) {
		t.Fatalf("make image did not load %s into podman:\n%s", img.ref, out)
	}
	t.Logf("podman images:\n%s", pm.Run(t, "images"))
	return img
}

// checkImageLayout compares the image's configuration and file system with
// the Dockerfile's (parseDockerfileImage), and checks the contents the
// programs depend on: the users, a CA bundle Go can use, zone data Go can
// load.
func checkImageLayout(t *testing.T, img builtImage) {
	want := parseDockerfileImage(t)
	for k, v := range want.config.Labels {
		v = strings.ReplaceAll(v, "${VERSION}", img.version)
		want.config.Labels[k] = strings.ReplaceAll(v, "${REVISION}", img.revision)
	}
	var inspects []struct {
		Config       v1.Config `json:"Config"`
		Os           string    `json:"Os"`
		Architecture string    `json:"Architecture"`
		Size         int64     `json:"Size"`
	}
	if err := json.Unmarshal([]byte(img.pm.Run(t, "image", "inspect", img.ref)), &inspects); err != nil || len(inspects) != 1 {
		t.Fatalf("podman image inspect: %v, %d images", err, len(inspects))
	}
	inspect := inspects[0]
	checkConfig(t, "the image's configuration", inspect.Config, want.config)
	if inspect.Os != "linux" || inspect.Architecture != runtime.GOARCH {
		t.Errorf("image platform %s/%s, want linux/%s", inspect.Os, inspect.Architecture, runtime.GOARCH)
	}
	t.Logf("image size (podman image inspect): %.1f MiB", float64(inspect.Size)/(1<<20))

	files := exportFiles(t, img, map[string]bool{"/etc/passwd": true, "/etc/group": true, ociimage.CACertsFile: true, "/usr/share/zoneinfo/Europe/Berlin": true})
	for p, w := range want.paths {
		got, ok := files[p]
		if !ok {
			t.Errorf("%s is not in the image", p)
			continue
		}
		if got.mode != w.mode || got.uid != w.uid || got.gid != w.gid {
			t.Errorf("%s: mode %s owner %d:%d, the Dockerfile's %s %d:%d", p, got.mode, got.uid, got.gid, w.mode, w.uid, w.gid)
		}
	}
	if !strings.Contains(string(files["/etc/passwd"].data), "nonroot:x:65532:65532:nonroot:/home/nonroot:") ||
		!strings.Contains(string(files["/etc/group"].data), "nonroot:x:65532:") {
		t.Errorf("/etc/passwd, /etc/group lack the nonroot user and group:\n%s\n%s", files["/etc/passwd"].data, files["/etc/group"].data)
	}
	checkCABundle(t, files[ociimage.CACertsFile].data)
	if _, err := time.LoadLocationFromTZData("Europe/Berlin", files["/usr/share/zoneinfo/Europe/Berlin"].data); err != nil {
		t.Errorf("zone data for Europe/Berlin: %v", err)
	}
}

// exportedFile is a path of a container's file system.
type exportedFile struct {
	mode     fs.FileMode
	uid, gid int
	data     []byte // for the paths asked for
}

// exportFiles creates a container of the image and reads its file system
// (podman export), keeping the content of the files in read.
func exportFiles(t *testing.T, img builtImage, read map[string]bool) map[string]exportedFile {
	t.Helper()
	name := "layout-" + strconv.Itoa(os.Getpid())
	img.pm.Run(t, "create", "--name", name, img.ref)
	defer img.pm.Run(t, "rm", name)
	archive := filepath.Join(t.TempDir(), "fs.tar")
	img.pm.Run(t, "export", "--output", archive, name)
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]exportedFile{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.Trim(h.Name, "/")
		e := exportedFile{mode: h.FileInfo().Mode(), uid: h.Uid, gid: h.Gid}
		if read[p] {
			if e.data, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
		files[p] = e
	}
	return files
}

// checkCABundle checks the bundle holds the Mozilla roots of Debian's
// ca-certificates and nothing of the build machine's own.
func checkCABundle(t *testing.T, bundle []byte) {
	t.Helper()
	n := 0
	for rest := bundle; ; n++ {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("CA bundle certificate %d: %v", n, err)
		}
	}
	mozilla, _ := filepath.Glob(filepath.Join(ociimage.DefaultCACertsDir, "*.crt"))
	if n < 100 || n != len(mozilla) {
		t.Errorf("CA bundle has %d certificates, %s %d", n, ociimage.DefaultCACertsDir, len(mozilla))
	}
}

// chartContainer is one program's container as the chart runs it,
// translated to podman.
type chartContainer struct {
	runArgs []string      // podman run's options
	args    []string      // the program's
	addr    string        // 127.0.0.1:port, in place of the chart's listen address
	probes  []string      // the chart's probe paths
	grace   time.Duration // the pod's terminationGracePeriodSeconds
}

// podmanContainer translates the chart's pod spec: the command becomes the
// entrypoint, the listen address a free loopback port, the security
// context podman's options (its user must be the image's, which runs
// unchanged), the emptyDir volumes tmpfs mounts, the persistent volumes
// named volumes, and the environment's values (not those from the downward
// API, such as GOMEMLIMIT from the memory limit). Any other kind of volume
// fails the test: it would need modelling here.
func podmanContainer(t *testing.T, pod podSpec, volumePrefix string) chartContainer {
	t.Helper()
	c := pod.Containers[0]
	cc := chartContainer{addr: testenv.FreeAddr(t), grace: time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second}
	entrypoint, err := json.Marshal(c.Command)
	if err != nil {
		t.Fatal(err)
	}
	cc.runArgs = append(cc.runArgs, "--entrypoint", string(entrypoint))
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--web.listen-address=") {
			a = "--web.listen-address=" + cc.addr
		}
		cc.args = append(cc.args, a)
	}
	cc.runArgs = append(cc.runArgs, securityOptions(t, pod.SecurityContext, c.SecurityContext)...)
	emptyDirs := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		} else if v.PersistentVolumeClaim == nil {
			t.Fatalf("%s: volume %s is not modelled by the image test", c.Name, v.Name)
		}
	}
	for _, vm := range c.VolumeMounts {
		if emptyDirs[vm.Name] {
			cc.runArgs = append(cc.runArgs, "--tmpfs", vm.MountPath+":rw,mode=1777")
			continue
		}
		cc.runArgs = append(cc.runArgs, "--volume", volumePrefix+vm.Name+":"+vm.MountPath)
	}
	for _, e := range c.Env {
		if e.Value != nil {
			cc.runArgs = append(cc.runArgs, "--env", e.Name+"="+*e.Value)
		}
	}
	for _, p := range []*probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("%s: the chart has no HTTP liveness or readiness probe", c.Name)
		}
		cc.probes = append(cc.probes, p.HTTPGet.Path)
	}
	return cc
}

// securityOptions returns podman's options for the chart's security
// contexts (the container's over the pod's). The user is left to the image:
// the chart's must be the same.
func securityOptions(t *testing.T, pod, ctr securityContext) []string {
	t.Helper()
	id := func(c, p *int64) string {
		if c == nil {
			c = p
		}
		if c == nil {
			return "unset"
		}
		return strconv.FormatInt(*c, 10)
	}
	if u, g := id(ctr.RunAsUser, pod.RunAsUser), id(ctr.RunAsGroup, pod.RunAsGroup); u+":"+g != ociimage.User {
		t.Errorf("the chart's runAsUser:runAsGroup %s:%s is not the image's user %s", u, g, ociimage.User)
	}
	var opts []string
	if ctr.ReadOnlyRootFilesystem == nil || !*ctr.ReadOnlyRootFilesystem {
		t.Error("the chart's container does not set readOnlyRootFilesystem")
	}
	opts = append(opts, "--read-only", "--read-only-tmpfs=false")
	for _, c := range ctr.Capabilities.Drop {
		opts = append(opts, "--cap-drop="+strings.ToLower(c))
	}
	if len(ctr.Capabilities.Add) > 0 || (ctr.Privileged != nil && *ctr.Privileged) {
		t.Errorf("the chart adds capabilities %v or privileges", ctr.Capabilities.Add)
	}
	if ctr.AllowPrivilegeEscalation != nil && !*ctr.AllowPrivilegeEscalation {
		opts = append(opts, "--security-opt=no-new-privileges")
	}
	return opts
}

// start runs the container and waits until the chart's probes answer 200,
// the program runs as the image's user and its landing page names it.
func (cc chartContainer) start(t *testing.T, img builtImage, name, landing string, extraArgs ...string) *testenv.Container {
	t.Helper()
	c := img.pm.StartContainer(t, name, cc.runArgs, img.ref, append(append([]string(nil), cc.args...), extraArgs...)...)
	for _, p := range cc.probes {
		waitHTTP(t, c, "http://"+cc.addr+p, "")
	}
	waitHTTP(t, c, "http://"+cc.addr+"/", landing)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"Uid", "Gid"} {
		m := regexp.MustCompile(`(?m)^` + field + `:\s+(.*)$`).FindSubmatch(status)
		if m == nil || strings.Join(strings.Fields(string(m[1])), " ") != "65532 65532 65532 65532" {
			t.Errorf("%s runs with %s %q, want 65532 (real, effective, saved, file system)", name, field, m)
		}
	}
	return c
}

// waitHTTP waits up to a minute for url to answer 200 with a body holding
// want.
func waitHTTP(t *testing.T, c *testenv.Container, url, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for time.Now().Before(deadline) {
		body, status, err := get(url)
		if err == nil && status == http.StatusOK && strings.Contains(body, want) {
			return
		}
		last = fmt.Sprintf("%d %v %.200s", status, err, body)
		if !c.Running() {
			t.Fatalf("container %s ended (exit code %d) before %s answered: %s", c.Name, c.ExitCode(), url, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s in container %s: %s after a minute, want 200 with %q", url, c.Name, last, want)
}

func get(url string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

// stopWithin sends SIGTERM as Kubernetes does (SIGKILL after the chart's
// grace period) and checks the program ended by itself, cleanly, within
// limit.
func stopWithin(t *testing.T, c *testenv.Container, grace, limit time.Duration, stoppedLog string) {
	t.Helper()
	code, took := c.Stop(grace)
	t.Logf("%s stopped by SIGTERM in %s, exit code %d", c.Name, took.Round(10*time.Millisecond), code)
	if code != 0 || took > limit {
		t.Errorf("%s: exit code %d after %s; want 0 within %s (137: killed after the %s grace period)", c.Name, code, took, limit, grace)
	}
	if !strings.Contains(c.Logs(), stoppedLog) {
		t.Errorf("%s did not log %q", c.Name, stoppedLog)
	}
}

// scrape returns the metric families of a program's /metrics.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mfs, err := testenv.ScrapeMetrics(ctx, "http://"+addr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	for name := range mfs {
		sums[name] = testenv.SampleSum(mfs, name, nil)
	}
	return sums
}

// runExporter runs the exporter as the chart does and checks it publishes
// the simulated platform's cdn_ series, keeps its state on its volume, and
// stops on SIGTERM within its shutdown timeout.
func runExporter(t *testing.T, img builtImage, pod podSpec) {
	cc := podmanContainer(t, pod, "exporter-")
	c := cc.start(t, img, "exporter", "edgepipe exporter")
	var series int
	deadline := time.Now().Add(time.Minute)
	for series == 0 && time.Now().Before(deadline) {
		for name := range scrape(t, cc.addr) {
			if strings.HasPrefix(name, "cdn_") {
				series++
			}
		}
		if series == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if series == 0 {
		t.Fatal("no cdn_ metric within a minute")
	}
	t.Logf("exporter in the image: %d cdn_ metric families", series)
	if v := scrape(t, cc.addr)["edgepipe_exporter_build_info"]; v != 1 {
		t.Errorf("edgepipe_exporter_build_info %v, want 1", v)
	}
	stopWithin(t, c, cc.grace, exporterShutdownTimeout, "exporter stopped")
	checkVolumeOwner(t, img, "exporter-state")
}

// runReceiver runs the receiver as the chart does, with a ClickHouse sink
// that is down, so that the simulated platform's batches stay in the spool;
// stops it; and starts a second receiver on the same spool volume that
// takes no new batches (--no-register) and delivers the first one's to a
// real ClickHouse.
func runReceiver(t *testing.T, img builtImage, pod podSpec) {
	cc := podmanContainer(t, pod, "receiver-")
	down := "clickhouse://" + testenv.FreeAddr(t) + "/cdn"
	first := cc.start(t, img, "receiver", "edgepipe rtld-receiver", "--clickhouse.dsn="+down)
	var accepted, spooled float64
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		m := scrape(t, cc.addr)
		accepted, spooled = m["edgepipe_rtld_records_received_total"], m["edgepipe_rtld_spool_entries"]
		if accepted > 0 && spooled > 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if accepted == 0 || spooled == 0 {
		t.Fatalf("receiver: %v records accepted, %v batches spooled within a minute", accepted, spooled)
	}
	stopWithin(t, first, cc.grace, cc.grace, "rtld receiver stopped")
	checkVolumeOwner(t, img, "receiver-spool")

	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	second := cc.start(t, img, "receiver-restarted", "edgepipe rtld-receiver", "--no-register", "--clickhouse.dsn="+ch.DSN(db))
	var m map[string]float64
	deadline = time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if m = scrape(t, cc.addr); m["edgepipe_rtld_spool_entries"] == 0 && m["edgepipe_rtld_sink_delivered_records_total"] > 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	delivered := m["edgepipe_rtld_sink_delivered_records_total"]
	if m["edgepipe_rtld_spool_entries"] != 0 || m["edgepipe_rtld_records_received_total"] != 0 || delivered < accepted {
		t.Fatalf("restarted receiver: %v batches still spooled, %v records received, %v delivered; want 0, 0 and the %v or more the first one accepted",
			m["edgepipe_rtld_spool_entries"], m["edgepipe_rtld_records_received_total"], delivered, accepted)
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); float64(n) != delivered {
		t.Errorf("ClickHouse holds %d records, the restarted receiver delivered %v", n, delivered)
	}
	t.Logf("receiver: %v records accepted before the restart (at the last scrape), %v delivered from the spool after it", accepted, delivered)
	stopWithin(t, second, cc.grace, cc.grace, "rtld receiver stopped")
}

// checkVolumeOwner checks what a program wrote on the named volume belongs
// to the image's user.
func checkVolumeOwner(t *testing.T, img builtImage, volume string) {
	t.Helper()
	dir := img.pm.VolumePath(t, volume)
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner", p)
		}
		if st.Uid != ociimage.UID || st.Gid != ociimage.GID {
			t.Errorf("volume %s: %s belongs to %d:%d, want %d:%d", volume, p, st.Uid, st.Gid, ociimage.UID, ociimage.GID)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Errorf("volume %s holds nothing the program wrote", volume)
	}
}
