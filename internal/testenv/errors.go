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
