package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKafkaSASLAndTLS checks the KafkaSASL and KafkaTLS options: the broker
// refuses a client without credentials, while the helper clients (Client,
// NewTopic, Records) connect with TLS and log in, also across Pause/Resume.
func TestKafkaSASLAndTLS(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
	client := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	k := Kafka(t, KafkaTLS(server, client), KafkaSASL(
		KafkaUser{Mechanism: "SCRAM-SHA-512", Username: "admin", Password: "admin-pass"},
		KafkaUser{Mechanism: "PLAIN", Username: "other", Password: "other-pass"},
	))
	topic := k.NewTopic(t, 2)
	produce(t, k.Client(t), topic, 0, 20)
	if recs := k.Records(t, topic); len(recs) != 20 {
		t.Fatalf("Records: %d, want 20", len(recs))
	}

	// TLS but no SASL: the broker must not take the records.
	anon, err := kgo.NewClient(kgo.SeedBrokers(k.Addr()), kgo.DialTLSConfig(client.Clone()),
		kgo.DialTimeout(2*time.Second), kgo.RecordRetries(1), kgo.RequestRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := anon.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("anonymous")}).FirstErr(); err == nil {
		t.Fatal("a client without SASL credentials produced to a KafkaSASL broker")
	}

	// The anonymous record is not there either: exactly 20, then 30.
	k.Pause()
	k.Resume()
	produce(t, k.Client(t), topic, 20, 30)
	if recs := k.WaitForRecords(t, topic, 30, 30*time.Second); len(recs) != 30 {
		t.Fatalf("after Resume: %d records, want 30", len(recs))
	}
}

func TestKafkaSASLRejectsUnknownMechanism(t *testing.T) {
	k := &KafkaBroker{opts: kafkaOpts{users: []KafkaUser{{Mechanism: "GSSAPI", Username: "u", Password: "p"}}}}
	if _, err := k.clientOpts(); err == nil {
		t.Fatal("GSSAPI accepted")
	}
}
