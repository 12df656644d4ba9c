// Package doclinks checks the links of the project's Markdown documents as
// GitHub renders them: a relative link must name a file or directory of the
// repository, an anchor (#…) must be the id of a heading (GitHub's slug of
// its text, with -1, -2, … for repeats) or of an HTML element in the target
// document, a link to the repository's own web address (…/blob/main/<path>)
// is checked as the file it names, and any other http(s) link, which cannot
// be fetched here, must at least be a well-formed URL.
//
// The documents are parsed with goldmark (CommonMark with GitHub's
// extensions), so links in code spans and code blocks are not links, and
// reference-style links, autolinks and links in raw HTML are.
package doclinks

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// Document is a parsed Markdown document: its anchors and its links.
type Document struct {
	// Anchors are the ids a link's #fragment may name: heading slugs and
	// the id and name attributes of HTML elements.
	Anchors map[string]bool
	// Links are the document's links in order.
	Links []Link
}

// Link is one link of a document.
type Link struct {
	// Target is the destination as written (reference links resolved).
	Target string
	// Line is the 1-based line the link is on.
	Line int
}

// markdown is GitHub Flavored Markdown: CommonMark plus tables,
// strikethrough, task lists and bare URLs as links (linkify).
var markdown = goldmark.New(goldmark.WithExtensions(extension.GFM))

// htmlAttr finds the attributes of raw HTML that hold an anchor (id, name)
// or a link (href, src).
var htmlAttr = regexp.MustCompile(`(?i)\b(id|name|href|src)\s*=\s*(?:"([^"]*)"|'([^']*)')`)

// Parse parses a Markdown document.
func Parse(src []byte) *Document {
	doc := &Document{Anchors: map[string]bool{}}
	slugs := Slugger{}
	root := markdown.Parser().Parse(text.NewReader(src))
	_ = ast.Walk(root, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Heading:
			doc.Anchors[slugs.Slug(plainText(n, src))] = true
		case *ast.Link:
			doc.addLink(string(n.Destination), lineOf(n, src))
		case *ast.Image:
			doc.addLink(string(n.Destination), lineOf(n, src))
		case *ast.AutoLink:
			if n.AutoLinkType == ast.AutoLinkURL {
				doc.addLink(string(n.URL(src)), lineOf(n, src))
			}
		case *ast.RawHTML:
			doc.addHTML(segmentsText(n.Segments, src), lineOf(n, src))
		case *ast.HTMLBlock:
			doc.addHTML(linesText(n, src), lineOf(n, src))
		}
		return ast.WalkContinue, nil
	})
	return doc
}

func (d *Document) addLink(target string, line int) {
	d.Links = append(d.Links, Link{Target: target, Line: line})
}

// addHTML records the anchors and links of raw HTML starting on line.
func (d *Document) addHTML(html string, line int) {
	for _, m := range htmlAttr.FindAllStringSubmatchIndex(html, -1) {
		attr := strings.ToLower(html[m[2]:m[3]])
		var val string
		if m[4] >= 0 { // "…"
			val = html[m[4]:m[5]]
		} else { // '…'
			val = html[m[6]:m[7]]
		}
		at := line + strings.Count(html[:m[0]], "\n")
		switch attr {
		case "id", "name":
			d.Anchors[val] = true
		default:
			d.addLink(val, at)
		}
	}
}

// plainText is the text GitHub renders for n's inline content: code spans
// as their code, links as their text, emphasis without its markers; images
// and HTML tags add nothing.
func plainText(n ast.Node, src []byte) string {
	var b strings.Builder
	var walk func(ast.Node)
	walk = func(n ast.Node) {
		for c := n.FirstChild(); c != nil; c = c.NextSibling() {
			switch c := c.(type) {
			case *ast.Text:
				b.Write(c.Segment.Value(src))
				if c.SoftLineBreak() || c.HardLineBreak() {
					b.WriteByte(' ')
				}
			case *ast.String:
				b.Write(c.Value)
			case *ast.AutoLink:
				b.Write(c.Label(src))
			case *ast.Image, *ast.RawHTML:
			default:
				walk(c)
			}
		}
	}
	walk(n)
	return b.String()
}

// lineOf returns the 1-based line where n starts: its first text segment,
// or its block's first line.
func lineOf(n ast.Node, src []byte) int {
	if off, ok := offsetOf(n); ok {
		return 1 + bytes.Count(src[:off], []byte("\n"))
	}
	for p := n; p != nil; p = p.Parent() {
		if p.Type() == ast.TypeBlock && p.Lines().Len() > 0 {
			return 1 + bytes.Count(src[:p.Lines().At(0).Start], []byte("\n"))
		}
	}
	return 0
}

// offsetOf finds the source offset of n's first text.
func offsetOf(n ast.Node) (int, bool) {
	switch n := n.(type) {
	case *ast.Text:
		return n.Segment.Start, true
	case *ast.RawHTML:
		if n.Segments.Len() > 0 {
			return n.Segments.At(0).Start, true
		}
	case *ast.HTMLBlock:
		if n.Lines().Len() > 0 {
			return n.Lines().At(0).Start, true
		}
	}
	for c := n.FirstChild(); c != nil; c = c.NextSibling() {
		if off, ok := offsetOf(c); ok {
			return off, true
		}
	}
	return 0, false
}

func segmentsText(segs *text.Segments, src []byte) string {
	var b strings.Builder
	for i := 0; i < segs.Len(); i++ {
		seg := segs.At(i)
		b.Write(seg.Value(src))
	}
	return b.String()
}

func linesText(n ast.Node, src []byte) string {
	return segmentsText(n.Lines(), src)
}

// Slugger gives headings their anchors as GitHub does (github-slugger): the
// first heading with a slug gets it, the next ones get -1, -2, … appended,
// skipping any slug already taken. The zero value is ready; use one per
// document.
type Slugger map[string]int

// Slug returns the anchor of the next heading whose rendered text is
// heading.
func (s Slugger) Slug(heading string) string {
	base := Slug(heading)
	slug := base
	for {
		if _, taken := s[slug]; !taken {
			break
		}
		s[base]++
		slug = base + "-" + strconv.Itoa(s[base])
	}
	s[slug] = 0
	return slug
}

// Slug is GitHub's anchor for a heading whose rendered text is heading:
// lower case; letters, numbers, marks, '-' and '_' kept; every space a '-';
// everything else (punctuation, symbols, other white space) dropped. So
// "Restarts and `--state.dir`" (rendered "Restarts and --state.dir") is
// "restarts-and---statedir".
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
