// Package doccheck holds a test that every relative link in the
// repository's Markdown files (README.md, docs/, the modules' READMEs)
// leads to a file that exists, and every #anchor to a heading of it. It has
// no API.
package doccheck
