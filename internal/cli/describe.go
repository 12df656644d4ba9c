package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// This file is what the programs tell the reference generator
// (internal/reference, `make docs`) about themselves, through two hidden
// flags every program has:
//
//   - --help-json prints the command line (CommandLine) and exits, as
//     kingpin's own hidden --help-man prints a man page;
//   - --web.describe-metrics=FILE makes Web.NewServer write every metric
//     family the program's registry can expose ([]MetricFamily) to FILE once
//     the program has started up, and return ErrPrinted instead of serving.
//
// Neither changes what a program does without them.

// CommandLine is a program's command line: what --help shows, in full.
type CommandLine struct {
	Name     string    `json:"name"`
	Help     string    `json:"help"`
	Flags    []Flag    `json:"flags"`
	Commands []Command `json:"commands,omitempty"`
}

// Command is one command (or subcommand) and its flags.
type Command struct {
	// Name is the full command, e.g. "dead-letter replay".
	Name     string    `json:"name"`
	Help     string    `json:"help"`
	Default  bool      `json:"default,omitempty"`
	Flags    []Flag    `json:"flags,omitempty"`
	Args     []Arg     `json:"args,omitempty"`
	Commands []Command `json:"commands,omitempty"`
}

// Flag is one flag.
type Flag struct {
	Name        string   `json:"name"`
	Help        string   `json:"help"`
	Short       string   `json:"short,omitempty"`
	Default     []string `json:"default,omitempty"`
	Envar       string   `json:"envar,omitempty"`
	PlaceHolder string   `json:"placeholder,omitempty"`
	Required    bool     `json:"required,omitempty"`
	// Type is the kind of value: bool, string, int, float, duration,
	// bytes, enum, file (of a secret) or value (anything else).
	Type string `json:"type"`
	// Repeatable flags may be given more than once.
	Repeatable bool `json:"repeatable,omitempty"`
	// SecretEnv is, for the file flag of a Secret, the variable the secret
	// comes from without the flag ($<SecretEnv>_FILE names a file too).
	SecretEnv string `json:"secret_env,omitempty"`
}

// Arg is a positional argument.
type Arg struct {
	Name     string `json:"name"`
	Help     string `json:"help"`
	Required bool   `json:"required,omitempty"`
}

// addHelpJSON adds the hidden --help-json flag to a.
func (a *App) addHelpJSON() {
	a.Flag("help-json", "Print the command line (commands, flags, defaults, environment variables) as JSON, for docs/reference (make docs).").
		Hidden().PreAction(func(*kingpin.ParseContext) error {
		if err := writeJSON(a.stdout, DescribeCommandLine(a.Model())); err != nil {
			return err
		}
		zero := 0 // as kingpin's hidden --help-man: terminate with status 0
		a.exitCode = &zero
		return nil
	}).Bool()
}

// DescribeCommandLine returns the command line m describes, without hidden
// flags and commands.
func DescribeCommandLine(m *kingpin.ApplicationModel) CommandLine {
	cl := CommandLine{Name: m.Name, Help: m.Help, Flags: describeFlags(m.Flags)}
	cl.Commands = describeCommands(m.Commands)
	return cl
}

func describeCommands(cmds []*kingpin.CmdModel) []Command {
	var out []Command
	for _, c := range cmds {
		if c.Hidden {
			continue
		}
		cmd := Command{Name: c.FullCommand, Help: c.Help, Default: c.Default, Flags: describeFlags(c.Flags),
			Commands: describeCommands(c.Commands)}
		for _, a := range c.Args {
			if !a.Hidden {
				cmd.Args = append(cmd.Args, Arg{Name: a.Name, Help: a.Help, Required: a.Required})
			}
		}
		out = append(out, cmd)
	}
	return out
}

func describeFlags(flags []*kingpin.FlagModel) []Flag {
	var out []Flag
	for _, f := range flags {
		if f.Hidden {
			continue
		}
		fl := Flag{Name: f.Name, Help: f.Help, Default: f.Default, Envar: f.Envar, PlaceHolder: f.PlaceHolder,
			Required: f.Required, Repeatable: isCumulative(f.Value), Type: valueType(f.Value)}
		if f.Short != 0 {
			fl.Short = string(f.Short)
		}
		if s, ok := unwrapValue(f.Value).(secretFile); ok {
			fl.SecretEnv = s.s.env
		}
		out = append(out, fl)
	}
	return out
}

