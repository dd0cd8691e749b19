package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADME checks that the README's first example is this program, so
// that the example a newcomer copies is one that compiles.
func TestREADME(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, program, ok := strings.Cut(string(src), "\npackage main\n")
	if !ok {
		t.Fatal("main.go: no package clause")
	}
	block := "```go\npackage main\n" + program + "```\n"
	if !strings.Contains(string(readme), block) {
		t.Errorf("README.md does not show example/quickstart/main.go (from its package clause) in a go block; copy the file into the README's first example:\n%s", block)
	}
}
