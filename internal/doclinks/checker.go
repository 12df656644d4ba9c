package doclinks

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Checker resolves the links of one repository's Markdown documents. The
// zero value is not usable: set Root.
type Checker struct {
	// Root is the repository's directory; every relative link must stay
	// inside it.
	Root string
	// RepoURL is the repository's web address, e.g.
	// https://github.com/edgepipe/edgepipe: a link to
	// <RepoURL>/blob/<Branch>/<path> or <RepoURL>/tree/<Branch>/<path> is
	// checked as <path> under Root (anchor included). Empty: such links are
	// only checked for syntax.
	RepoURL string
	// Branch is the branch the files under Root are (default "main").
	Branch string

	docs map[string]*Document // parsed documents by slash path under Root
}

// Problem is a link that does not resolve.
type Problem struct {
	// File is the document, relative to Root; Line the link's line.
	File string
	Line int
	// Target is the link as written.
	Target string
	Err    error
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %v", p.File, p.Line, p.Target, p.Err)
}

// Check returns the links of the Markdown document file (a slash path under
// Root) that do not resolve.
func (c *Checker) Check(file string) ([]Problem, error) {
	doc, err := c.document(file)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	for _, l := range doc.Links {
		if err := c.Resolve(file, l.Target); err != nil {
			problems = append(problems, Problem{File: file, Line: l.Line, Target: l.Target, Err: err})
		}
	}
	return problems, nil
}

// Resolve reports why target, a link in the document from (a slash path
// under Root), does not resolve, or nil. With from empty (a link from
// outside the repository's documents, such as an alert's runbook_url),
// target must be a URL.
func (c *Checker) Resolve(from, target string) error {
	if strings.TrimSpace(target) == "" {
		return errors.New("empty link")
	}
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	switch {
	case u.Scheme == "http" || u.Scheme == "https":
		if p, ok := c.ownPath(u); ok {
			return c.resolvePath(p, u.Fragment)
		}
		return checkWebURL(target, u)
	case u.Scheme == "mailto":
		if !strings.Contains(u.Opaque, "@") {
			return errors.New("mailto: without an address")
		}
		return nil
	case u.Scheme != "":
		return fmt.Errorf("scheme %q: only relative links, http(s) and mailto are checked", u.Scheme)
	case u.Host != "":
		return errors.New("a link without scheme must be a path, not //host")
	case from == "":
		return errors.New("a relative link has nothing to be relative to")
	}
	p := u.Path
	switch {
	case p == "":
		p = from // "#anchor" or "?query": this document
	case strings.HasPrefix(p, "/"):
		p = strings.TrimPrefix(p, "/") // GitHub: from the repository's root
	default:
		p = path.Join(path.Dir(from), p)
	}
	return c.resolvePath(p, u.Fragment)
}

// ownPath returns the path under Root a link to the repository's own web
// address names.
func (c *Checker) ownPath(u *url.URL) (string, bool) {
	if c.RepoURL == "" {
		return "", false
	}
	repo, err := url.Parse(c.RepoURL)
	if err != nil || !strings.EqualFold(u.Host, repo.Host) {
		return "", false
	}
	branch := c.Branch
	if branch == "" {
		branch = "main"
	}
	base := strings.TrimSuffix(repo.Path, "/")
	for _, kind := range []string{"/blob/", "/tree/"} {
		if rest, ok := strings.CutPrefix(u.Path, base+kind+branch+"/"); ok {
			return rest, true
		}
	}
	return "", false
}

// lineAnchor is GitHub's anchor of a line or a range of lines of a file.
var lineAnchor = regexp.MustCompile(`^L\d+(-L\d+)?$`)

// resolvePath checks that p (a slash path under Root) exists and, when
// fragment is set, that it names an anchor of p.
func (c *Checker) resolvePath(p, fragment string) error {
	p = path.Clean(p)
	if p == ".." || strings.HasPrefix(p, "../") || path.IsAbs(p) {
		return fmt.Errorf("%s is outside the repository", p)
	}
	info, err := os.Stat(filepath.Join(c.Root, filepath.FromSlash(p)))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no such file or directory: %s", p)
	}
	if err != nil {
		return err
	}
	switch {
	case fragment == "":
		return nil
	case info.IsDir():
		return fmt.Errorf("anchor #%s on a directory", fragment)
	case !isMarkdown(p):
		if lineAnchor.MatchString(fragment) {
			return nil
		}
		return fmt.Errorf("anchor #%s on %s, which is not Markdown (only #L<n> line anchors work there)", fragment, p)
	}
	doc, err := c.document(p)
	if err != nil {
		return err
	}
	if doc.Anchors[fragment] {
		return nil
	}
	msg := fmt.Sprintf("no heading or HTML id in %s has the anchor #%s", p, fragment)
	if near := nearest(fragment, doc.Anchors); near != "" {
		msg += fmt.Sprintf(" (did you mean #%s?)", near)
	}
	return errors.New(msg)
}

// document parses the Markdown file p (a slash path under Root), once.
func (c *Checker) document(p string) (*Document, error) {
	if doc, ok := c.docs[p]; ok {
		return doc, nil
	}
	src, err := os.ReadFile(filepath.Join(c.Root, filepath.FromSlash(p)))
	if err != nil {
		return nil, err
	}
	if c.docs == nil {
		c.docs = map[string]*Document{}
	}
	doc := Parse(src)
	c.docs[p] = doc
	return doc, nil
}

func isMarkdown(p string) bool {
	ext := strings.ToLower(path.Ext(p))
	return ext == ".md" || ext == ".markdown"
}

// hostName is a DNS name or an IPv4 address.
var hostName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$`)

// checkWebURL checks an http(s) link's syntax (there is no network to fetch
// it): a host name, a numeric port, no character a URL must escape.
func checkWebURL(raw string, u *url.URL) error {
	if i := strings.IndexAny(raw, " \t\n<>\"{}|\\^`"); i >= 0 {
		return fmt.Errorf("character %q must be escaped in a URL", raw[i])
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("URL without a host")
	}
	if !hostName.MatchString(host) && !strings.Contains(host, ":") { // IPv6 literals pass
		return fmt.Errorf("host %q is not a host name", host)
	}
	if port := u.Port(); port != "" && strings.Trim(port, "0123456789") != "" {
		return fmt.Errorf("port %q is not a number", port)
	}
	return nil
}

// nearest returns the anchor closest to want by edit distance, if it is
// close enough to be a likely typo.
func nearest(want string, anchors map[string]bool) string {
	best, bestDist := "", len(want)/3+1
	keys := make([]string, 0, len(anchors))
	for a := range anchors {
		keys = append(keys, a)
	}
	slices.Sort(keys)
	for _, a := range keys {
		if d := editDistance(want, a); d < bestDist {
			best, bestDist = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
