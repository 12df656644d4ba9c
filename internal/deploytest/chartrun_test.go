package deploytest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestChartCommandLinesRun starts the real programs with exactly the command
// lines, environment and mounted files the chart renders, switched to the
// built-in simulator:
//
//   - the chart's defaults (the simulator demo);
//   - production values: sharded exporter with ClickHouse, OTLP and a config
//     file (checked against the simulator's datasets at start), receiver
//     with Kafka and ClickHouse;
//   - web-config values: both listeners serving TLS from the chart's web
//     config Secret and a mounted certificate Secret, probed over HTTPS as
//     the kubelet would.
//
// Only what points outside the test is replaced: listen addresses, volume
// paths, the sinks' addresses, credential values and downward-API values.
// Both programs must become ready, so a flag or variable they do not know, a
// value they reject, or a file the chart mounts in the wrong place fails here
// instead of in a crash-looping pod.
func TestChartCommandLinesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the programs")
	}
	for _, tc := range []struct {
		name   string
		values []string
		https  bool
	}{
		// The chart's defaults (the simulator demo): their sizes must work
		// together, or the receiver refuses to start.
		{"defaults", nil, false},
		{"production", []string{chartDir + "/ci/production-values.yaml", "testdata/simulate.yaml"}, false},
		{"web config TLS", []string{chartDir + "/ci/webconfig-values.yaml", "testdata/simulate.yaml"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRenderedPrograms(t, render(t, tc.values...), tc.https)
		})
	}
}

func runRenderedPrograms(t *testing.T, m manifests, https bool) {
	svc := newServices(t)
	ws := m.workloads(t)
	if len(ws) != 2 {
		t.Fatalf("%d workloads, want 2", len(ws))
	}
	type program struct {
		name, readyz string
		exited       <-chan struct{}
	}
	var programs []program
	for key, w := range ws {
		c := w.Spec.Template.Spec.Containers[0]
		addr := testenv.FreeAddr(t)
		bin, args, environ := svc.commandLine(t, m, key, w.Spec.Template.Spec, c, addr)
		t.Logf("%s: %s %s", key, filepath.Base(bin), strings.Join(args, " "))
		exited := startProgramEnv(t, bin, environ, args...)

		// Probe as the kubelet does: the readiness probe's path and scheme.
		pr := c.ReadinessProbe
		if pr == nil || pr.HTTPGet == nil {
			t.Fatalf("%s: no HTTP readiness probe", key)
		}
		if got := pr.HTTPGet.Scheme == "HTTPS"; got != https {
			t.Errorf("%s: readiness probe scheme %s", key, pr.HTTPGet.Scheme)
		}
		u := strings.ToLower(pr.HTTPGet.Scheme) + "://" + addr + pr.HTTPGet.Path
		programs = append(programs, program{key, u, exited})
	}
	// The kubelet does not verify serving certificates.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, p := range programs {
		waitFor(t, 2*time.Minute, func(ctx context.Context) error {
			select {
			case <-p.exited:
				t.Fatalf("%s exited instead of becoming ready (log below)", p.name)
			default:
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.readyz, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", p.readyz, resp.Status)
			}
			return nil
		})
	}
}

// services are the test's stand-ins for what the chart's command lines
// point outside the pod at: the built programs, ClickHouse, Kafka and an
// OTLP receiver.
type services struct {
	bins     map[string]string
	ch       *testenv.ClickHouseServer
	kafka    *testenv.KafkaBroker
	otlpAddr string
}

func newServices(t *testing.T) services {
	t.Helper()
	_, otlpAddr := otlptest.StartGRPC(t)
	return services{bins: buildCommands(t, "exporter", "rtld-receiver"), ch: testenv.ClickHouse(t), kafka: testenv.Kafka(t), otlpAddr: otlpAddr}
}

