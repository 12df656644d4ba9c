package schedule

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

func TestConfigWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	tr := NewTracker(FirstStart)
	for _, tc := range []struct {
		name                    string
		in                      Config
		g                       metricsapi.Granularity
		poll, settle, disc, ttl time.Duration
		concurrency             int
		logger                  *slog.Logger
		tracker                 *Tracker // nil: a new one
	}{
		{"zero takes every default", Config{}, metricsapi.FiveMinutes, DefaultPollInterval, 30 * time.Minute, DefaultDiscoveryInterval,
			DefaultSeriesTTL, DefaultConcurrency, slog.Default(), nil},
		{"the settle window follows the granularity", Config{Granularity: metricsapi.Hour}, metricsapi.Hour, DefaultPollInterval, 3 * time.Hour,
			DefaultDiscoveryInterval, DefaultSeriesTTL, DefaultConcurrency, slog.Default(), nil},
		{"set values are kept", Config{Granularity: metricsapi.Day, PollInterval: time.Second, SettleWindow: time.Hour, DiscoveryInterval: time.Minute,
			SeriesTTL: time.Hour, Concurrency: 9, Logger: log, Tracker: tr}, metricsapi.Day, time.Second, time.Hour, time.Minute, time.Hour, 9, log, tr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Granularity != tc.g || got.PollInterval != tc.poll || got.SettleWindow != tc.settle || got.DiscoveryInterval != tc.disc ||
				got.SeriesTTL != tc.ttl || got.Concurrency != tc.concurrency || got.Logger != tc.logger {
				t.Errorf("got %+v", got)
			}
			if got.Observer == nil || got.Clock == nil || got.Tracker == nil || (tc.tracker != nil && got.Tracker != tc.tracker) {
				t.Errorf("observer %v, clock %v, tracker %p (want %p)", got.Observer, got.Clock, got.Tracker, tc.tracker)
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
		{"no sources", func(c *Config) { c.DatasetSource, c.Fetcher = nil, nil }, []string{"DatasetSource, Environments and Fetcher are required"}},
		{"unknown granularity", func(c *Config) { c.Granularity = "WEEK" }, []string{`unknown granularity "WEEK"`}},
		{"negative intervals", func(c *Config) { c.PollInterval, c.SeriesTTL, c.Jitter = -time.Minute, -time.Hour, -time.Second },
			[]string{"PollInterval -1m0s", "SeriesTTL -1h0m0s", "Jitter -1s"}},
		{"negative concurrency", func(c *Config) { c.Concurrency = -1 }, []string{"Concurrency -1"}},
		{"a publisher without a name", func(c *Config) { c.Publishers = []NamedPublisher{{Publisher: newCounter()}} }, []string{"needs a name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI()
			c := Config{DatasetSource: api, Environments: &staticEnvs{}, Fetcher: api}
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "schedule: invalid configuration") {
		t.Errorf("New without sources: %v", err)
	}
}
