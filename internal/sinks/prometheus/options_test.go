package prometheus

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestOptionsWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	set := Options{SeriesTTL: time.Hour, GaugeMaxAge: time.Minute, Prefix: "cdn2", MaxSeries: 7, Logger: log}
	for _, tc := range []struct {
		name string
		in   Options
		want Options
	}{
		{"zero takes every default", Options{}, Options{SeriesTTL: DefaultSeriesTTL, GaugeMaxAge: DefaultGaugeMaxAge, Prefix: DefaultPrefix, Logger: slog.Default()}},
		{"set values are kept", set, set},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.withDefaults(); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"valid", Options{Prefix: "cdn_2"}, nil},
		{"negative durations and budget", Options{SeriesTTL: -time.Hour, MaxSeries: -1}, []string{"SeriesTTL -1h0m0s", "MaxSeries -1"}},
		{"prefix starting with a digit", Options{Prefix: "2cdn"}, []string{`prefix "2cdn"`}},
		{"prefix with a colon", Options{Prefix: "cdn:x"}, []string{`prefix "cdn:x"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.o.withDefaults().validate(), tc.want)
		})
	}
	if _, err := NewCollector(Options{Prefix: "a-b"}); err == nil || !strings.Contains(err.Error(), "invalid options") {
		t.Errorf("NewCollector with a bad prefix: %v", err)
	}
}
