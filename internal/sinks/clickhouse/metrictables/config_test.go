package metrictables

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestSinkConfigWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name                              string
		in                                SinkConfig
		backfill, insertTimeout, retryMax time.Duration
		queueRows                         int
		logger                            *slog.Logger
	}{
		{"zero takes every default", SinkConfig{}, DefaultMaxBackfill, DefaultInsertTimeout, DefaultRetryMax, DefaultQueueRows, slog.Default()},
		{"set values are kept", SinkConfig{MaxBackfill: time.Hour, InsertTimeout: time.Second, RetryMax: time.Minute, QueueRows: 10, Logger: log},
			time.Hour, time.Second, time.Minute, 10, log},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.MaxBackfill != tc.backfill || got.InsertTimeout != tc.insertTimeout || got.RetryMax != tc.retryMax ||
				got.QueueRows != tc.queueRows || got.Logger != tc.logger || got.Now == nil {
				t.Errorf("got %+v", got)
			}
		})
	}
}

func TestSinkConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    SinkConfig
		want []string
	}{
		{"valid", SinkConfig{DSN: "clickhouse://127.0.0.1:9000/cdn"}, nil},
		{"no DSN", SinkConfig{}, []string{"no DSN"}},
		{"HTTP", SinkConfig{DSN: "http://h:8123/cdn"}, nil},
		{"HTTPS with TLS options", SinkConfig{DSN: "https://h:8443/cdn?secure=true", TLS: clickhouse.TLSOptions{ServerName: "ch"}}, nil},
		{"not a ClickHouse DSN", SinkConfig{DSN: "ftp://h/cdn"}, []string{"want clickhouse://HOST:9000/DB"}},
		{"TLS options without TLS", SinkConfig{DSN: "http://h:8123/cdn", TLS: clickhouse.TLSOptions{InsecureSkipVerify: true}}, []string{"TLS options need a DSN with TLS"}},
		{"a cluster over HTTP", SinkConfig{DSN: "http://h:8123/cdn", Cluster: "c"}, []string{"needs the native protocol"}},
		{"negative settings", SinkConfig{DSN: "clickhouse://h/cdn", Retention: -time.Hour, QueueRows: -1, InsertQuorum: -2},
			[]string{"Retention -1h0m0s", "QueueRows -1", "InsertQuorum -2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := NewSink(SinkConfig{}); err == nil || !strings.Contains(err.Error(), "invalid configuration: no DSN") {
		t.Errorf("NewSink without a DSN: %v", err)
	}
}
