package doclinks

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// RepoURL is the repository's web address (Chart.yaml's home): links to
// its files on the default branch are checked as files of the working tree.
const RepoURL = "https://github.com/edgepipe/edgepipe"

// TestRepositoryLinks checks every link and anchor of the project's
// Markdown documents: README.md, CHANGELOG.md, docs/**, the chart's README
// and any other *.md in the repository. The runbook URLs of the chart's
// alerts are checked by internal/deploytest's TestChartAlertRunbooks with the
// same Checker.
func TestRepositoryLinks(t *testing.T) {
	docs := markdownFiles(t, repoRoot)
	for _, must := range []string{"README.md", "CHANGELOG.md", "deploy/helm/edgepipe/README.md"} {
		if !slices.Contains(docs, must) {
			t.Errorf("%s not found among the documents %v", must, docs)
		}
	}
	c := &Checker{Root: repoRoot, RepoURL: RepoURL}
	for _, doc := range docs {
		problems, err := c.Check(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("broken link: %s", p)
		}
	}
}

// MaxReadmeBytes is the most README.md may hold: what a newcomer reads
// first (what edgepipe is, make demo, make test, the common configuration
// and links) fits in five minutes; everything else has its page in docs/.
const MaxReadmeBytes = 25600

// TestReadmeSize fails when README.md grows beyond MaxReadmeBytes (wc -c).
func TestReadmeSize(t *testing.T) {
	fi, err := os.Stat(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > MaxReadmeBytes {
		t.Errorf("README.md is %d bytes, more than %d: move the new text to its page under docs/ (see docs/README.md) and link to it",
			fi.Size(), MaxReadmeBytes)
	}
}

// TestDocsIndex checks that docs/README.md links to every page under docs/
// (the generated reference through its own index), so no page is only
// reachable by chance.
func TestDocsIndex(t *testing.T) {
	const index = "docs/README.md"
	src, err := os.ReadFile(filepath.Join(repoRoot, index))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range Parse(src).Links {
		target, _, _ := strings.Cut(l.Target, "#")
		if target != "" && !strings.Contains(target, "://") {
			linked[path.Clean(path.Join(path.Dir(index), target))] = true
		}
	}
	for _, doc := range markdownFiles(t, repoRoot) {
		if !strings.HasPrefix(doc, "docs/") || doc == index {
			continue
		}
		if strings.HasPrefix(doc, "docs/reference/") {
			doc = "docs/reference/README.md"
		}
		if !linked[doc] {
			t.Errorf("%s does not link to %s", index, doc)
		}
	}
}

// markdownFiles lists the *.md files under root as slash paths, leaving out
// hidden directories and what builds and demos write (bin, data) or tests
// read (testdata).
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name[0] == '.' || name == "bin" || name == "data" || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if isMarkdown(name) {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
