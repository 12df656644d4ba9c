package testenv

import (
	"regexp"
	"slices"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

// FlagNames returns the names of the flags --help shows for m: the
// application's and those of the commands named (by FullCommand), hidden
// flags left out.
func FlagNames(m *kingpin.ApplicationModel, commands ...string) []string {
	var names []string
	add := func(flags []*kingpin.FlagModel) {
		for _, f := range flags {
			if !f.Hidden {
				names = append(names, f.Name)
			}
		}
	}
	add(m.Flags)
	for _, c := range m.FlattenedCommands() {
		if slices.Contains(commands, c.FullCommand) {
			add(c.Flags)
		}
	}
	return names
}

// CheckHelp runs bin with args (ending in --help) and fails t unless it
// exits 0 with nothing on stderr and its help lists every flag of names,
// which must hold at least minFlags (so an empty flag model cannot pass).
func CheckHelp(t *testing.T, bin string, args, names []string, minFlags int) {
	t.Helper()
	if len(names) < minFlags {
		t.Fatalf("only %d flags in the model, want at least %d: %v", len(names), minFlags, names)
	}
	stdout, stderr, code := RunCommand(t, bin, args)
	if code != 0 || stderr != "" {
		t.Fatalf("%v: exit %d, stderr %q", args, code, stderr)
	}
	for _, n := range names {
		if !regexp.MustCompile(`--(\[no-\])?` + regexp.QuoteMeta(n) + `[= \n]`).MatchString(stdout) {
			t.Errorf("%v: --%s not listed", args, n)
		}
	}
	if t.Failed() {
		t.Logf("help:\n%s", stdout)
	}
}
