package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHelpJSON checks that the hidden --help-json prints every visible
// flag and command with what the reference needs, and ends the parse as
// --help does.
func TestHelpJSON(t *testing.T) {
	var stdout bytes.Buffer
	ta := newTestApp(&stdout, io.Discard)
	SecretFlag(ta.app, "token-file", "TEST_CLI_TOKEN", "File holding the token.")
	ta.app.Flag("secret-knob", "Hidden.").Hidden().Bool()
	if _, err := ta.app.Parse([]string{"--help-json"}); !errors.Is(err, ErrPrinted) {
		t.Fatalf("Parse(--help-json) = %v, want ErrPrinted", err)
	}
	var cl CommandLine
	if err := json.Unmarshal(stdout.Bytes(), &cl); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if cl.Name != "prog" || cl.Help != "A test program." {
		t.Errorf("name %q, help %q", cl.Name, cl.Help)
	}
	flags := map[string]Flag{}
	for _, f := range cl.Flags {
		flags[f.Name] = f
	}
	for _, want := range []Flag{
		{Name: "interval", Help: "An interval.", Default: []string{"1m"}, Type: "duration"},
		{Name: "size", Help: "A size.", Default: []string{"1MiB"}, Type: "bytes"},
		{Name: "count", Help: "A count.", Default: []string{"1"}, Envar: "TEST_CLI_COUNT", Type: "int"},
		{Name: "mode", Help: "A mode.", Default: []string{"lz4"}, Type: "enum"},
		{Name: "item", Help: "Repeatable.", Type: "string", Repeatable: true},
		{Name: "on", Help: "A switch.", Default: []string{"true"}, Type: "bool"},
		{Name: "token-file", Help: "File holding the token. Instead of $TEST_CLI_TOKEN, or the file named by $TEST_CLI_TOKEN_FILE.",
			PlaceHolder: "FILE", Type: "file", SecretEnv: "TEST_CLI_TOKEN"},
	} {
		if got := flags[want.Name]; !reflect.DeepEqual(got, want) {
			t.Errorf("flag %s:\n got %+v\nwant %+v", want.Name, got, want)
		}
	}
	for _, hidden := range []string{"help-json", "secret-knob", "help-long", "help-man"} {
		if _, ok := flags[hidden]; ok {
			t.Errorf("hidden flag --%s described", hidden)
		}
	}
	var names []string
	for _, c := range cl.Commands {
		names = append(names, c.Name)
		if c.Name == "run" && (!c.Default || len(c.Flags) != 1 || c.Flags[0].Name != "poll" || c.Flags[0].Type != "duration") {
			t.Errorf("run: %+v", c)
		}
	}
	if !reflect.DeepEqual(names, []string{"help", "run", "other"}) {
		t.Errorf("commands %v", names)
	}
}

// ownCollector is a collector of its own whose metric appears only once
// something happened.
type ownCollector struct {
	desc     *prometheus.Desc
	happened bool
}

func (c *ownCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *ownCollector) Collect(ch chan<- prometheus.Metric) {
	if c.happened {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1)
	}
}

// uncheckedCollector describes nothing (an unchecked collector).
type uncheckedCollector struct{}

func (uncheckedCollector) Describe(chan<- *prometheus.Desc) {}
func (uncheckedCollector) Collect(ch chan<- prometheus.Metric) {
	d := prometheus.NewDesc("t_unchecked", "Unchecked.", []string{"x"}, nil)
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, 1, "a")
}

func TestDescribeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	own := &ownCollector{desc: prometheus.NewDesc("t_own", `Help with "quotes", {braces} and a, comma.`, []string{"a", "b"}, prometheus.Labels{"z": "1", "k": "v,w"})}
	counted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_counted_total", Help: "Counted."}, []string{"dataset"})
	counted.WithLabelValues("x").Inc()
	reg.MustRegister(
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_errors_total", Help: "Errors."}, []string{"sink", "reason"}),
		prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_up", Help: "Up."}, []string{"dataset"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_seconds", Help: "Seconds."}, []string{"sink"}),
		prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: "t_summary", Help: "Summary."}, []string{"s"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_plain", Help: "Plain.", ConstLabels: prometheus.Labels{"c": "d"}}),
		counted, own, uncheckedCollector{},
	)
	got, err := DescribeMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	want := []MetricFamily{
		{Name: "t_counted_total", Type: "counter", Help: "Counted.", Labels: []string{"dataset"}, Series: true},
		{Name: "t_errors_total", Type: "counter", Help: "Errors.", Labels: []string{"sink", "reason"}},
		{Name: "t_own", Type: "", Help: `Help with "quotes", {braces} and a, comma.`, Labels: []string{"k", "z", "a", "b"}},
		{Name: "t_plain", Type: "gauge", Help: "Plain.", Labels: []string{"c"}, Series: true},
		{Name: "t_seconds", Type: "histogram", Help: "Seconds.", Labels: []string{"sink"}},
		{Name: "t_summary", Type: "summary", Help: "Summary.", Labels: []string{"s"}},
		{Name: "t_unchecked", Type: "counter", Help: "Unchecked.", Labels: []string{"x"}, Series: true},
		{Name: "t_up", Type: "gauge", Help: "Up.", Labels: []string{"dataset"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("described\n%+v\nwant\n%+v", got, want)
	}
	// Describing registered nothing: the registry is as it was.
	if again, err := DescribeMetrics(reg); err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("described again: %v, %+v", err, again)
	}
	own.happened = true
	got, _ = DescribeMetrics(reg)
	for _, mf := range got {
		if mf.Name == "t_own" && (mf.Type != "gauge" || !mf.Series) {
			t.Errorf("after its event: %+v", mf)
		}
	}
}

func TestParseDescRefusesAnUnknownForm(t *testing.T) {
	for _, s := range []string{
		`Desc{name: "x"}`,
		`Desc{fqName: "x", help: "y", constLabels: {}}`,
		`Desc{fqName: "x", help: "y", unit: "", constLabels: {a}, variableLabels: {}}`,
	} {
		if _, err := parseDesc(s); err == nil {
			t.Errorf("parseDesc(%s) accepted", s)
		}
	}
}

// TestWebDescribeMetrics checks that --web.describe-metrics makes
// NewServer write the registry's description and return ErrPrinted
// instead of a server.
func TestWebDescribeMetrics(t *testing.T) {
	app := New("prog", "A test program.", io.Discard, io.Discard)
	w := AddWebFlags(app, "127.0.0.1:0")
	file := filepath.Join(t.TempDir(), "metrics.json")
	if _, err := app.Parse([]string{"--web.describe-metrics=" + file}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "t_total", Help: "A <counter>."}))
	srv, err := w.NewServer(Site{Registry: reg}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, ErrPrinted) || srv != nil {
		t.Fatalf("NewServer = %v, %v; want ErrPrinted", srv, err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var mfs []MetricFamily
	if err := json.Unmarshal(b, &mfs); err != nil || !reflect.DeepEqual(mfs, []MetricFamily{{Name: "t_total", Type: "counter", Help: "A <counter>.", Series: true}}) {
		t.Errorf("%s: %v %+v", b, err, mfs)
	}
	if !bytes.Contains(b, []byte("A <counter>.")) {
		t.Errorf("HTML characters escaped in %s", b)
	}
}
