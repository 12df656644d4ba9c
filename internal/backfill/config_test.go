package backfill

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
	for _, tc := range []struct {
		name   string
		in     Config
		g      metricsapi.Granularity
		logger *slog.Logger
		tries  uint
	}{
		{"zero takes every default", Config{}, metricsapi.FiveMinutes, slog.Default(), DefaultMaxTries},
		{"set values are kept", Config{Granularity: metricsapi.Day, Logger: log, MaxTries: 1}, metricsapi.Day, log, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Granularity != tc.g || got.Logger != tc.logger || got.MaxTries != tc.tries || got.Now == nil {
				t.Errorf("got %+v", got)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	from := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want []string
	}{
		{"valid", func(*Config) {}, nil},
		{"unknown granularity", func(c *Config) { c.Granularity = "WEEK" }, []string{`unknown granularity "WEEK"`}},
		{"range upside down and no environments", func(c *Config) { c.From, c.To, c.Environments = c.To, c.From, nil },
			[]string{"need --from before --to", "no environments"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Environments: []string{"e"}, From: from, To: from.Add(time.Hour)}
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
	if _, _, err := Plan(Config{}); err == nil || !strings.Contains(err.Error(), "backfill: need --from") {
		t.Errorf("Plan of an empty Config: %v", err)
	}
}
