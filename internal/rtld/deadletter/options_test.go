package deadletter

import (
	"log/slog"
	"strings"
	"testing"
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
			checkErr(t, tc.o.withDefaults().validate(), tc.want)
		})
	}
}

// checkErr fails unless err contains every string of want (want empty: err
// is nil).
func checkErr(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}
