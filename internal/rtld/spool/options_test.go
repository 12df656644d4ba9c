package spool

import (
	"log/slog"
	"testing"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestOptionsWithDefaults(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name    string
		in      Options
		segment int64
		logger  *slog.Logger
	}{
		{"zero: default segment size and logger", Options{}, DefaultSegmentBytes, slog.Default()},
		{"the segment size follows the bound", Options{MaxBytes: 64 << 20}, 4 << 20, slog.Default()},
		{"set values are kept", Options{MaxBytes: 64 << 20, SegmentBytes: 3 << 20, Logger: log}, 3 << 20, log},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.SegmentBytes != tc.segment || got.Logger != tc.logger || got.MaxBytes != tc.in.MaxBytes {
				t.Errorf("got segment %d, logger %p, max %d", got.SegmentBytes, got.Logger, got.MaxBytes)
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
		{"unbounded", Options{Dir: "d"}, nil},
		{"bound with room for two segments", Options{Dir: "d", MaxBytes: MinMaxBytes(1<<20, 1<<20), SegmentBytes: 1 << 20, MaxEntryBytes: 1 << 20}, nil},
		{"bound without room for two segments", Options{Dir: "d", MaxBytes: MinMaxBytes(1<<20, 1<<20) - 1, SegmentBytes: 1 << 20, MaxEntryBytes: 1 << 20}, []string{"cannot work"}},
		{"no directory", Options{}, []string{"no directory"}},
		{"negative sizes", Options{Dir: "d", MaxBytes: -1, MaxEntryBytes: -2}, []string{"MaxBytes -1", "MaxEntryBytes -2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckErr(t, tc.o.withDefaults().validate(), tc.want)
		})
	}
}
