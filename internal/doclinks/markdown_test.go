package doclinks

import (
	"slices"
	"testing"
)

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"Restarts and --state.dir", "restarts-and---statedir"},
		{"What to export: --config.file", "what-to-export---configfile"},
		{"access_logs layout and migration", "access_logs-layout-and-migration"},
		{"The receiver's spool", "the-receivers-spool"},
		{"EdgepipeExporterDown", "edgepipeexporterdown"},
		{"Why? (and how!)", "why-and-how"},
		{"A — B", "a--b"},
		{"C++ & Go", "c--go"},
		{"Übersicht der Größen", "übersicht-der-größen"},
		{"v0.1.0 — 2026-01-02", "v010--2026-01-02"},
		{"[Unreleased]", "unreleased"},
		{"emoji 🚀 here", "emoji--here"},
		{"tab\there", "tabhere"},
		{"  two  spaces ", "--two--spaces-"},
	} {
		if got := Slug(tc.heading); got != tc.want {
			t.Errorf("Slug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

func TestSluggerRepeats(t *testing.T) {
	s := Slugger{}
	var got []string
	// github-slugger: a repeat gets -1, -2; a literal "foo-1" taken before
	// pushes the repeat on to the next free number.
	for _, h := range []string{"Foo", "Foo", "foo-2", "Foo", "Foo!", "Bar"} {
		got = append(got, s.Slug(h))
	}
	want := []string{"foo", "foo-1", "foo-2", "foo-3", "foo-4", "bar"}
	if !slices.Equal(got, want) {
		t.Errorf("slugs %q, want %q", got, want)
	}
}

func TestParse(t *testing.T) {
	src := "# Title\n" +
		"\n" +
		"## Restarts and `--state.dir`\n" +
		"\n" +
		"See [the restarts](#restarts-and---statedir) and [spool][sp].\n" +
		"\n" +
		"```sh\n" +
		"[not a link](nowhere.md)\n" +
		"# not a heading\n" +
		"```\n" +
		"\n" +
		"Inline `[code](nope.md)` is no link; <https://example.com/auto> is.\n" +
		"\n" +
		"## **Bold** _words_ and [a link](x.md)\n" +
		"\n" +
		"## Title\n" +
		"\n" +
		"<a name=\"custom-anchor\"></a>\n" +
		"<p id='para'>see <a href=\"docs/x.md\">x</a></p>\n" +
		"\n" +
		"![diagram](img/arch.png)\n" +
		"\n" +
		"[sp]: deploy/README.md#the-receivers-spool\n"
	doc := Parse([]byte(src))
	for _, a := range []string{"title", "restarts-and---statedir", "bold-words-and-a-link", "title-1", "custom-anchor", "para"} {
		if !doc.Anchors[a] {
			t.Errorf("anchor %q missing; have %v", a, doc.Anchors)
		}
	}
	if doc.Anchors["not-a-heading"] {
		t.Error("a line in a code block counted as a heading")
	}
	want := []Link{
		{"#restarts-and---statedir", 5},
		{"deploy/README.md#the-receivers-spool", 5},
		{"https://example.com/auto", 12},
		{"x.md", 14},
		{"docs/x.md", 19},
		{"img/arch.png", 21},
	}
	if !slices.Equal(doc.Links, want) {
		t.Errorf("links\n%v, want\n%v", doc.Links, want)
	}
}
