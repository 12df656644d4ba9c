package logtable

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

func TestConfigWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	fields := accesslog.Fields()[:2]
	for _, tc := range []struct {
		name        string
		in          Config
		fields      []accesslog.Field
		logger      *slog.Logger
		timeout     time.Duration
		concurrency int
	}{
		{"zero takes every default", Config{}, accesslog.Fields(), slog.Default(), DefaultInsertTimeout, DefaultConcurrency},
		{"set values are kept", Config{Fields: fields, Logger: log, InsertTimeout: time.Second, Concurrency: 4}, fields, log, time.Second, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if !slices.Equal(got.Fields, tc.fields) || got.Logger != tc.logger || got.InsertTimeout != tc.timeout || got.Concurrency != tc.concurrency {
				t.Errorf("got %d fields, logger %p, timeout %s, concurrency %d", len(got.Fields), got.Logger, got.InsertTimeout, got.Concurrency)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want []string
	}{
		{"valid", Config{DSN: "clickhouse://127.0.0.1:9000/db"}, nil},
		{"no DSN", Config{}, []string{"no DSN"}},
		{"negative settings", Config{DSN: "clickhouse://h/db", InsertTimeout: -time.Second, Concurrency: -1, Retention: -time.Hour},
			[]string{"insert timeout -1s", "concurrency -1", "retention -1h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "invalid configuration: no DSN") {
		t.Errorf("New without a DSN: %v", err)
	}
}
