package doccheck

import (
	"os"
	"path/filepath"
	"testing"
)

// maxREADME is the most the README may weigh: a reader's first page, with
// the detail in docs/.
const maxREADME = 30000

// TestREADMESize checks that README.md stays within maxREADME bytes: a
// section that grows moves its detail into docs/.
func TestREADMESize(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxREADME {
		t.Fatalf("README.md is %d bytes, more than %d: move detail into docs/", len(b), maxREADME)
	}
}