// isCumulative reports whether a flag with value v may repeat (kingpin's
// repeatableFlag).
func isCumulative(v kingpin.Value) bool {
	r, ok := v.(interface{ IsCumulative() bool })
	return ok && r.IsCumulative()
}

// unwrapValue returns the value a namedValue wraps.
func unwrapValue(v kingpin.Value) kingpin.Value {
	if n, ok := v.(namedValue); ok {
		return n.Value
	}
	return v
}

// valueType names the kind of a flag's value from kingpin's value types.
func valueType(v kingpin.Value) string {
	v = unwrapValue(v)
	if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return "bool"
	}
	switch name := strings.TrimPrefix(fmt.Sprintf("%T", v), "*"); name {
	case "cli.secretFile":
		return "file"
	case "kingpin.stringValue", "kingpin.accumulator":
		return "string"
	case "kingpin.intValue", "kingpin.int64Value", "kingpin.uintValue", "kingpin.uint64Value":
		return "int"
	case "kingpin.float64Value", "kingpin.float32Value":
		return "float"
	case "kingpin.durationValue", "model.Duration":
		return "duration"
	case "kingpin.bytesValue", "units.Base2Bytes":
		return "bytes"
	case "kingpin.enumValue", "kingpin.enumsValue":
		return "enum"
	default:
		return "value"
	}
}

// MetricFamily is one metric family a program can expose on /metrics.
type MetricFamily struct {
	Name string `json:"name"`
	// Type is counter, gauge, histogram, summary or untyped; empty when
	// neither a series nor the registered collector tells (a collector of
	// its own that has not produced a series yet).
	Type string `json:"type"`
	Help string `json:"help"`
	// Labels are the constant labels (sorted) and then the variable
	// labels (in their declared order).
	Labels []string `json:"labels,omitempty"`
	// Series reports whether the family had series when it was described;
	// a labelled metric gets its series with the first event it counts.
	Series bool `json:"series"`
}

