// Package doccheck holds the tests that keep the repository's documents
// true to it: every relative link in its Markdown files (README.md, docs/,
// the modules' READMEs) leads to a file that exists, and every #anchor to
// a heading of it (TestRelativeLinks); every path and Go name that
// ARCHITECTURE.md cites exists (TestArchitectureNames); and the packages
// that ARCHITECTURE.md's code map says must not know about others import
// none of them (TestLayers). It has no API.
package doccheck
