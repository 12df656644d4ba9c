package receiver

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestConfigWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name                 string
		in                   Config
		grace, save          time.Duration
		logger               *slog.Logger
		maxBody, maxInFlight int64
	}{
		{"zero takes every default", Config{}, DefaultGapGrace, DefaultGapSaveInterval, slog.Default(), rtld.DefaultMaxBodyBytes, rtld.DefaultMaxInFlight},
		{"set values are kept", Config{GapGrace: time.Minute, GapSaveInterval: time.Second, Logger: log,
			Ingest: rtld.IngestConfig{MaxBodyBytes: 1 << 20, MaxInFlight: 3}}, time.Minute, time.Second, log, 1 << 20, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.GapGrace != tc.grace || got.GapSaveInterval != tc.save || got.Logger != tc.logger ||
				got.Ingest.MaxBodyBytes != tc.maxBody || int64(got.Ingest.MaxInFlight) != tc.maxInFlight {
				t.Errorf("got grace %s, save %s, logger %p, ingest %+v", got.GapGrace, got.GapSaveInterval, got.Logger, got.Ingest)
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
		{"no spool directory", func(c *Config) { c.SpoolDir = "" }, []string{"no spool directory"}},
		{"negative gap settings", func(c *Config) { c.GapGrace, c.GapSaveInterval = -time.Minute, -time.Second }, []string{"GapGrace -1m0s", "GapSaveInterval -1s"}},
		{"an ingest problem is named as such", func(c *Config) { c.Ingest.MaxInFlight = -1 }, []string{"ingest: MaxInFlight -1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{SpoolDir: t.TempDir()}
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(Config{SpoolDir: t.TempDir(), GapGrace: -time.Second}); err == nil || !strings.Contains(err.Error(), "invalid configuration") {
		t.Errorf("New with a negative GapGrace: %v", err)
	}
	// The log metrics' settings are checked before anything is opened.
	dir := filepath.Join(t.TempDir(), "spool")
	_, err := New(Config{SpoolDir: dir, LogMetrics: &logmetrics.Config{Labels: []string{"path"}, MaxSeries: -1}})
	testenv.CheckErr(t, err, []string{"log metrics", `label "path"`, "MaxSeries -1"})
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused configuration created the spool: %v", err)
	}
}

func TestWithLogMetricsFields(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		fields, labels []string
		want           string
	}{
		{nil, nil, "[]"}, // every field the platform lists
		{[]string{"uuid", "pop", "status_code"}, nil, "[uuid pop status_code cache_status bytes_out total_time]"},
		{[]string{"uuid"}, []string{logmetrics.LabelHost}, "[uuid status_code cache_status bytes_out total_time host]"},
	} {
		if got := fmt.Sprint(withLogMetricsFields(tc.fields, tc.labels, log)); got != tc.want {
			t.Errorf("fields %v, labels %v: %s, want %s", tc.fields, tc.labels, got, tc.want)
		}
	}
}
