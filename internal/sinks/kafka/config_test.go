package kafka

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestConfigWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	set := Config{Brokers: []string{"b:9092"}, Topic: "t", Compression: "zstd", Partitions: 2, ReplicationFactor: 3,
		MaxMessageBytes: 4 << 20, WriteTimeout: time.Second, Logger: log}
	for _, tc := range []struct {
		name string
		in   Config
		want Config
	}{
		{"zero takes every default", Config{}, Config{Topic: DefaultTopic, Compression: DefaultCompression, Partitions: DefaultPartitions,
			ReplicationFactor: DefaultReplicationFactor, MaxMessageBytes: DefaultMaxMessageBytes, WriteTimeout: DefaultWriteTimeout, Logger: slog.Default()}},
		{"set values are kept", set, set},
		{"the broker's partition default is kept", Config{Partitions: -1}, Config{Topic: DefaultTopic, Compression: DefaultCompression, Partitions: -1,
			ReplicationFactor: DefaultReplicationFactor, MaxMessageBytes: DefaultMaxMessageBytes, WriteTimeout: DefaultWriteTimeout, Logger: slog.Default()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Topic != tc.want.Topic || got.Compression != tc.want.Compression || got.Partitions != tc.want.Partitions ||
				got.ReplicationFactor != tc.want.ReplicationFactor || got.MaxMessageBytes != tc.want.MaxMessageBytes ||
				got.WriteTimeout != tc.want.WriteTimeout || got.Logger != tc.want.Logger {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want []string
	}{
		{"valid", func(*Config) {}, nil},
		{"broker defaults for partitions and replicas", func(c *Config) { c.Partitions, c.ReplicationFactor = -1, -1 }, nil},
		{"no brokers", func(c *Config) { c.Brokers = nil }, []string{"no brokers"}},
		{"unknown compression", func(c *Config) { c.Compression = "brotli" }, []string{`unknown Kafka compression "brotli"`}},
		{"impossible partitions and replicas", func(c *Config) { c.Partitions, c.ReplicationFactor = -2, -3 },
			[]string{"-2 partitions", "replication factor -3"}},
		{"message limit without room", func(c *Config) { c.MaxMessageBytes = 1000 }, []string{"leaves no room"}},
		{"negative timeout", func(c *Config) { c.WriteTimeout = -time.Second }, []string{"write timeout -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Brokers: []string{"127.0.0.1:9092"}}
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "kafka sink: invalid configuration: no brokers") {
		t.Errorf("New without brokers: %v", err)
	}
}
