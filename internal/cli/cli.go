// Package cli is the command-line layer the edgepipe programs share
// (cmd/exporter, cmd/rtld-receiver, cmd/platform-sim), so that they behave
// as one project:
//
//   - App: a kingpin application with --help (which also lists the flags
//     of the default command), --version (prometheus/common/version.Print
//     with the program's name), the promslog flags --log.level and
//     --log.format, the hidden --help-json (the command line as JSON, for
//     the generated reference: describe.go), and parse errors that name the
//     flag and end in "try --help".
//   - Platform: the flags and credentials saying where the platform's API
//     is (--api.url, --auth.url defaulting to it, --environment-id,
//     EDGEPIPE_CLIENT_ID and EDGEPIPE_CLIENT_SECRET or --client-secret-file).
//   - Secret: a credential read from a --…-file flag, a $…_FILE variable
//     or a variable, never from a flag value.
//   - Web: exporter-toolkit serving (--web.listen-address,
//     --web.config.file) with the landing page at /, /metrics with the
//     program's <namespace>_build_info, and client disconnects logged at
//     debug level; its Actor stops the server in a run group
//     (github.com/oklog/run).
//
// A program's main builds an App, adds its own flags and commands, calls
// Parse, and wires the parts together.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
)

// ErrPrinted is returned by Parse when the command line asked for --help,
// --version or --help-json, which Parse printed, and by Web.NewServer when
// --web.describe-metrics asked for the program's metrics, which it wrote:
// the program should exit with status 0.
var ErrPrinted = errors.New("help, version or description printed")

// FlagGroup is where flags are added: an *App, its *kingpin.Application or
// a *kingpin.CmdClause.
type FlagGroup interface {
	Flag(name, help string) *kingpin.FlagClause
}

// App is one program's command line. Add flags and commands to the
// embedded kingpin application, then call Parse.
type App struct {
	*kingpin.Application
	stdout io.Writer
	stderr io.Writer
	logCfg promslog.Config
	// exitCode is set when kingpin asked to terminate (after --help or
	// --version); kingpin's own os.Exit is replaced so that Parse returns.
	exitCode *int
}

// New returns the command line of program (the binary's name, e.g.
// "exporter"), described by help. Help and --version go to stdout, the
// logger built by Logger to stderr.
func New(program, help string, stdout, stderr io.Writer) *App {
	a := &App{Application: kingpin.New(program, help), stdout: stdout, stderr: stderr}
	a.HelpFlag.Short('h')
	a.UsageWriter(stdout)
	a.ErrorWriter(stderr)
	a.UsageTemplate(usageTemplate)
	a.Terminate(func(code int) { a.exitCode = &code })
	stampVersion.Do(func() {
		if version.Version == "" {
			version.Version = Version()
		}
	})
	a.Version(version.Print(program))
	promslogflag.AddFlags(a.Application, &a.logCfg)
	a.addHelpJSON()
	return a
}

// Parse parses args and returns the selected command (kingpin's
// FullCommand). Every error names the flag it is about and ends in
// "; try --help". After --help or --version it returns ErrPrinted.
func (a *App) Parse(args []string) (string, error) {
	a.nameFlagErrors()
	if err := a.checkFlagArguments(args); err != nil {
		return "", fmt.Errorf("%w; try --help", err)
	}
	cmd, err := a.Application.Parse(args)
	if a.exitCode != nil {
		if *a.exitCode != 0 {
			return "", fmt.Errorf("exit status %d; try --help", *a.exitCode)
		}
		return "", ErrPrinted
	}
	if err != nil {
		return "", fmt.Errorf("%w; try --help", err)
	}
	return cmd, nil
}

// Logger returns the logger --log.level and --log.format ask for (promslog,
// to stderr); call it after Parse.
func (a *App) Logger() *slog.Logger {
	cfg := a.logCfg
	cfg.Writer = a.stderr
	return promslog.New(&cfg)
}

// nameFlagErrors makes every flag's value name the flag in its errors, so
// that "--poll-interval=1" fails with `--poll-interval: time: missing unit
// in duration "1"` rather than without the flag's name.
func (a *App) nameFlagErrors() {
	m := a.Model()
	for _, f := range m.Flags {
		wrapValue(a.GetFlag(f.Name), f)
	}
	var walk func(cmd *kingpin.CmdClause, model *kingpin.CmdModel)
	walk = func(cmd *kingpin.CmdClause, model *kingpin.CmdModel) {
		for _, f := range model.Flags {
			wrapValue(cmd.GetFlag(f.Name), f)
		}
		for _, sub := range model.Commands {
			walk(cmd.GetCommand(sub.Name), sub)
		}
	}
	for _, c := range m.Commands {
		walk(a.GetCommand(c.Name), c)
	}
}

