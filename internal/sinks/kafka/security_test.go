package kafka

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// testPKI is an in-memory CA with one server certificate for 127.0.0.1 and
// one client certificate, all written as PEM files under a temp dir.
type testPKI struct {
	caFile, clientCert, clientKey string
	server                        tls.Certificate
	pool                          *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgepipe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, eku x509.ExtKeyUsage) ([]byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{eku},
			KeyUsage: x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	p := &testPKI{pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	srvCert, srvKey := issue(2, x509.ExtKeyUsageServerAuth)
	if p.server, err = tls.X509KeyPair(srvCert, srvKey); err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey := issue(3, x509.ExtKeyUsageClientAuth)
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caFile = write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	p.clientCert = write("client.pem", cliCert)
	p.clientKey = write("client-key.pem", cliKey)
	return p
}

func testBatch(env string, n int) *accesslog.Batch {
	b := &accesslog.Batch{EnvironmentID: env, Format: accesslog.FormatJSON, AgentID: "agent", Datestamp: "20261123",
		SeqNum: 1, ReceivedUnixNano: time.Now().UnixNano()}
	for i := 0; i < n; i++ {
		b.Records = append(b.Records, json.RawMessage(fmt.Sprintf(`{"uuid":"%s-%d"}`, env, i)))
	}
	return b
}

func TestDeliverWithSASL(t *testing.T) {
	for _, tc := range []struct{ flag, kfake string }{
		{SASLPlain, "PLAIN"},
		{SASLScramSHA256, "SCRAM-SHA-256"},
		{SASLScramSHA512, "SCRAM-SHA-512"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			broker := testenv.Kafka(t, testenv.KafkaSASL(testenv.KafkaUser{Mechanism: tc.kfake, Username: "edgepipe", Password: "s3cret-" + tc.flag}))
			mech, err := SASLMechanism(tc.flag, "edgepipe", "s3cret-"+tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			topic := "sasl-" + tc.flag
			sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, CreateTopic: true, Partitions: 2, SASL: mech, WriteTimeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sink.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sink.Deliver(ctx, []*accesslog.Batch{testBatch("env", 7)}); err != nil {
				t.Fatalf("Deliver with SASL %s: %v", tc.flag, err)
			}
			if recs := broker.WaitForRecords(t, topic, 7, 20*time.Second); len(recs) != 7 {
				t.Fatalf("%d records, want 7", len(recs))
			}
		})
	}
}

func TestDeliverWithWrongPasswordFailsClearly(t *testing.T) {
	broker := testenv.Kafka(t, testenv.KafkaSASL(testenv.KafkaUser{Mechanism: "SCRAM-SHA-256", Username: "edgepipe", Password: "right-password"}))
	topic := broker.NewTopic(t, 1)
	const wrong = "wrong-password-xyz"
	mech, err := SASLMechanism(SASLScramSHA256, "edgepipe", wrong)
	if err != nil {
		t.Fatal(err)
	}
	// Both paths: topic creation first (it dials separately from the
	// writer) and the writer alone.
	withCreate, err := New(Config{Brokers: broker.Brokers(), Topic: topic, CreateTopic: true, SASL: mech, WriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { withCreate.Close() })
	writeOnly, err := New(Config{Brokers: broker.Brokers(), Topic: topic, SASL: mech, WriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writeOnly.Close() })
	// Twice each: the worker retries a failed delivery, and every attempt
	// must fail the same clear way (not hang, not pretend success).
	for attempt, sink := range []*Sink{withCreate, withCreate, writeOnly, writeOnly} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = sink.Deliver(ctx, []*accesslog.Batch{testBatch("env", 3)})
		cancel()
		if err == nil {
			t.Fatalf("attempt %d: Deliver with a wrong password succeeded", attempt)
		}
		if !strings.Contains(err.Error(), "SASL authentication failed") || !strings.Contains(err.Error(), "EDGEPIPE_KAFKA_PASSWORD") {
			t.Fatalf("attempt %d: error does not say what to fix: %v", attempt, err)
		}
		if strings.Contains(err.Error(), wrong) {
			t.Fatalf("error leaks the password: %v", err)
		}
	}
	if recs := broker.Records(t, topic); len(recs) != 0 {
		t.Fatalf("%d records written without authentication", len(recs))
	}
}

func TestDeliverOverTLSWithSASL(t *testing.T) {
	pki := newTestPKI(t)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	clientTLS := &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}
	broker := testenv.Kafka(t,
		testenv.KafkaTLS(serverTLS, clientTLS),
		testenv.KafkaSASL(testenv.KafkaUser{Mechanism: "PLAIN", Username: "edgepipe", Password: "tls-pass"}))
	mech, err := SASLMechanism(SASLPlain, "edgepipe", "tls-pass")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("trusted CA", func(t *testing.T) {
		tlsCfg, err := TLSFiles{CAFile: pki.caFile, CertFile: pki.clientCert, KeyFile: pki.clientKey}.Config()
		if err != nil {
			t.Fatal(err)
		}
		sink, err := New(Config{Brokers: broker.Brokers(), Topic: "tls-topic", CreateTopic: true, Partitions: 1, TLS: tlsCfg, SASL: mech, WriteTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sink.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sink.Deliver(ctx, []*accesslog.Batch{testBatch("env", 4)}); err != nil {
			t.Fatalf("Deliver over TLS: %v", err)
		}
		if recs := broker.WaitForRecords(t, "tls-topic", 4, 20*time.Second); len(recs) != 4 {
			t.Fatalf("%d records, want 4", len(recs))
		}
	})

	t.Run("untrusted CA", func(t *testing.T) {
		// The system trust store does not know the test CA.
		tlsCfg, err := TLSFiles{}.Config()
		if err != nil {
			t.Fatal(err)
		}
		sink, err := New(Config{Brokers: broker.Brokers(), Topic: "tls-untrusted", CreateTopic: true, TLS: tlsCfg, SASL: mech, WriteTimeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sink.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err = sink.Deliver(ctx, []*accesslog.Batch{testBatch("env", 1)})
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("Deliver to a broker with an untrusted certificate: %v, want a certificate error", err)
		}
	})
}

func TestTLSFilesConfig(t *testing.T) {
	pki := newTestPKI(t)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		files   TLSFiles
		wantErr string
		check   func(*tls.Config) bool
	}{
		{name: "system roots", files: TLSFiles{}, check: func(c *tls.Config) bool {
			return c.RootCAs == nil && !c.InsecureSkipVerify && c.MinVersion == tls.VersionTLS12
		}},
		{name: "CA file", files: TLSFiles{CAFile: pki.caFile}, check: func(c *tls.Config) bool { return c.RootCAs != nil && c.RootCAs.Equal(pki.pool) }},
		{name: "client cert", files: TLSFiles{CertFile: pki.clientCert, KeyFile: pki.clientKey}, check: func(c *tls.Config) bool { return len(c.Certificates) == 1 }},
		{name: "insecure", files: TLSFiles{InsecureSkipVerify: true}, check: func(c *tls.Config) bool { return c.InsecureSkipVerify }},
		{name: "missing CA", files: TLSFiles{CAFile: filepath.Join(dir, "nope.pem")}, wantErr: "CA file"},
		{name: "CA not PEM", files: TLSFiles{CAFile: notPEM}, wantErr: "no PEM certificate"},
		{name: "cert without key", files: TLSFiles{CertFile: pki.clientCert}, wantErr: "both"},
		{name: "key without cert", files: TLSFiles{KeyFile: pki.clientKey}, wantErr: "both"},
		{name: "key does not match", files: TLSFiles{CertFile: pki.clientCert, KeyFile: notPEM}, wantErr: "client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.files.Config()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("config %+v", c)
			}
		})
	}
}

