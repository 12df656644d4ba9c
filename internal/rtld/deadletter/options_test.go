package deadletter

import (
	"log/slog"
	"testing"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestOptionsWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name   string
		in     Options
		max    int64
		logger *slog.Logger
	}{
		{"zero takes every default", Options{Dir: "d"}, DefaultMaxBytes, slog.Default()},
		{"set values are kept", Options{Dir: "d", MaxBytes: 5, Logger: log}, 5, log},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.MaxBytes != tc.max || got.Logger != tc.logger || got.Dir != "d" {
				t.Errorf("got %+v", got)
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
		{"valid", Options{Dir: "d"}, nil},
		{"no directory", Options{}, []string{"no directory"}},
		{"negative bound", Options{Dir: "d", MaxBytes: -1}, []string{"MaxBytes -1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.o.withDefaults().validate(), tc.want)
		})
	}
}
