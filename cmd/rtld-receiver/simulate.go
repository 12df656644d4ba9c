package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
)

// defaultSimTrafficScale is the default of --simulate.traffic-scale: the
// simulator's own default (main.go does not link the simulator).
const defaultSimTrafficScale = platformsim.DefaultTrafficScale

// simulation is the in-process platform of --simulate: the simulator's API
// on a loopback port, and a TLS listener (in-memory self-signed certificate,
// trusted by the simulator's delivery engine) where the simulator posts
// batches, since the platform only posts to https.
type simulation struct {
	sim            *platformsim.Server
	ingest         net.Listener
	apiURL         string
	publicURL      string
	clientID       string
	clientSecret   string
	environmentIDs []string
}

func startSimulation(f *flags, log *slog.Logger) (*simulation, error) {
	cert, pool, err := selfSignedCert()
	if err != nil {
		return nil, err
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, fmt.Errorf("simulate: TLS ingest listener: %w", err)
	}
	sim, err := platformsim.New(platformsim.Config{
		Seed:         1,
		TrafficScale: f.simTrafficScale,
		Delivery: platformsim.DeliveryConfig{
			Live:          true,
			RetryInterval: 2 * time.Second,
			TLSConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			Logger:        log.With("component", "platform-sim"),
		},
	})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("simulate: %w", err)
	}
	apiURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		l.Close()
		sim.Close()
		return nil, fmt.Errorf("simulate: starting the simulator: %w", err)
	}
	envs := simulatedEnvironments(f, sim)
	s := &simulation{
		sim: sim, ingest: l, apiURL: apiURL,
		publicURL:      "https://" + l.Addr().String(),
		clientID:       platformsim.DemoClientID,
		clientSecret:   platformsim.DemoClientSecret,
		environmentIDs: envs,
	}
	log.Info("simulate: platform simulator running", "api_url", apiURL, "ingest_url", s.publicURL, "environments", len(envs))
	return s, nil
}

// configure points the platform flags and the receiver's configuration at
// the simulator: its API, its ingest listener as the public URL, its
// environments when no --environment-id is given, and generated ingest
// credentials when none are set.
func (s *simulation) configure(f *flags, cfg *receiver.Config) {
	f.platform.APIURL, f.platform.AuthURL, f.publicURL = s.apiURL, s.apiURL, s.publicURL
	if len(cfg.EnvironmentIDs) == 0 {
		cfg.EnvironmentIDs = s.environmentIDs
	}
	if cfg.Ingest.Username == "" || cfg.Ingest.Password == "" {
		cfg.Ingest.Username, cfg.Ingest.Password = "edgepipe-sim", randomSecret()
	}
}

// simulatedEnvironments are the simulator's environments --simulate
// serves when no --environment-id is given.
func simulatedEnvironments(f *flags, sim *platformsim.Server) []string {
	envs := sim.EnvironmentIDs()
	if f.simEnvironments > 0 && f.simEnvironments < len(envs) {
		envs = envs[:f.simEnvironments]
	}
	return envs
}

// startSimulatedAPI starts the simulator's API alone, without log
// delivery, for `check --simulate`: it points the platform flags at it
// and returns the demo credentials, the environments --simulate serves and
// a function that stops it.
func startSimulatedAPI(f *flags) (clientID, clientSecret string, envs []string, stop func(), err error) {
	sim, err := platformsim.New(platformsim.Config{Seed: 1})
	if err != nil {
		return "", "", nil, nil, fmt.Errorf("simulate: %w", err)
	}
	apiURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		sim.Close()
		return "", "", nil, nil, fmt.Errorf("simulate: starting the simulator: %w", err)
	}
	f.platform.APIURL, f.platform.AuthURL = apiURL, apiURL
	return platformsim.DemoClientID, platformsim.DemoClientSecret, simulatedEnvironments(f, sim), func() { _ = sim.Close() }, nil
}

// ingestActor returns the TLS ingest listener's server serving h as an
// actor of a run group: execute serves, interrupt shuts the server down
// and returns once the batches in flight are answered (at most 15 s).
func (s *simulation) ingestActor(h http.Handler, log *slog.Logger) (execute func() error, interrupt func(error)) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: cli.ServerErrorLog(log)}
	return func() error {
			if err := srv.Serve(s.ingest); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("simulate: serving the TLS ingest listener: %w", err)
			}
			return nil
		}, func(error) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		}
}

// Close stops the simulator.
func (s *simulation) Close() {
	_ = s.ingest.Close()
	_ = s.sim.Close()
}

// selfSignedCert returns a certificate for 127.0.0.1 and localhost, valid
// for a year, and a pool that trusts it.
func selfSignedCert() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("simulate: generating a key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "edgepipe rtld-receiver (simulate)"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("simulate: creating a certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("simulate: parsing the certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}
