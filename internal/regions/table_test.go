package regions

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
)

// TestRegionsTable runs every scenario on the simulation with the design
// notes' delays, for sync intervals of 50, 250 and 1000 ms, beside
// per-region counters and global_strict, and prints BENCHMARKS.md's table
// (to the file SLUICE_REGIONS_TABLE names, if not "1"). It takes about two
// minutes, so make test leaves it out:
//
//	SLUICE_REGIONS_TABLE=1 go test -run TestRegionsTable -v ./internal/regions
func TestRegionsTable(t *testing.T) {
	out := os.Getenv("SLUICE_REGIONS_TABLE")
	if out == "" {
		t.Skip("set SLUICE_REGIONS_TABLE=1 to run the regions table (about two minutes)")
	}
	sim := regiontest.New(t, regiontest.Names, regiontest.NotesDelays)
	base := params{limit: 100, window: time.Second, tick: 10 * time.Millisecond, windows: 3}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	maxP99 := func(r result) time.Duration {
		var m time.Duration
		for _, d := range r.p99 {
			m = max(m, d)
		}
		return m
	}
	var b strings.Builder
	fmt.Fprintln(&b, "| scenario | sync_interval | most admitted / window (global) | limit | bound | per-region only | global_strict | global_strict p99, eu / ap | decision p99 in region (global) | converge after healing |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|---|")
	for _, sc := range scenarios(base.window) {
		p := base
		if sc.cut != "" {
			sc.cutTo, p.windows = 5, 7
		}
		p.sync, p.hold = 250*time.Millisecond, 500*time.Millisecond
		pr := runScenario(t, sim, sc, perRegion, p)
		st := runScenario(t, sim, sc, strict, p)
		for _, T := range []time.Duration{50 * time.Millisecond, 250 * time.Millisecond, time.Second} {
			q := p
			q.sync, q.hold = T, max(2*T, 500*time.Millisecond)
			g := runScenario(t, sim, sc, global, q)
			most := fmt.Sprint(g.max)
			conv := "–"
			if sc.cut != "" {
				most = fmt.Sprintf("%d (%d from a hold time into the cut)", g.max, g.maxAfter)
				conv = ms(g.converge) + " ms"
				if g.converge < 0 {
					conv = fmt.Sprintf("not within %v", healWait)
				}
			}
			strictMax := fmt.Sprint(st.max)
			if st.errs > 0 {
				strictMax += fmt.Sprintf(" (%d failed: home unreachable)", st.errs)
			}
			fmt.Fprintf(&b, "| %s | %v | %s | %d | %d | %d | %s | %s / %s ms | %s ms | %s |\n",
				sc.name, T, most, p.limit, boundFor(sim, q, g), pr.max, strictMax,
				ms(st.p99[regiontest.EUWest1]), ms(st.p99[regiontest.APSoutheast1]), ms(maxP99(g)), conv)
			if g.errs+pr.errs > 0 {
				t.Errorf("%s, %v: %d decisions failed", sc.name, T, g.errs+pr.errs)
			}
		}
	}
	t.Log("\n" + b.String())
	if out != "1" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
