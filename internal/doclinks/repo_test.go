package doclinks

import (
	"io/fs"
	"path/filepath"
	"slices"
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
