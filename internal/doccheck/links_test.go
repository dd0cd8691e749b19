package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, relative to this package.
const root = "../.."

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// markdownFiles lists the repository's Markdown files, except test data.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// prose returns the lines of a Markdown document outside fenced code
// blocks, by line number (from 1).
func prose(doc string) map[int]string {
	out := map[int]string{}
	fenced := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out[i+1] = line
		}
	}
	return out
}

// anchors returns the anchors GitHub gives the headings of a document:
// lower case, punctuation other than '-' and '_' dropped, spaces made '-',
// and "-1", "-2"... added to repeats.
func anchors(doc string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	lines := prose(doc)
	for n := 1; n <= strings.Count(doc, "\n")+1; n++ {
		line, ok := lines[n]
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestRelativeLinks checks every relative link of every Markdown file.
func TestRelativeLinks(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t)
	if len(files) < 3 {
		t.Fatalf("found only %d Markdown files under %s", len(files), root)
	}
	docs := map[string]string{}
	read := func(path string) (string, bool) {
		if s, ok := docs[path]; ok {
			return s, true
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false
		}
		docs[path] = string(b)
		return string(b), true
	}
	checked := 0
	for _, file := range files {
		doc, _ := read(file)
		for n, line := range prose(doc) {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
				}
				info, err := os.Stat(dest)
				if err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", file, n, target, dest)
					continue
				}
				if anchor == "" {
					continue
				}
				if info.IsDir() || !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: link %q: an anchor into %s, which is not a Markdown file", file, n, target, dest)
					continue
				}
				destDoc, _ := read(dest)
				if !anchors(destDoc)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", file, n, target, dest, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
}

// TestAnchors checks the anchor rule on headings of this repository's kind.
func TestAnchors(t *testing.T) {
	t.Parallel()
	doc := "# sluice\n## Adapters: net/http, Gin, Echo, Fiber\n```sh\n# not a heading\n```\n## Envoy/Lyft descriptor files\n### The sliding-window counter (default)\n## Errors\n## Errors\n"
	got := anchors(doc)
	for _, want := range []string{"sluice", "adapters-nethttp-gin-echo-fiber", "envoylyft-descriptor-files", "the-sliding-window-counter-default", "errors", "errors-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a comment in a code block was taken as a heading")
	}
}
