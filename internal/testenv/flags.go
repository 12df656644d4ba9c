package testenv

import (
	"slices"

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
