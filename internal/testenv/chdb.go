package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// LibChDBEnv names the environment variable that points at libchdb.so when
// it is not where `make deps` puts it (LibChDBPath).
const LibChDBEnv = "EDGEPIPE_LIBCHDB"

// ChDBPackage is the npm package `make deps` installs libchdb.so from: the
// platform package of the npm registry's chdb (chdb 3.4.0 depends on this
// version), ClickHouse 26.7 as a library.
const ChDBPackage = "@chdb/lib-linux-x64-gnu@26.7.3-stable.1"

// chdbServerPkg is the command that serves chDB over ClickHouse's HTTP
// interface.
const chdbServerPkg = "github.com/edgepipe/edgepipe/internal/testenv/cmd/chdb-server"

// LibChDBPath returns where `make deps` (scripts/deps.sh) installs
// libchdb.so: <user cache dir>/edgepipe/chdb/node_modules/@chdb/lib-linux-x64-gnu/libchdb.so,
// or $EDGEPIPE_LIBCHDB when set.
func LibChDBPath() (string, error) {
	if p := os.Getenv(LibChDBEnv); p != "" {
		return p, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find the user cache directory: %w", err)
	}
	return filepath.Join(base, "edgepipe", "chdb", "node_modules", "@chdb", "lib-linux-x64-gnu", "libchdb.so"), nil
}

// ChDBServer is ClickHouse 26.x's engine (chDB, libchdb.so) behind
// cmd/chdb-server, the HTTP(S) interface of a ClickHouse server, started
// for one test with its data in t.TempDir(). It has no native protocol and
// cannot replicate (no ZooKeeper, no cluster); everything else edgepipe
// runs on a server (DDL, INSERT, FINAL, TTL, codecs, deduplication) runs on
// the real 26.x engine. User "default" has no password.
type ChDBServer struct {
	t          testing.TB
	bin, lib   string
	dir        string
	httpPort   int
	httpsPort  int
	caFile     string
	certFile   string
	keyFile    string
	serverName string
	configFile string
	mu         sync.Mutex
	proc       *process
}

// ChDB starts a chdb-server for the test (building cmd/chdb-server as
// GoBuild does, also with EDGEPIPE_TEST_BIN_DIR set, so the package runs
// its tests through Main) and kills it on
// cleanup. Without libchdb.so the test is skipped, or fails when CI=true.
func ChDB(t testing.TB) *ChDBServer {
	t.Helper()
	lib, err := LibChDBPath()
	if err == nil {
		_, err = os.Stat(lib)
	}
	if err != nil {
		missing(t, "libchdb.so (ClickHouse 26.x as a library) not found: run `make deps` to install it from npm (%s), or set %s: %v", ChDBPackage, LibChDBEnv, err)
	}
	s := &ChDBServer{t: t, bin: buildOnce(t, chdbServerPkg), lib: lib, dir: t.TempDir(), serverName: "localhost"}
	if err := s.writeTLS(); err != nil {
		t.Fatalf("testenv: chdb-server TLS: %v", err)
	}
	s.configFile = filepath.Join(s.dir, "config.xml")
	if err := os.WriteFile(s.configFile, []byte(chdbConfigXML), 0o644); err != nil {
		t.Fatalf("testenv: chdb-server config: %v", err)
	}
	t.Cleanup(s.Kill)
	for attempt := 0; attempt < 4; attempt++ {
		if s.httpPort, err = stablePort(); err == nil {
			s.httpsPort, err = stablePort()
		}
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err = s.start(); err == nil {
			return s
		}
		if !addrInUse(s.logs()) {
			break
		}
	}
	t.Fatalf("testenv: start chdb-server: %v\n--- log ---\n%s", err, s.logs())
	return nil
}

// ChDBCluster is the cluster of the chdb-server's remote_servers: one shard
// of one replica at a port nobody listens on. It lets a Distributed table
// be created as written (it cannot be written through: chDB has no
// native port, and no ZooKeeper for ON CLUSTER or Replicated tables).
const ChDBCluster = "edgepipe"

const chdbConfigXML = `<clickhouse>
    <remote_servers>
        <edgepipe>
            <shard><replica><host>127.0.0.1</host><port>1</port></replica></shard>
        </edgepipe>
    </remote_servers>
</clickhouse>
`

// chdbStartTimeout bounds one start: loading the 560 MB library and the
// tables takes a few seconds on a busy machine.
const chdbStartTimeout = 60 * time.Second

