package reference

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/doclinks"
)

func TestInline(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"kept in <spool.dir>/dead-letter/<sink>/", "kept in &lt;spool.dir&gt;/dead-letter/&lt;sink&gt;/"},
		{"OTEL_EXPORTER_OTLP_* variables", `OTEL_EXPORTER_OTLP\_\* variables`},
		{"edgepipe_series_limit_dropped_total{dataset}", "edgepipe_series_limit_dropped_total{dataset}"},
		{"_leading and trailing_", `\_leading and trailing\_`},
		{"a | b `c` [d]", "a \\| b \\`c\\` \\[d\\]"},
		{"two\nlines  and   spaces", "two lines and spaces"},
	} {
		if got := inline(tc.in); got != tc.want {
			t.Errorf("inline(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := code("a`b"); got != "``a`b``" {
		t.Errorf("code(a`b) = %q", got)
	}
}

// TestFlagsPage renders a command line like the receiver's and checks the
// page: sections, tables, secrets, and that its links resolve.
func TestFlagsPage(t *testing.T) {
	cl := &cli.CommandLine{Name: "prog", Help: "A program.", Flags: []cli.Flag{
		{Name: "api.url", Help: "The base <url>.", Envar: "PROG_API_URL", PlaceHolder: "URL", Type: "string"},
		{Name: "verbose", Help: "Talk.", Type: "bool"},
		{Name: "password-file", Help: "File with the password.", PlaceHolder: "FILE", Type: "file", SecretEnv: "PROG_PASSWORD"},
	}, Commands: []cli.Command{
		{Name: "help", Help: "Show help."},
		{Name: "run", Help: "Run (the default).", Default: true},
		{Name: "dead-letter", Help: "Dead letters.", Commands: []cli.Command{
			{Name: "dead-letter list", Help: "List them.", Flags: []cli.Flag{{Name: "sink", Help: "Only this sink.", Type: "enum"}}},
		}},
	}}
	page := string(flagsPage(cl))
	for _, want := range []string{
		"# prog flags\n",
		"| [`run`](#run) (default) | Run (the default). |\n",
		"| [`dead-letter list`](#dead-letter-list) | List them. |\n",
		"| `--api.url` | `URL` |  | `PROG_API_URL` | The base &lt;url&gt;. |\n",
		"| `--verbose` | boolean | `false` |  |",
		"| `--password-file` | `FILE` |  | instead: `PROG_PASSWORD`, `PROG_PASSWORD_FILE` |",
		"## `dead-letter list`\n\nList them.\n\n| flag |",
		"| `--sink` | enum |  |  | Only this sink. |\n",
		"## Secrets\n",
		"| `PROG_PASSWORD` | `PROG_PASSWORD_FILE` | `--password-file` |\n",
		"The default command: `prog [<flags>]` is `prog run [<flags>]`.",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "`help`") {
		t.Errorf("kingpin's help command listed:\n%s", page)
	}
	checkLinks(t, map[string][]byte{"prog-flags.md": []byte(page)})
}

// checkLinks writes pages to a directory and checks their links.
func checkLinks(t *testing.T, pages map[string][]byte) {
	t.Helper()
	root := t.TempDir()
	for name, b := range pages {
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := &doclinks.Checker{Root: root}
	for name := range pages {
		problems, err := c.Check(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("broken link: %s", p)
		}
	}
}

func family(name string, typ dto.MetricType, help string, labels ...string) *dto.MetricFamily {
	m := &dto.Metric{}
	for _, l := range labels {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l), Value: proto.String("v")})
	}
	return &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum(), Help: proto.String(help), Metric: []*dto.Metric{m}}
}