// commandLine returns the program, arguments and environment container c
// of pod spec ps (workload key) runs with, exactly as the chart renders
// them, with only what points outside the test replaced: the listen
// address (by listen), volume paths (a directory each, filled as below),
// the sinks' addresses, credential values and downward-API values.
func (s services) commandLine(t *testing.T, m manifests, key string, ps podSpec, c container, listen string) (bin string, args, environ []string) {
	t.Helper()
	if len(c.Command) != 1 {
		t.Fatalf("%s: command %v", key, c.Command)
	}
	bin, ok := s.bins[filepath.Base(c.Command[0])]
	if !ok {
		t.Fatalf("%s: runs %s, which is none of the built commands", key, c.Command[0])
	}
	tmp := t.TempDir()
	paths := mountVolumes(t, m, key, ps, c, tmp)
	env := s.environment(t, key, c)
	for _, a := range c.Args {
		// $(VAR) as Kubernetes expands it.
		a = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(a, func(ref string) string {
			name := ref[2 : len(ref)-1]
			if v, ok := env[name]; ok {
				return v
			}
			t.Errorf("%s: %s refers to undefined %s", key, a, name)
			return ref
		})
		switch {
		case strings.HasPrefix(a, "--web.listen-address="):
			a = "--web.listen-address=" + listen
		case strings.HasPrefix(a, "--otlp.endpoint="):
			a = "--otlp.endpoint=http://" + s.otlpAddr
		}
		args = append(args, paths.Replace(a))
	}
	environ = []string{"HOME=" + tmp, "TMPDIR=" + tmp, "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	return bin, args, environ
}

// mountVolumes makes a directory under tmp per volume mount of c: Secret
// volumes filled with the rendered Secret's data, or a fresh certificate
// for a TLS Secret the chart references but does not create; ConfigMap
// volumes with the rendered ConfigMap's data. It returns the replacer of
// mount paths by those directories.
func mountVolumes(t *testing.T, m manifests, key string, ps podSpec, c container, tmp string) *strings.Replacer {
	t.Helper()
	var mounts []string
	for _, vm := range c.VolumeMounts {
		mounts = append(mounts, vm.MountPath, filepath.Join(tmp, "volume-"+vm.Name))
	}
	paths := strings.NewReplacer(mounts...)
	for _, vm := range c.VolumeMounts {
		dir := filepath.Join(tmp, "volume-"+vm.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, v := range ps.Volumes {
			if v.Name != vm.Name || v.Secret == nil && v.ConfigMap == nil {
				continue
			}
			var files map[string]string
			if v.ConfigMap != nil {
				if files = configMapFiles(t, m, v.ConfigMap.Name); files == nil {
					t.Fatalf("%s: volume %s names ConfigMap %s, which the chart does not render", key, v.Name, v.ConfigMap.Name)
				}
			} else if files = secretFiles(t, m, v.Secret.SecretName); files == nil {
				files = selfSignedTLS(t)
			}
			for name, content := range files {
				// Files name mount paths (a web config naming the
				// certificate): map them like the arguments.
				if err := os.WriteFile(filepath.Join(dir, name), []byte(paths.Replace(content)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return paths
}

// environment returns c's variables as the kubelet sets them, with the
// test's ClickHouse (a new database) and Kafka, and stand-in credentials.
func (s services) environment(t *testing.T, key string, c container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ev := range c.Env {
		switch {
		case ev.Value != nil:
			env[ev.Name] = *ev.Value
		case ev.ValueFrom == nil:
			t.Fatalf("%s: env %s has neither value nor valueFrom", key, ev.Name)
		case ev.ValueFrom.SecretKeyRef != nil:
			switch ev.Name {
			case "EDGEPIPE_CLICKHOUSE_DSN":
				env[ev.Name] = s.ch.DSN(s.ch.NewDatabase(t))
			case "EDGEPIPE_CLICKHOUSE_PASSWORD":
				// the test server's user has none
			default:
				env[ev.Name] = "value-of-" + ev.ValueFrom.SecretKeyRef.Key
			}
		case ev.ValueFrom.FieldRef != nil && ev.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']":
			env[ev.Name] = "1" // the second replica
		case ev.ValueFrom.ResourceFieldRef != nil && ev.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			n, err := quantityBytes(c.Resources.Limits["memory"])
			if err != nil {
				t.Fatalf("%s: %s: %v", key, ev.Name, err)
			}
			env[ev.Name] = strconv.FormatInt(n, 10) // what the kubelet passes
		default:
			t.Fatalf("%s: env %s: unsupported valueFrom %+v", key, ev.Name, *ev.ValueFrom)
		}
	}
	if _, ok := env["EDGEPIPE_KAFKA_BROKERS"]; ok {
		env["EDGEPIPE_KAFKA_BROKERS"] = s.kafka.Addr()
	}
	return env
}

// secretFiles returns the files a Secret volume of the rendered Secret name
// holds, or nil when the chart does not render that Secret.
func secretFiles(t *testing.T, m manifests, name string) map[string]string {
	t.Helper()
	for _, o := range m.ofKind("Secret") {
		if o.Metadata.Name != name {
			continue
		}
		var s struct {
			Data       map[string]string `yaml:"data"`
			StringData map[string]string `yaml:"stringData"`
		}
		o.decode(t, &s)
		files := map[string]string{}
		for k, v := range s.Data {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Fatalf("Secret %s key %s: %v", name, k, err)
			}
			files[k] = string(b)
		}
		for k, v := range s.StringData {
			files[k] = v
		}
		return files
	}
	return nil
}

// configMapFiles returns the files a ConfigMap volume of the rendered
// ConfigMap name holds, or nil when the chart does not render it.
func configMapFiles(t *testing.T, m manifests, name string) map[string]string {
	t.Helper()
	for _, o := range m.ofKind("ConfigMap") {
		if o.Metadata.Name == name {
			var c struct {
				Data map[string]string `yaml:"data"`
			}
			o.decode(t, &c)
			return c.Data
		}
	}
	return nil
}

// selfSignedTLS returns the files of a kubernetes.io/tls Secret for
// 127.0.0.1.
func selfSignedTLS(t *testing.T) map[string]string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "edgepipe-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return map[string]string{
		"tls.crt": cert,
		"tls.key": string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})),
		"ca.crt":  cert, // self-signed: its own CA, as cert-manager's ca.crt key
	}
}