// DescribeMetrics returns every metric family reg can expose, sorted by
// name: name, help and labels from the descriptors of every registered
// collector (Registry.Describe), types from a Gather or, for a family
// without series, from the registered collector (a *CounterVec is a
// counter). prometheus.Desc has no accessors: its name, help and labels are
// read from its String form, which client_golang keeps stable; an unknown
// form is an error, not a guess.
func DescribeMetrics(reg *prometheus.Registry) ([]MetricFamily, error) {
	descs := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(descs)
		close(descs)
	}()
	byName := map[string]*MetricFamily{}
	firstDesc := map[string]*prometheus.Desc{}
	var parseErr error
	for d := range descs {
		mf, err := parseDesc(d.String())
		if err != nil {
			parseErr = errors.Join(parseErr, err)
			continue
		}
		if _, dup := byName[mf.Name]; !dup {
			byName[mf.Name], firstDesc[mf.Name] = &mf, d
		}
	}
	if parseErr != nil {
		return nil, parseErr
	}
	gathered, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather: %w", err)
	}
	for _, g := range gathered {
		mf := byName[g.GetName()]
		if mf == nil { // an unchecked collector: no descriptors
			mf = &MetricFamily{Name: g.GetName(), Help: g.GetHelp(), Labels: sampleLabels(g)}
			byName[mf.Name] = mf
		}
		mf.Type = strings.ToLower(g.GetType().String())
		mf.Series = len(g.GetMetric()) > 0
	}
	for name, d := range firstDesc {
		if mf := byName[name]; mf.Type == "" {
			mf.Type = registeredType(reg, d)
		}
	}
	out := make([]MetricFamily, 0, len(byName))
	for _, mf := range byName {
		out = append(out, *mf)
	}
	slices.SortFunc(out, func(a, b MetricFamily) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// sampleLabels returns the label names of g's series in order of first
// appearance.
func sampleLabels(g *dto.MetricFamily) []string {
	var names []string
	for _, m := range g.GetMetric() {
		for _, l := range m.GetLabel() {
			if !slices.Contains(names, l.GetName()) {
				names = append(names, l.GetName())
			}
		}
	}
	return names
}

// registeredType returns the type of the collector registered with the one
// descriptor d: registering a collector with the same descriptors fails
// with an AlreadyRegisteredError holding the registered one (and registers
// nothing, d being taken). "" when d belongs to a collector of its own.
func registeredType(reg *prometheus.Registry, d *prometheus.Desc) string {
	p := descProbe{d}
	err := reg.Register(p)
	if err == nil { // cannot happen for a descriptor reg has; undo anyway
		reg.Unregister(p)
		return ""
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return ""
	}
	switch are.ExistingCollector.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// descProbe is a collector with one descriptor and no metrics.
type descProbe struct{ d *prometheus.Desc }

func (p descProbe) Describe(ch chan<- *prometheus.Desc) { ch <- p.d }
func (descProbe) Collect(chan<- prometheus.Metric)      {}

// parseDesc reads a descriptor's String form:
//
//	Desc{fqName: "n", help: "h", unit: "u", constLabels: {a="x"}, variableLabels: {b,c(d)}}
//
// (unit is missing before client_golang 1.21; c(…) marks a constrained label).
func parseDesc(s string) (MetricFamily, error) {
	bad := func(what string) (MetricFamily, error) {
		return MetricFamily{}, fmt.Errorf("descriptor %s: cannot read its %s (has client_golang's Desc.String changed?)", s, what)
	}
	rest, ok := strings.CutPrefix(s, "Desc{fqName: ")
	if !ok {
		return bad("name")
	}
	var mf MetricFamily
	var err error
	if mf.Name, rest, err = unquotePrefix(rest); err != nil {
		return bad("name")
	}
	if rest, ok = strings.CutPrefix(rest, ", help: "); !ok {
		return bad("help")
	}
	if mf.Help, rest, err = unquotePrefix(rest); err != nil {
		return bad("help")
	}
	if after, ok := strings.CutPrefix(rest, ", unit: "); ok {
		if _, rest, err = unquotePrefix(after); err != nil {
			return bad("unit")
		}
	}
	if rest, ok = strings.CutPrefix(rest, ", constLabels: {"); !ok {
		return bad("constant labels")
	}
	var consts []string
	for !strings.HasPrefix(rest, "}") {
		name, after, ok := strings.Cut(rest, "=")
		if !ok {
			return bad("constant labels")
		}
		if _, rest, err = unquotePrefix(after); err != nil {
			return bad("constant labels")
		}
		consts = append(consts, name)
		rest = strings.TrimPrefix(rest, ",")
	}
	slices.Sort(consts)
	vars, ok := strings.CutPrefix(rest, "}, variableLabels: {")
	if !ok {
		return bad("variable labels")
	}
	if vars, ok = strings.CutSuffix(vars, "}}"); !ok {
		return bad("variable labels")
	}
	mf.Labels = consts
	for _, v := range strings.Split(vars, ",") {
		if v != "" {
			v = strings.TrimSuffix(strings.TrimPrefix(v, "c("), ")")
			mf.Labels = append(mf.Labels, v)
		}
	}
	return mf, nil
}

// unquotePrefix reads the Go-quoted string s starts with.
func unquotePrefix(s string) (value, rest string, err error) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", err
	}
	value, err = strconv.Unquote(q)
	return value, s[len(q):], err
}

// writeMetricsJSON writes DescribeMetrics(reg) to path.
func writeMetricsJSON(path string, reg *prometheus.Registry) error {
	if reg == nil {
		return errors.New("--web.describe-metrics: the program has no registry to describe")
	}
	mfs, err := DescribeMetrics(reg)
	if err != nil {
		return fmt.Errorf("--web.describe-metrics: %w", err)
	}
	var b bytes.Buffer
	if err := writeJSON(&b, mfs); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--web.describe-metrics: %w", err)
	}
	return nil
}

// writeJSON writes v to w as indented JSON, with <, > and & as they are.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
