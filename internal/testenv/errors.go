package testenv

import (
	"strings"
	"testing"
)

// CheckErr fails t unless err mentions every string of want, or, with want
// empty, unless err is nil. The table tests of the config types'
// withDefaults and validate use it.
func CheckErr(t testing.TB, err error, want []string) {
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

// CheckInOrder fails t unless text holds every string of want, each after
// the end of the one before (the lines of a command's output in their
// order), naming the first one missing. It reports whether all were found.
func CheckInOrder(t testing.TB, text string, want []string) bool {
	t.Helper()
	rest := text
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Errorf("output lacks %q (after the strings before it)", w)
			return false
		}
		rest = rest[i+len(w):]
	}
	return true
}