func (s *ChDBServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.exited() {
		return nil
	}
	p, err := startProcess("chdb-server", filepath.Join(s.dir, "server.log"), "/usr/bin/env",
		"CHDB_LIB_PATH="+s.lib, s.bin, "--path="+filepath.Join(s.dir, "data"), "--config="+s.configFile,
		"--http="+s.HTTPAddr(), "--https="+s.HTTPSAddr(), "--cert="+s.certFile, "--key="+s.keyFile)
	if err != nil {
		return err
	}
	s.proc = p
	return waitFor(context.Background(), p, chdbStartTimeout, 100*time.Millisecond, s.ping)
}

func (s *ChDBServer) ping(ctx context.Context) error {
	return getOK(ctx, "http://"+s.HTTPAddr()+"/ping")
}

func (s *ChDBServer) logs() string { return fileTail(filepath.Join(s.dir, "server.log"), 4000) }

// HTTPAddr returns host:port of the HTTP interface.
func (s *ChDBServer) HTTPAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpPort))
}

// HTTPSAddr returns host:port of the HTTPS interface (certificate for
// localhost and 127.0.0.1, signed by CAFile).
func (s *ChDBServer) HTTPSAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpsPort))
}

// DSN returns an http:// DSN for database.
func (s *ChDBServer) DSN(database string) string { return "http://" + s.HTTPAddr() + "/" + database }

// HTTPSDSN returns an https:// DSN for database (secure=true); clients
// must trust CAFile.
func (s *ChDBServer) HTTPSDSN(database string) string {
	return "https://" + s.HTTPSAddr() + "/" + database + "?secure=true"
}

// CAFile returns the PEM file of the CA that signed the HTTPS certificate.
func (s *ChDBServer) CAFile() string { return s.caFile }

// Version returns the server's version, e.g. "26.7.2.1".
func (s *ChDBServer) Version(t testing.TB) string {
	t.Helper()
	var v string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Conn(t).QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		t.Fatalf("testenv: chdb version: %v", err)
	}
	return v
}

// Conn opens a clickhouse-go connection over HTTP to the "default"
// database and closes it on cleanup.
func (s *ChDBServer) Conn(t testing.TB) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Protocol: clickhouse.HTTP, Addr: []string{s.HTTPAddr()},
		Auth: clickhouse.Auth{Database: "default", Username: "default"}, DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("testenv: open chdb-server %s: %v", s.HTTPAddr(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Exec runs one statement and fails the test on error.
func (s *ChDBServer) Exec(t testing.TB, sql string) {
	t.Helper()
	if err := s.TryExec(sql); err != nil {
		t.Fatalf("testenv: chdb exec %q: %v", sql, err)
	}
}

// TryExec runs one statement over HTTP and returns the server's error.
func (s *ChDBServer) TryExec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Protocol: clickhouse.HTTP, Addr: []string{s.HTTPAddr()},
		Auth: clickhouse.Auth{Database: "default", Username: "default"}, DialTimeout: 5 * time.Second,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Exec(ctx, sql)
}

// QueryUint64 runs a query returning one unsigned integer and fails the
// test on error.
func (s *ChDBServer) QueryUint64(t testing.TB, sql string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var n uint64
	if err := s.Conn(t).QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("testenv: chdb query %q: %v", sql, err)
	}
	return n
}

// QueryString runs a query returning one string and fails the test on
// error.
func (s *ChDBServer) QueryString(t testing.TB, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var v string
	if err := s.Conn(t).QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("testenv: chdb query %q: %v", sql, err)
	}
	return v
}

// Kill SIGKILLs the server, as a crash would; data and ports are kept for
// Start. Kill is also the cleanup.
func (s *ChDBServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
	}
}

// Start starts the server again after Kill, on the same ports and data.
func (s *ChDBServer) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restart chdb-server: %v\n--- log ---\n%s", err, s.logs())
	}
}

// writeTLS writes a CA and a server certificate for localhost and
// 127.0.0.1 signed by it.
func (s *ChDBServer) writeTLS() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgepipe test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	s.caFile, s.certFile, s.keyFile = filepath.Join(s.dir, "ca.pem"), filepath.Join(s.dir, "server.pem"), filepath.Join(s.dir, "server-key.pem")
	return errors.Join(
		os.WriteFile(s.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644),
		os.WriteFile(s.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644),
		os.WriteFile(s.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600),
	)
}

// TLSConfig returns a client TLS configuration that trusts CAFile.
func (s *ChDBServer) TLSConfig(t testing.TB) *tls.Config {
	t.Helper()
	pemData, err := os.ReadFile(s.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		t.Fatal("testenv: no certificate in " + s.caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: s.serverName, MinVersion: tls.VersionTLS12}
}