// TestMerge checks how the start-up description and the exercised run's
// scrape combine: types filled in, dataset families grouped by the longest
// dataset name that fits, other scrape-only families kept as the program's.
func TestMerge(t *testing.T) {
	described := []cli.MetricFamily{
		{Name: "edgepipe_lag_seconds", Help: "Lag.", Labels: []string{"dataset"}},
		{Name: "edgepipe_up", Type: "gauge", Help: "Up.", Series: true},
		{Name: "go_goroutines", Type: "gauge", Help: "Goroutines.", Series: true},
	}
	scraped := map[string]*dto.MetricFamily{
		"edgepipe_lag_seconds":                     family("edgepipe_lag_seconds", dto.MetricType_GAUGE, "Lag.", "dataset"),
		"edgepipe_series":                          family("edgepipe_series", dto.MetricType_GAUGE, "Series.", "dataset"),
		"cdn_origin_usage_requests_total":          family("cdn_origin_usage_requests_total", dto.MetricType_COUNTER, "Requests.", "environment_id"),
		"cdn_origin_usage_by_country_ttfb_seconds": family("cdn_origin_usage_by_country_ttfb_seconds", dto.MetricType_GAUGE, "TTFB.", "environment_id", "country_code", "percentile"),
		"process_open_fds":                         family("process_open_fds", dto.MetricType_GAUGE, "FDs."),
	}
	pm := merge("exporter", described, scraped, "cdn", []string{"origin_usage", "origin_usage_by_country"})
	wantFamilies := []cli.MetricFamily{
		{Name: "edgepipe_lag_seconds", Type: "gauge", Help: "Lag.", Labels: []string{"dataset"}},
		{Name: "edgepipe_series", Type: "gauge", Help: "Series.", Labels: []string{"dataset"}},
		{Name: "edgepipe_up", Type: "gauge", Help: "Up.", Series: true},
	}
	if !reflect.DeepEqual(pm.families, wantFamilies) {
		t.Errorf("families\n%+v\nwant\n%+v", pm.families, wantFamilies)
	}
	wantDatasets := map[string][]cli.MetricFamily{
		"origin_usage":            {{Name: "cdn_origin_usage_requests_total", Type: "counter", Help: "Requests.", Labels: []string{"environment_id"}}},
		"origin_usage_by_country": {{Name: "cdn_origin_usage_by_country_ttfb_seconds", Type: "gauge", Help: "TTFB.", Labels: []string{"environment_id", "country_code", "percentile"}}},
	}
	if !reflect.DeepEqual(pm.datasets, wantDatasets) {
		t.Errorf("datasets\n%+v\nwant\n%+v", pm.datasets, wantDatasets)
	}
	page := metricsPage([]programMetrics{pm}, "cdn")
	for _, want := range []string{
		"| `edgepipe_lag_seconds` | gauge | `dataset` | after an event | Lag. |",
		"| `edgepipe_up` | gauge |  | at start | Up. |",
		"#### `origin_usage_by_country`",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	checkLinks(t, map[string][]byte{"metrics.md": page})
}

// TestCompare checks the messages for a changed, a missing and a stale page.
func TestCompare(t *testing.T) {
	root := t.TempDir()
	pages := map[string][]byte{
		Dir + "/a.md": newPage("a").bytes(),
		Dir + "/b.md": newPage("b").bytes(),
	}
	if err := Write(root, pages); err != nil {
		t.Fatal(err)
	}
	if diffs, err := Compare(root, pages); err != nil || len(diffs) != 0 {
		t.Fatalf("fresh pages: %v %v", diffs, err)
	}
	changed := map[string][]byte{Dir + "/a.md": newPage("A").bytes(), Dir + "/c.md": newPage("c").bytes()}
	diffs, err := Compare(root, changed)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		Dir + "/a.md differs from what the code generates: line 1 is",
		Dir + "/b.md is no longer generated",
		Dir + "/c.md is missing",
	}
	if len(diffs) != len(want) {
		t.Fatalf("diffs %q", diffs)
	}
	for i := range want {
		if !strings.HasPrefix(diffs[i], want[i]) {
			t.Errorf("diff %q, want %q…", diffs[i], want[i])
		}
	}
	// Write removes the stale page and leaves files it did not generate.
	if err := os.WriteFile(filepath.Join(root, Dir, "notes.md"), []byte("# by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(root, changed); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a.md": true, "b.md": false, "c.md": true, "notes.md": true} {
		if _, err := os.Stat(filepath.Join(root, Dir, name)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", name, err == nil, want)
		}
	}
}
