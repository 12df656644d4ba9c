package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Podman runs Debian's podman (with runc) as root without a daemon, with its
// own configuration, image storage, volumes, locks and runtime state in a
// temporary directory: tests leave nothing in the machine's podman, and
// several test binaries can use podman at once.
//
// Its configuration is what this kind of machine needs: runtime runc with
// lowered ulimits (the machine refuses podman's defaults), cgroupfs (no
// systemd), file locks and events in the temporary directory, and the vfs
// storage driver, which mounts nothing on the host, so a killed test leaves
// no mount behind. Run containers with --network=host: it needs no network
// plugin, and a program listening on 127.0.0.1 in the container is
// reachable from the test on the same address.
type Podman struct {
	t   testing.TB
	bin string
	dir string
	env []string
}

// containersConf is podman's containers.conf(5); %[1]s is the directory.
const containersConf = `[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "%[1]s/events.log"
lock_type = "file"
tmp_dir = "%[1]s/tmp"
image_copy_tmp_dir = "storage"

[network]
network_config_dir = "%[1]s/networks"
`

// storageConf is containers-storage.conf(5); %[1]s is the directory.
const storageConf = `[storage]
driver = "vfs"
graphroot = "%[1]s/storage"
runroot = "%[1]s/run"
`

// NewPodman returns a podman whose state lives in its own temporary
// directory, removed (with every container, image and volume) when the
// test ends. A missing podman or runc skips the test, or fails it when
// CI=true.
func NewPodman(t testing.TB) *Podman {
	t.Helper()
	p := &Podman{t: t, bin: Binary(t, "podman")}
	Binary(t, "runc")
	// Not t.TempDir: the storage holds the image's files with their owners
	// and modes, which podman itself must remove (see close).
	dir, err := os.MkdirTemp("", "edgepipe-podman-")
	if err != nil {
		t.Fatal(err)
	}
	p.dir = dir
	confs := map[string]string{
		"containers.conf": fmt.Sprintf(containersConf, dir),
		"storage.conf":    fmt.Sprintf(storageConf, dir),
		// Short names resolve to nothing: nothing is ever pulled.
		"registries.conf": "unqualified-search-registries = []\n",
	}
	for name, conf := range confs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.env = []string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
		// `podman load` keeps its temporary copy in the storage
		// (image_copy_tmp_dir), not in /var/tmp; this is for anything else.
		"TMPDIR=" + dir,
	}
	t.Cleanup(p.close)
	if _, err := p.Try("info", "--format", "{{.Host.OCIRuntime.Name}}"); err != nil {
		t.Fatalf("podman does not work here: %v", err)
	}
	return p
}

// close removes every container, image and volume and then the directory.
func (p *Podman) close() {
	if _, err := p.Try("system", "reset", "--force"); err != nil {
		p.t.Errorf("podman system reset: %v", err)
	}
	if err := os.RemoveAll(p.dir); err != nil {
		p.t.Errorf("remove podman's directory: %v", err)
	}
}

// Bin returns the podman executable's path.
func (p *Podman) Bin() string { return p.bin }

// Env returns the environment variables ("K=V") that point podman at this
// instance's configuration, for a program that runs podman itself (such
// as `make image`).
func (p *Podman) Env() []string { return append([]string(nil), p.env...) }

// Try runs podman with args (at most two minutes) and returns its standard
// output without the final newline; the error includes its standard error.
func (p *Podman) Try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = append(os.Environ(), p.env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// Run is Try failing t on an error.
func (p *Podman) Run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := p.Try(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Container is a container started by StartContainer.
type Container struct {
	t    testing.TB
	p    *Podman
	Name string
}

// maxContainerRun bounds every container's life: conmon keeps a container
// running when the test binary dies (a -timeout abort skips t.Cleanup), and
// then it stops by itself.
const maxContainerRun = 10 * time.Minute

// StartContainer runs image detached as the container name, on the host's
// network, with runArgs (podman run's options, before the image) and args
// (the entrypoint's arguments). The container is removed when the test
// ends, its log shown if the test failed.
func (p *Podman) StartContainer(t testing.TB, name string, runArgs []string, image string, args ...string) *Container {
	t.Helper()
	c := &Container{t: t, p: p, Name: name}
	run := append([]string{"run", "--detach", "--name", name, "--network=host",
		"--timeout", strconv.Itoa(int(maxContainerRun.Seconds()))}, runArgs...)
	run = append(append(run, image), args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("container %s log (tail):\n%s", name, tail(c.Logs(), 6000))
		}
		if _, err := p.Try("rm", "--force", "--time", "0", name); err != nil {
			t.Errorf("remove container %s: %v", name, err)
		}
	})
	if _, err := p.Try(run...); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs())
	}
	return c
}

// Logs returns what the container wrote so far, stdout and stderr.
func (c *Container) Logs() string {
	cmd := exec.Command(c.p.bin, "logs", c.Name)
	cmd.Env = append(os.Environ(), c.p.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s(podman logs: %v)", out, err)
	}
	return string(out)
}

// Running reports whether the container's main process runs.
func (c *Container) Running() bool {
	c.t.Helper()
	return c.p.Run(c.t, "inspect", "--format", "{{.State.Running}}", c.Name) == "true"
}

// Pid returns the host's process ID of the container's main process.
func (c *Container) Pid() int {
	c.t.Helper()
	out := c.p.Run(c.t, "inspect", "--format", "{{.State.Pid}}", c.Name)
	pid, err := strconv.Atoi(out)
	if err != nil || pid <= 0 {
		c.t.Fatalf("container %s is not running (pid %q)", c.Name, out)
	}
	return pid
}

// Stop stops the container as Kubernetes does: SIGTERM, then SIGKILL after
// grace. It returns the main process's exit code (137 when it had to be
// killed) and how long stopping took.
func (c *Container) Stop(grace time.Duration) (exitCode int, took time.Duration) {
	c.t.Helper()
	start := time.Now()
	c.p.Run(c.t, "stop", "--time", strconv.Itoa(int(grace.Round(time.Second).Seconds())), c.Name)
	took = time.Since(start)
	return c.ExitCode(), took
}

// ExitCode returns the exit code of the container's last run.
func (c *Container) ExitCode() int {
	c.t.Helper()
	out := c.p.Run(c.t, "inspect", "--format", "{{.State.ExitCode}}", c.Name)
	code, err := strconv.Atoi(out)
	if err != nil {
		c.t.Fatalf("container %s: exit code %q", c.Name, out)
	}
	return code
}

// VolumePath returns the host directory of the named volume.
func (p *Podman) VolumePath(t testing.TB, name string) string {
	t.Helper()
	return p.Run(t, "volume", "inspect", "--format", "{{.Mountpoint}}", name)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
