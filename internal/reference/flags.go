package reference

import (
	"fmt"
	"strings"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/doclinks"
)

// flagsPage renders the flag reference of the program cl describes.
func flagsPage(cl *cli.CommandLine) []byte {
	p := newPage(fmt.Sprintf("the flag definitions of cmd/%s (`%s --help-json`)", cl.Name, cl.Name))
	p.para("# %s flags", cl.Name)
	for _, para := range strings.Split(cl.Help, "\n\n") {
		p.para("%s", inline(para))
	}
	p.para("`%s --help` prints these flags too, and `%s <command> --help` those of a command. "+
		"A flag is given as `--name=value`, a boolean flag as `--name` or `--no-name`; "+
		"a flag with an environment variable takes the variable's value when the flag is not given. "+
		"Repeatable flags may be given more than once.", cl.Name, cl.Name)

	slugs := doclinks.Slugger{}
	slugs.Slug(cl.Name + " flags") // the title's anchor
	commands := flattenCommands(cl.Commands)
	anchors := map[string]string{}
	if len(commands) > 0 {
		slugs.Slug("Commands")
		// The command headings come after "Flags of every command".
		slugs.Slug("Flags of every command")
		for _, c := range commands {
			anchors[c.Name] = slugs.Slug(c.Name)
		}
		var rows [][]string
		for _, c := range commands {
			name := fmt.Sprintf("[%s](#%s)", code(c.Name), anchors[c.Name])
			if c.Default {
				name += " (default)"
			}
			rows = append(rows, []string{name, inline(c.Help)})
		}
		p.para("## Commands")
		p.table([]string{"command", "description"}, rows)
		p.para("## Flags of every command")
	}
	flagTable(p, cl.Flags)
	for _, c := range commands {
		p.para("## %s", code(c.Name))
		if c.Default {
			p.para("The default command: `%s [<flags>]` is `%s %s [<flags>]`.", cl.Name, cl.Name, c.Name)
		}
		p.para("%s", inline(c.Help))
		for _, a := range c.Args {
			req := "optional"
			if a.Required {
				req = "required"
			}
			p.para("Argument %s (%s): %s", code("<"+a.Name+">"), req, inline(a.Help))
		}
		if len(c.Flags) > 0 {
			flagTable(p, c.Flags)
		}
	}
	secretTable(p, cl)
	return p.bytes()
}

// flattenCommands lists cmds and their subcommands, depth first, without
// kingpin's own help command (--help says the same).
func flattenCommands(cmds []cli.Command) []cli.Command {
	var out []cli.Command
	for _, c := range cmds {
		if c.Name == "help" {
			continue
		}
		out = append(out, c)
		out = append(out, flattenCommands(c.Commands)...)
	}
	return out
}

// flagTable writes the table of flags.
func flagTable(p *page, flags []cli.Flag) {
	var rows [][]string
	for _, f := range flags {
		name := code("--" + f.Name)
		if f.Short != "" {
			name += ", " + code("-"+f.Short)
		}
		env := code(f.Envar)
		if f.SecretEnv != "" {
			env = "instead: " + codeList([]string{f.SecretEnv, f.SecretEnv + "_FILE"})
		}
		rows = append(rows, []string{name, flagValue(f), codeList(flagDefault(f)), env, inline(f.Help)})
	}
	p.table([]string{"flag", "value", "default", "environment", "description"}, rows)
}

// flagValue says what a flag takes.
func flagValue(f cli.Flag) string {
	v := f.Type
	switch {
	case f.Type == "bool":
		v = "boolean"
	case f.PlaceHolder != "":
		v = code(f.PlaceHolder)
	}
	if f.Repeatable {
		v += ", repeatable"
	}
	if f.Required {
		v += ", required"
	}
	return v
}

// flagDefault is a flag's default; a boolean flag without one is false.
func flagDefault(f cli.Flag) []string {
	if len(f.Default) == 0 && f.Type == "bool" {
		return []string{"false"}
	}
	return f.Default
}

// secretTable lists where each secret comes from: never from a flag's
// value, but from a variable, a file named by <variable>_FILE or a file
// named by a flag.
func secretTable(p *page, cl *cli.CommandLine) {
	seen := map[string]bool{}
	var rows [][]string
	add := func(flags []cli.Flag) {
		for _, f := range flags {
			if f.SecretEnv == "" || seen[f.SecretEnv] {
				continue
			}
			seen[f.SecretEnv] = true
			rows = append(rows, []string{code(f.SecretEnv), code(f.SecretEnv + "_FILE"), code("--" + f.Name)})
		}
	}
	add(cl.Flags)
	for _, c := range flattenCommands(cl.Commands) {
		add(c.Flags)
	}
	if len(rows) == 0 {
		return
	}
	p.para("## Secrets")
	p.para("Secrets never come from a flag's value, which every user of the machine can read in the process list. " +
		"Each comes from the first of: the file its flag names, the file its `…_FILE` variable names, the variable. " +
		"A trailing newline of a file is dropped. The flags' descriptions above name the user names and IDs that go with them.")
	p.table([]string{"variable", "or the file named by", "or the file named by the flag"}, rows)
}

// title is the first heading of a generated page, for the index.
func title(md []byte) string {
	for _, line := range strings.Split(string(md), "\n") {
		if t, ok := strings.CutPrefix(line, "# "); ok {
			return t
		}
	}
	return ""
}
