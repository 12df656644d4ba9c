package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// TLSFiles names the PEM files of a TLS connection to the brokers.
type TLSFiles struct {
	// CAFile holds the CA certificates the brokers' certificates must chain
	// to; empty means the system's trust store.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (mutual
	// TLS); both or neither.
	CertFile, KeyFile string
	// InsecureSkipVerify accepts any broker certificate. For testing only:
	// it makes the connection open to interception.
	InsecureSkipVerify bool
}

// Config returns the client TLS configuration (TLS 1.2 or newer) the files
// describe, or an error naming the file that cannot be used.
func (f TLSFiles) Config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify} //nolint:gosec // opt-in, documented as for testing
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka TLS CA file %s: no PEM certificate in it", f.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka TLS client certificate %s / key %s: %w", f.CertFile, f.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, errors.New("kafka TLS: a client certificate needs both the cert file and the key file")
	}
	return c, nil
}

// SASL mechanism names accepted by SASLMechanism (flag values).
const (
	SASLNone        = "none"
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
)

// SASLMechanisms lists the accepted mechanism names.
var SASLMechanisms = []string{SASLNone, SASLPlain, SASLScramSHA256, SASLScramSHA512}

// SASLMechanism returns kafka-go's mechanism for name (see SASLMechanisms,
// case-insensitive) with the given credentials, or nil for "none" or "".
// Credentials are required for every other mechanism.
func SASLMechanism(name, username, password string) (sasl.Mechanism, error) {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" || name == SASLNone {
		return nil, nil
	}
	if username == "" || password == "" {
		return nil, fmt.Errorf("kafka SASL %s needs a username and a password (EDGEPIPE_KAFKA_USERNAME, EDGEPIPE_KAFKA_PASSWORD or their _FILE variants)", name)
	}
	switch name {
	case SASLPlain:
		return plain.Mechanism{Username: username, Password: password}, nil
	case SASLScramSHA256, SASLScramSHA512:
		algo := scram.SHA256
		if name == SASLScramSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, username, password)
		if err != nil {
			return nil, fmt.Errorf("kafka SASL %s: %w", name, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown Kafka SASL mechanism %q (%s)", name, strings.Join(SASLMechanisms, ", "))
}

// trackedMechanism numbers SASL exchanges and remembers the newest one that
// completed. Some brokers (and kfake) answer bad credentials by closing the
// connection, which reaches the writer as a bare "unexpected EOF"; when the
// newest exchange never completed, such an EOF is an authentication failure.
// A later successful exchange clears that state.
type trackedMechanism struct {
	sasl.Mechanism
	started   atomic.Int64 // number of the newest exchange
	completed atomic.Int64 // number of the newest completed exchange
}

// Start begins an exchange (sasl.Mechanism).
func (m *trackedMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sm, ir, err := m.Mechanism.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &trackedSession{StateMachine: sm, m: m, id: m.started.Add(1)}, ir, nil
}

// unfinished reports whether the newest exchange has not completed.
func (m *trackedMechanism) unfinished() bool {
	return m != nil && m.completed.Load() < m.started.Load()
}

type trackedSession struct {
	sasl.StateMachine
	m  *trackedMechanism
	id int64
}

// Next continues the exchange (sasl.StateMachine).
func (s *trackedSession) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := s.StateMachine.Next(ctx, challenge)
	if done && err == nil {
		for {
			c := s.m.completed.Load()
			if c >= s.id || s.m.completed.CompareAndSwap(c, s.id) {
				break
			}
		}
	}
	return done, resp, err
}
