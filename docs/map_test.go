// Package docs holds the user documentation; its tests keep the parts of
// it that describe the code true to the code.
package docs

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// layoutRow is one row of the Layout table of architecture.md: the paths
// its first column names and the whole row's text.
type layoutRow struct {
	paths []string
	text  string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// layoutTable reads the table under "## Layout" in architecture.md. A
// first column may name several paths: a full one (`internal/lab/pki/`)
// or one relative to the parent of the cell's first path (`pki/` after
// `internal/lab/supervisor/`).
func layoutTable(t *testing.T) []layoutRow {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal(`architecture.md has no "## Layout" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []layoutRow
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.TrimSpace(cells[1]) == "path" {
			continue
		}
		row := layoutRow{text: line}
		base := ""
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			p := strings.TrimSuffix(m[1], "/")
			if base == "" {
				base = path.Dir(p)
			} else if !strings.Contains(p, "/") {
				p = path.Join(base, p)
			}
			row.paths = append(row.paths, p)
		}
		if len(row.paths) == 0 {
			t.Errorf("architecture.md, Layout: a row names no path: %s", line)
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatal("architecture.md, Layout: no rows")
	}
	return rows
}

// goPackages returns every directory under internal/ and cmd/ holding Go
// files, relative to the repository root.
func goPackages(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join("..", top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") {
				rel, err := filepath.Rel("..", filepath.Dir(p))
				if err != nil {
					return err
				}
				seen[filepath.ToSlash(rel)] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	pkgs := make([]string, 0, len(seen))
	for p := range seen {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	return pkgs
}

// TestArchitectureMapCoversEveryPackage: every Go package under internal/
// and cmd/ is in the package map of docs/architecture.md, either as a
// row of its own or named (relative path, in backticks) in the row of its
// nearest ancestor that has one; and every path the map lists exists.
func TestArchitectureMapCoversEveryPackage(t *testing.T) {
	rows := layoutTable(t)
	rowOf := map[string]*layoutRow{}
	for i := range rows {
		for _, p := range rows[i].paths {
			rowOf[p] = &rows[i]
			if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(p))); err != nil {
				t.Errorf("architecture.md, Layout lists %s, which does not exist: %v", p, err)
			}
		}
	}
	pkgs := goPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under internal/ and cmd/: %v", len(pkgs), pkgs)
	}
	for _, pkg := range pkgs {
		if rowOf[pkg] != nil {
			continue
		}
		anc := path.Dir(pkg)
		for anc != "." && rowOf[anc] == nil {
			anc = path.Dir(anc)
		}
		if anc == "." {
			t.Errorf("architecture.md, Layout: package %s has no row, nor an ancestor with one", pkg)
			continue
		}
		rel := strings.TrimPrefix(pkg, anc+"/")
		named := false
		for _, m := range backticked.FindAllStringSubmatch(rowOf[anc].text, -1) {
			if strings.TrimSuffix(m[1], "/") == rel {
				named = true
			}
		}
		if !named {
			t.Errorf("architecture.md, Layout: package %s has no row, and the row of %s does not name `%s`", pkg, anc, rel)
		}
	}
}
