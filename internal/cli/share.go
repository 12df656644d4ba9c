package cli

import "github.com/alecthomas/kingpin/v2"

// ShareFlags gives cmd every flag of from, as declared so far: the same
// name, help, default, variable, placeholder and visibility, bound to the
// same value, so cmd takes exactly the flags from takes and its parsed
// values land where from's would (a `check` command taking the flags of
// `run`). kingpin sets only the chosen command's flags and defaults, so
// the shared variables hold the values of whichever of the two ran.
func ShareFlags(cmd, from *kingpin.CmdClause) {
	for _, m := range from.Model().Flags {
		f := cmd.Flag(m.Name, m.Help).Default(m.Default...)
		f.SetValue(m.Value)
		if m.Envar != "" {
			f.Envar(m.Envar)
		}
		if m.PlaceHolder != "" {
			f.PlaceHolder(m.PlaceHolder)
		}
		if m.Short != 0 {
			f.Short(m.Short)
		}
		if m.Required {
			f.Required()
		}
		if m.Hidden {
			f.Hidden()
		}
	}
}
