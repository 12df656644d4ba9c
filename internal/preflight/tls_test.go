package preflight

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestPublicURL: the URL must be an https URL the platform takes, and the
// certificate served there (or, out of reach, the one of the web config)
// must cover its host, chain to a trusted CA and be valid now; the line
// says which certificate was checked.
func TestPublicURL(t *testing.T) {
	ca, other := testenv.NewCA(t), testenv.NewCA(t)
	now := time.Now()
	serve := func(cert tls.Certificate) string {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	good := ca.Certificate(t, "127.0.0.1")
	pair := func(certPEM, keyPEM []byte) tls.Certificate {
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	webConfig := func(certPEM, keyPEM []byte) string {
		dir := t.TempDir()
		for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM,
			"web.yml": []byte("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return filepath.Join(dir, "web.yml")
	}
	goodPEM, goodKey := ca.Issue(t, now.Add(-time.Hour), now.Add(30*24*time.Hour), "127.0.0.1")
	ownURL := serve(pair(goodPEM, goodKey))
	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)
	down := "https://" + testenv.FreeAddr(t)
	// A load balancer with no ready receiver behind it: it accepts the
	// connection and drops it.
	lb, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	go func() {
		for {
			c, err := lb.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	for _, tc := range []struct {
		name, url, webConfig string
		want                 []string // the URL line, then the certificate line
	}{
		{"served", serve(good), "", []string{"ok    public URL: destination_endpoint https://127.0.0.1:",
			"ok    public URL certificate: the certificate served at 127.0.0.1:", ": for 127.0.0.1, issued by"}},
		{"served is the receiver's own", ownURL, webConfig(goodPEM, goodKey), []string{"ok    public URL:", "(the receiver's own, --web.config.file): for 127.0.0.1"}},
		{"served by a proxy", serve(good), webConfig(goodPEM, goodKey), []string{"ok    public URL:", "(not the receiver's own: a proxy or ingress in front serves it)"}},
		{"another host", serve(ca.Certificate(t, "rtld.example.net")), "", []string{"ok    public URL:",
			"FAIL  public URL certificate: the certificate served at 127.0.0.1:", "it does not cover 127.0.0.1 (it is for rtld.example.net)"}},
		{"untrusted", serve(other.Certificate(t, "127.0.0.1")), "", []string{"ok    public URL:",
			"FAIL  public URL certificate:", "certificate signed by unknown authority", "use a certificate of a public CA"}},
		{"expired", serve(pair(ca.Issue(t, now.Add(-48*time.Hour), now.Add(-time.Hour), "127.0.0.1"))), "", []string{"ok    public URL:",
			"FAIL  public URL certificate:", "not now: renew it"}},
		{"expiring", serve(pair(ca.Issue(t, now.Add(-time.Hour), now.Add(5*24*time.Hour), "127.0.0.1"))), "", []string{"ok    public URL:",
			"ok    public URL certificate:", "(4 days): renew it soon"}},
		{"not TLS", strings.Replace(plain.URL, "http://", "https://", 1), "", []string{"ok    public URL:",
			"FAIL  public URL certificate: 127.0.0.1:", "answers, but not with TLS"}},
		{"out of reach, own certificate", down, webConfig(goodPEM, goodKey), []string{"ok    public URL:",
			"ok    public URL certificate: the certificate of --web.config.file (127.0.0.1:", "is not reachable from here", "for 127.0.0.1"}},
		{"out of reach, own certificate for another host", down, webConfig(ca.Issue(t, now.Add(-time.Hour), now.Add(time.Hour), "other.example")), []string{"ok    public URL:",
			"FAIL  public URL certificate: the certificate of --web.config.file: it does not cover 127.0.0.1"}},
		{"dropped, own certificate", "https://" + lb.Addr().String(), webConfig(goodPEM, goodKey), []string{"ok    public URL:",
			"ok    public URL certificate: the certificate of --web.config.file (" + lb.Addr().String() + " is not reachable from here: ", "for 127.0.0.1"}},
		{"out of reach", down, "", []string{"ok    public URL:", "FAIL  public URL certificate: cannot reach 127.0.0.1:", "the platform cannot deliver either"}},
		{"http", "http://rtld.example.net", "", []string{"FAIL  public URL:", "is not an https URL", "      public URL certificate: skipped: needs public URL"}},
		{"unset", "", "", []string{"FAIL  public URL: --public-url (or EDGEPIPE_PUBLIC_URL) is not set"}},
		{"query", "https://rtld.example.net/?a=b", "", []string{"FAIL  public URL:", "without user, query or fragment"}},
		{"too long", "https://rtld.example.net/" + strings.Repeat("x", 1000), "", []string{"FAIL  public URL: --public-url is too long"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &PublicURL{URL: tc.url, WebConfigFile: tc.webConfig, Roots: ca.Pool(),
				Destination: func(env string) string { return strings.TrimRight(tc.url, "/") + "/ingest/" + env }}
			var out strings.Builder
			Run(context.Background(), &out, p.Checks())
			if !testenv.CheckInOrder(t, out.String(), tc.want) {
				t.Log(out.String())
			}
		})
	}
}