// checkFlagArguments finds a flag that needs a value given without one
// ("--poll-interval" last, or followed by another flag). kingpin reports
// that only when there is no default command: with one, it drops the flag
// silently and runs the default command.
func (a *App) checkFlagArguments(args []string) error {
	takesValue := map[string]bool{}
	add := func(flags []*kingpin.FlagModel) {
		for _, f := range flags {
			if !f.IsBoolFlag() {
				takesValue[f.Name] = true
			}
		}
	}
	m := a.Model()
	add(m.Flags)
	for _, c := range m.FlattenedCommands() {
		add(c.Flags)
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return nil
		}
		name, ok := strings.CutPrefix(arg, "--")
		if !ok || strings.Contains(name, "=") || !takesValue[name] {
			continue
		}
		if i+1 == len(args) || (strings.HasPrefix(args[i+1], "-") && args[i+1] != "-") {
			return fmt.Errorf("expected argument for flag '--%s'", name)
		}
		i++ // the flag's value
	}
	return nil
}

// wrapValue puts the value of clause, described by model, in a namedValue
// (once).
func wrapValue(clause *kingpin.FlagClause, model *kingpin.FlagModel) {
	if clause == nil {
		return
	}
	if _, done := model.Value.(namedValue); done {
		return
	}
	clause.SetValue(namedValue{name: model.Name, Value: model.Value})
}

// namedValue is a flag's value whose Set errors start with the flag's name.
// It keeps the two optional interfaces kingpin looks for.
type namedValue struct {
	name string
	kingpin.Value
}

// Set sets the value from s; an error names the flag.
func (v namedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return fmt.Errorf("--%s: %w", v.name, err)
	}
	return nil
}

// IsBoolFlag reports whether the flag takes no value (kingpin's boolFlag).
func (v namedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// IsCumulative reports whether the flag may repeat (kingpin's
// repeatableFlag).
func (v namedValue) IsCumulative() bool {
	r, ok := v.Value.(interface{ IsCumulative() bool })
	return ok && r.IsCumulative()
}

// SplitList splits every entry of vals on commas, trims the parts and drops
// the empty ones: "a,b" "c" → a b c.
func SplitList(vals ...string) []string {
	var out []string
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// stampVersion fills in prometheus/common/version.Version, once, for builds
// that were not stamped, so that --version, the landing page and build_info
// all show the same version.
var stampVersion sync.Once

// Version returns the version the build was stamped with (`make build`
// sets prometheus/common/version.Version), else the module's version when
// built with `go install …@version`, else "dev".
func Version() string {
	if version.Version != "" {
		return version.Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// usageTemplate is kingpin's default usage template with one addition: the
// top-level help also lists the flags of the default command, which run
// when no command is given.
const usageTemplate = `{{define "FormatCommand" -}}
{{if .FlagSummary}} {{.FlagSummary}}{{end -}}
{{range .Args}}{{if not .Hidden}} {{if not .Required}}[{{end}}{{if .PlaceHolder}}{{.PlaceHolder}}{{else}}<{{.Name}}>{{end}}{{if .Value|IsCumulative}}...{{end}}{{if not .Required}}]{{end}}{{end}}{{end -}}
{{end -}}

{{define "FormatCommands" -}}
{{range .FlattenedCommands -}}
{{if not .Hidden -}}
  {{.FullCommand}}{{if .Default}}*{{end}}{{template "FormatCommand" .}}
{{.Help|Wrap 4}}
{{end -}}
{{end -}}
{{end -}}

{{define "FormatUsage" -}}
{{template "FormatCommand" .}}{{if .Commands}} <command> [<args> ...]{{end}}
{{if .Help}}
{{.Help|Wrap 0 -}}
{{end -}}

{{end -}}

{{if .Context.SelectedCommand -}}
usage: {{.App.Name}} {{.Context.SelectedCommand}}{{template "FormatUsage" .Context.SelectedCommand}}
{{ else -}}
usage: {{.App.Name}}{{template "FormatUsage" .App}}
{{end}}
{{if .Context.Flags -}}
Flags:
{{.Context.Flags|FlagsToTwoColumns|FormatTwoColumns}}
{{end -}}
{{if not .Context.SelectedCommand -}}
{{range .App.Commands -}}
{{if and .Default .Flags -}}
Flags of the {{.Name}} command (the default: "{{$.App.Name}} [<flags>]" is "{{$.App.Name}} {{.Name}} [<flags>]"):
{{.Flags|FlagsToTwoColumns|FormatTwoColumns}}
{{end -}}
{{end -}}
{{end -}}
{{if .Context.Args -}}
Args:
{{.Context.Args|ArgsToTwoColumns|FormatTwoColumns}}
{{end -}}
{{if .Context.SelectedCommand -}}
{{if len .Context.SelectedCommand.Commands -}}
Subcommands:
{{template "FormatCommands" .Context.SelectedCommand}}
{{end -}}
{{else if .App.Commands -}}
Commands:
{{template "FormatCommands" .App}}
{{end -}}
`
