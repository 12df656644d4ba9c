package receiver_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kgzip "github.com/klauspost/compress/gzip"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// testCert is a self-signed certificate for 127.0.0.1 written to files.
type testCert struct {
	certFile, keyFile string
	pool              *x509.CertPool
	tls               tls.Certificate
}

func newTestCert(t testing.TB) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "rtld-receiver test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := testCert{certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"), pool: x509.NewCertPool()}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(c.certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c.pool.AppendCertsFromPEM(certPEM)
	if c.tls, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

// webConfig writes an exporter-toolkit web config serving TLS with c.
func (c testCert) webConfig(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(p, []byte(fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", c.certFile, c.keyFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMain(m *testing.M) { testenv.Main(m) }

// buildReceiver returns cmd/rtld-receiver built once for this test binary.
func buildReceiver(t testing.TB) string {
	t.Helper()
	return testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/rtld-receiver")
}

// receiverProcess is the receiver running as a child process; start may run
// it again after it ended (a restart), appending to the same log.
type receiverProcess struct {
	t      testing.TB
	bin    string
	args   []string
	env    []string
	log    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current run has been waited for
	err    error         // Wait's result, valid once exited is closed
}

// startReceiver builds and starts the receiver with args and env (added to
// this process's environment). When the test ends the receiver is killed if
// it still runs, and its log tail is shown if the test failed.
func startReceiver(t testing.TB, args, env []string) *receiverProcess {
	t.Helper()
	p := &receiverProcess{t: t, bin: buildReceiver(t), log: filepath.Join(t.TempDir(), "receiver.log"), args: args, env: env}
	p.start()
	t.Cleanup(func() {
		p.kill9()
		if t.Failed() {
			t.Logf("receiver log (tail):\n%s", p.logs())
		}
	})
	return p
}

func (p *receiverProcess) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(exited)
	}()
}

// kill9 sends SIGKILL (unless the process already ended) and waits for the
// process to exit.
func (p *receiverProcess) kill9() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop sends SIGINT and returns the exit error.
func (p *receiverProcess) stop() error { return p.signal(os.Interrupt) }

// signal sends sig, waits for the process to exit (killing it after 30s)
// and returns the exit error.
func (p *receiverProcess) signal(sig os.Signal) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(30 * time.Second):
		p.kill9()
		return fmt.Errorf("receiver did not exit within 30s of %v", sig)
	}
}

func (p *receiverProcess) logs() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// scrape returns the value of the first sample whose line starts with name
// (name may include labels), or -1.
func scrape(client *http.Client, metricsURL, name string) float64 {
	resp, err := client.Get(metricsURL)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(name):]), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// profileID finds the receiver's profile in env through the simulator's API.
func profileID(ctx context.Context, _ testing.TB, apiURL, env string) (int64, error) {
	c, err := platform.New(platform.Config{BaseURL: apiURL, AuthURL: apiURL, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		return 0, err
	}
	var out struct {
		Items []struct {
			ID          int64  `json:"id"`
			ProfileName string `json:"profile_name"`
			Enabled     bool   `json:"enabled"`
		} `json:"items"`
	}
	if err := c.RTLD().Do(ctx, http.MethodGet, "/accesslogs/profiles", url.Values{"environment_id": {env}}, nil, &out); err != nil {
		return 0, err
	}
	for _, p := range out.Items {
		if p.ProfileName == "edgepipe" && p.Enabled {
			return p.ID, nil
		}
	}
	return 0, fmt.Errorf("no edgepipe profile in %s yet", env)
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func gzipBytes(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := kgzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return buf.Bytes()
}

// gzipBomb is a record with one n MiB string, gzipped (about n KiB): the
// decoder would have to hold the whole string.
func gzipBomb(t testing.TB, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := kgzip.NewWriterLevel(&buf, kgzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(`[{"a":"`)); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range n {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func postBatch(t testing.TB, client *http.Client, u, user, pass string, body []byte, gzipped bool) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(body))
	req.SetBasicAuth(user, pass)
	if gzipped {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// runCommand runs the receiver binary once (a subcommand such as
// `dead-letter list`) and returns its output and exit error.
func runCommand(t testing.TB, args, env []string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildReceiver(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// jsonBatch is a body in the platform's json format: an envelope with the
// batch identity and the records.
func jsonBatch(agent string, seq int, records []string) []byte {
	return []byte(fmt.Sprintf(`{"account_number":"ACME","agent_id":%q,"datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[%s]}`,
		agent, seq, strings.Join(records, ",")))
}

// waitReady waits until the receiver at base answers /healthz.
func waitReady(t testing.TB, client *http.Client, base string) {
	t.Helper()
	waitFor(t, "the receiver to listen", 30*time.Second, func() bool {
		resp, err := client.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// The basic credentials of the receivers startSimulatedReceiver starts.
const (
	simRTLDUser = "platform"
	simRTLDPass = "correct horse"
)

// startSimulator starts the platform simulator configured by cfg on
// loopback, its deliveries trusting cert, and returns it with its API URL;
// it is closed when the test ends.
func startSimulator(t testing.TB, cert testCert, cfg platformsim.Config) (*platformsim.Server, string) {
	t.Helper()
	cfg.Delivery.TLSConfig = &tls.Config{RootCAs: cert.pool}
	sim, err := platformsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	apiURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return sim, apiURL
}

// startSimulatedReceiver starts the receiver binary registering its
// profiles for envs in the simulator at apiURL and serving https with cert
// on a free loopback port, with the flags extra besides; it returns the
// process and the receiver's base URL.
func startSimulatedReceiver(t testing.TB, cert testCert, apiURL string, envs []string, extra ...string) (*receiverProcess, string) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	base := "https://" + addr
	args := append([]string{
		"--api.url=" + apiURL, "--auth.url=" + apiURL, "--environment-id=" + strings.Join(envs, ","),
		"--public-url=" + base, "--web.listen-address=" + addr, "--web.config.file=" + cert.webConfig(t),
	}, extra...)
	p := startReceiver(t, args, []string{
		"EDGEPIPE_CLIENT_ID=" + platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET=" + platformsim.DemoClientSecret,
		"EDGEPIPE_RTLD_USERNAME=" + simRTLDUser, "EDGEPIPE_RTLD_PASSWORD=" + simRTLDPass,
	})
	return p, base
}

// waitProfile waits for the receiver's profile in env to appear in the
// simulator at apiURL and returns its ID.
func waitProfile(ctx context.Context, t testing.TB, apiURL, env string) int64 {
	t.Helper()
	var id int64
	waitFor(t, "the receiver to register its profile in "+env, 30*time.Second, func() bool {
		var err error
		id, err = profileID(ctx, t, apiURL, env)
		return err == nil
	})
	return id
}
