package sandbox

import (
	"fmt"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is a single Kafka broker (franz-go's kfake) in this process: the
// Kafka protocol on loopback, topics created on first use, records in
// memory.
type Kafka struct {
	cluster *kfake.Cluster
	addr    string
}

// StartKafka starts a broker listening on addr (host:port on loopback).
func StartKafka(addr string) (*Kafka, error) {
	p, err := port(addr)
	if err != nil {
		return nil, err
	}
	c, err := kfake.NewCluster(
		kfake.Ports(p),
		kfake.AllowAutoTopicCreation(),
		kfake.ClusterID("edgepipe-sandbox"),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka broker (kfake) on %s: %w", addr, err)
	}
	return &Kafka{cluster: c, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))}, nil
}

// Addr is the broker's host:port, the bootstrap broker list.
func (k *Kafka) Addr() string { return k.addr }

// Close stops the broker.
func (k *Kafka) Close() { k.cluster.Close() }

// FreeAddr returns a loopback address with a port free right now.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
