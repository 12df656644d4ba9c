package delivery

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// nopReader is a SpoolReader for configuration tests; it is never read.
type nopReader struct{}

func (nopReader) Next(context.Context, int, int64) ([]spool.Entry, error) { return nil, nil }
func (nopReader) Commit(spool.Position) error                             { return nil }

func TestWorkerWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		in   Worker
		want Worker
	}{
		{"zero takes every default", Worker{},
			Worker{Log: slog.Default(), MaxBatches: DefaultMaxBatches, MaxBytes: DefaultMaxBytes, MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff}},
		{"set values are kept", Worker{Log: log, MaxBatches: 2, MaxBytes: 3, MinBackoff: time.Millisecond, MaxBackoff: time.Second},
			Worker{Log: log, MaxBatches: 2, MaxBytes: 3, MinBackoff: time.Millisecond, MaxBackoff: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Log != tc.want.Log || got.MaxBatches != tc.want.MaxBatches || got.MaxBytes != tc.want.MaxBytes ||
				got.MinBackoff != tc.want.MinBackoff || got.MaxBackoff != tc.want.MaxBackoff {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestWorkerValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Worker)
		want []string
	}{
		{"valid", func(*Worker) {}, nil},
		{"nothing to work with", func(w *Worker) { *w = Worker{} }, []string{"no name", "no spool reader", "no metrics", "no sink"}},
		{"negative bounds", func(w *Worker) { w.MaxBatches = -1 }, []string{"MaxBatches -1"}},
		{"backoff upside down", func(w *Worker) { w.MinBackoff, w.MaxBackoff = time.Second, time.Millisecond }, []string{"backoff from 1s to 1ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Worker{Name: "x", Sink: &flakySink{}, Reader: nopReader{}, Metrics: NewMetrics(prometheus.NewRegistry())}
			tc.mut(&w)
			testenv.CheckErr(t, w.withDefaults().validate(), tc.want)
		})
	}
	if err := (&Worker{}).Run(t.Context()); err == nil || !strings.Contains(err.Error(), "invalid configuration") {
		t.Errorf("Run of an empty Worker: %v", err)
	}
}

func TestDelivererDefaultsAndValidate(t *testing.T) {
	d := Deliverer{Sink: &flakySink{}}.withDefaults()
	if d.MinBackoff != DefaultMinBackoff || d.MaxBackoff != DefaultMaxBackoff {
		t.Errorf("defaults: %s, %s", d.MinBackoff, d.MaxBackoff)
	}
	for _, tc := range []struct {
		name string
		d    Deliverer
		want []string
	}{
		{"valid", Deliverer{Sink: &flakySink{}}, nil},
		{"no sink", Deliverer{}, []string{"no sink"}},
		{"a maximum below the default minimum", Deliverer{Sink: &flakySink{}, MaxBackoff: time.Millisecond}, []string{"want 0 < MinBackoff <= MaxBackoff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.d.withDefaults().validate(), tc.want)
		})
	}
	if _, err := (&Deliverer{}).Deliver(t.Context(), nil, nil); err == nil || !strings.Contains(err.Error(), "invalid configuration") {
		t.Errorf("Deliver of an empty Deliverer: %v", err)
	}
}
