package version

import (
	"strings"
	"testing"
)

func TestPrint(t *testing.T) {
	got := Print("exporter")
	t.Log(got)
	if !strings.HasPrefix(got, "exporter ") || !strings.Contains(got, Get().GoVersion) {
		t.Fatalf("Print: %q", got)
	}
	if Get().Version == "" {
		t.Fatal("empty version")
	}
}
