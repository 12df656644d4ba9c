package doclinks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (slash path → content) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		f := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestResolve(t *testing.T) {
	root := writeTree(t, map[string]string{
		"README.md":              "# edgepipe\n\n## Quick start\n",
		"docs/operations.md":     "# Operations\n\n## EdgepipeExporterDown\n\n## Dead letters\n",
		"docs/metrics.md":        "# Metrics\n",
		"Makefile":               "all:\n",
		"dashboards/a.json":      "{}",
		"deploy/chart/README.md": "# Chart\n\n## Runbooks\n",
	})
	c := &Checker{Root: root, RepoURL: "https://github.com/edgepipe/edgepipe"}
	for _, tc := range []struct {
		from, target string
		wantErr      string // "" for a link that resolves
	}{
		{"README.md", "#quick-start", ""},
		{"README.md", "#quick-Start", "no heading or HTML id in README.md has the anchor #quick-Start (did you mean #quick-start?)"},
		{"README.md", "docs/operations.md#dead-letters", ""},
		{"README.md", "docs/operations.md#dead-leters", "did you mean #dead-letters?"},
		{"README.md", "docs/missing.md", "no such file or directory: docs/missing.md"},
		{"README.md", "dashboards/", ""},
		{"README.md", "dashboards#x", "anchor #x on a directory"},
		{"README.md", "Makefile#L1", ""},
		{"README.md", "Makefile#build", "not Markdown"},
		{"docs/metrics.md", "../README.md#quick-start", ""},
		{"docs/metrics.md", "operations.md#edgepipeexporterdown", ""},
		{"docs/metrics.md", "/deploy/chart/README.md#runbooks", ""},
		{"docs/metrics.md", "../../etc/passwd", "outside the repository"},
		{"docs/metrics.md", "", "empty link"},
		{"README.md", "https://github.com/edgepipe/edgepipe/blob/main/docs/operations.md#edgepipeexporterdown", ""},
		{"README.md", "https://github.com/edgepipe/edgepipe/blob/main/docs/operations.md#nope", "no heading or HTML id in docs/operations.md"},
		{"README.md", "https://github.com/edgepipe/edgepipe/tree/main/dashboards", ""},
		{"README.md", "https://github.com/edgepipe/edgepipe/blob/main/gone.md", "no such file"},
		{"README.md", "https://github.com/edgepipe/edgepipe/releases/tag/v0.1.0", ""},
		{"README.md", "https://prometheus.io/docs/introduction/overview/#architecture", ""},
		{"README.md", "http://127.0.0.1:9780/metrics", ""},
		{"README.md", "https://example.com/a b", "must be escaped"},
		{"README.md", "https://exa mple.com/", "not a URL"},
		{"README.md", "https:///path", "URL without a host"},
		{"README.md", "https://under_score.example/", "is not a host name"},
		{"README.md", "mailto:ops@example.com", ""},
		{"README.md", "ftp://example.com/x", `scheme "ftp"`},
		{"", "https://github.com/edgepipe/edgepipe/blob/main/deploy/chart/README.md#runbooks", ""},
		{"", "docs/operations.md", "nothing to be relative to"},
	} {
		err := c.Resolve(tc.from, tc.target)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s → %q: %v", tc.from, tc.target, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s → %q: error %v, want one containing %q", tc.from, tc.target, err, tc.wantErr)
		}
	}
}

func TestCheckReportsLines(t *testing.T) {
	root := writeTree(t, map[string]string{
		"README.md": "# A\n\nfine [a](#a)\n\nbroken [b](#b) and [c](c.md)\n",
	})
	problems, err := (&Checker{Root: root}).Check("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := "README.md:5: #b: no heading or HTML id in README.md has the anchor #b|" +
		"README.md:5: c.md: no such file or directory: c.md"
	if strings.Join(got, "|") != want {
		t.Errorf("problems\n%s\nwant\n%s", strings.Join(got, "\n"), strings.ReplaceAll(want, "|", "\n"))
	}
}
