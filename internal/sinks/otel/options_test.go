package otel

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestOptionsWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		in   Options
		want Options
	}{
		{"zero takes every default", Options{}, Options{QueueSize: DefaultQueueSize, MaxPoints: DefaultMaxPoints, ExportTimeout: DefaultExportTimeout,
			InitialBackoff: DefaultInitialBackoff, MaxBackoff: DefaultMaxBackoff, MaxRetryElapsed: DefaultMaxRetryElapsed, Prefix: DefaultPrefix,
			Temporality: metricdata.CumulativeTemporality, Logger: slog.Default()}},
		{"set values are kept", Options{QueueSize: 1, MaxPoints: 2, ExportTimeout: 3 * time.Second, InitialBackoff: time.Millisecond, MaxBackoff: time.Second,
			MaxRetryElapsed: time.Minute, Prefix: "x", Temporality: metricdata.DeltaTemporality, Logger: log},
			Options{QueueSize: 1, MaxPoints: 2, ExportTimeout: 3 * time.Second, InitialBackoff: time.Millisecond, MaxBackoff: time.Second,
				MaxRetryElapsed: time.Minute, Prefix: "x", Temporality: metricdata.DeltaTemporality, Logger: log}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Resource == nil {
				t.Error("no resource")
			}
			got.Resource = nil
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
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
		{"valid", Options{}, nil},
		{"negative sizes and durations", Options{QueueSize: -1, ExportTimeout: -time.Second}, []string{"QueueSize -1", "ExportTimeout -1s"}},
		{"a maximum backoff below the default initial one", Options{MaxBackoff: time.Millisecond}, []string{"backoff from 1s to 1ms"}},
		{"unknown temporality", Options{Temporality: 7}, []string{"want cumulative or delta"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.o.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(nil, Options{QueueSize: -1}); err == nil || !strings.Contains(err.Error(), "otlp sink: invalid options") {
		t.Errorf("New with a negative queue: %v", err)
	}
}