func TestSASLMechanism(t *testing.T) {
	for _, tc := range []struct {
		name, user, pass string
		want             string // mechanism name, "" for none
		wantErr          string
	}{
		{name: "", want: ""},
		{name: "none", want: ""},
		{name: "plain", user: "u", pass: "p", want: "PLAIN"},
		{name: "SCRAM-SHA-256", user: "u", pass: "p", want: "SCRAM-SHA-256"},
		{name: "scram-sha-512", user: "u", pass: "p", want: "SCRAM-SHA-512"},
		{name: "plain", user: "u", wantErr: "needs a username and a password"},
		{name: "scram-sha-256", pass: "p", wantErr: "needs a username and a password"},
		{name: "gssapi", user: "u", pass: "p", wantErr: "unknown Kafka SASL mechanism"},
	} {
		m, err := SASLMechanism(tc.name, tc.user, tc.pass)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.name, err)
			continue
		}
		got := ""
		if m != nil {
			got = m.Name()
		}
		if got != tc.want {
			t.Errorf("%q: mechanism %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestTrackedMechanismNewestExchangeDecides(t *testing.T) {
	inner, err := SASLMechanism(SASLPlain, "u", "p")
	if err != nil {
		t.Fatal(err)
	}
	m := &trackedMechanism{Mechanism: inner}
	ctx := context.Background()
	if m.unfinished() {
		t.Fatal("unfinished before any exchange")
	}
	first, _, err := m.Start(ctx) // never completes: the broker hung up
	if err != nil {
		t.Fatal(err)
	}
	if !m.unfinished() {
		t.Fatal("an exchange without an answer is not unfinished")
	}
	second, _, _ := m.Start(ctx)
	if done, _, err := second.Next(ctx, nil); !done || err != nil {
		t.Fatalf("PLAIN Next: %v %v", done, err)
	}
	if m.unfinished() {
		t.Fatal("a newer completed exchange does not clear the state")
	}
	// The older exchange completing late does not move the state back.
	_, _, _ = first.Next(ctx, nil)
	if m.unfinished() || m.completed.Load() != 2 {
		t.Fatalf("completed %d", m.completed.Load())
	}
	if _, _, err := m.Start(ctx); err != nil || !m.unfinished() {
		t.Fatalf("a newest exchange pending: unfinished %v (%v)", m.unfinished(), err)
	}
}
