package compattest_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/compattest"
	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redistest"
)

// newerOnly lists commands that go-redis sends on connecting but that a
// server older than the one named does not count (it rejects them, and
// go-redis ignores the error): the doc lists them, and the suite may run
// on a server that does not record them.
var newerOnly = map[string]bool{"CLIENT SETINFO": true} // Redis 7.2

// harness is what the recording itself sends; it is not sluice's.
var harness = map[string]bool{"INFO": true, "CONFIG RESETSTAT": true}

// recorder reads what servers ran, through clients connected before the
// statistics are reset (so that their own connection setup is not
// counted).
type recorder struct {
	t       *testing.T
	clients []*redis.Client
}

func newRecorder(t *testing.T, addrs ...string) *recorder {
	r := &recorder{t: t}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 1})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		r.clients = append(r.clients, c)
	}
	return r
}

func (r *recorder) reset() {
	for _, c := range r.clients {
		if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// commands returns the commands the servers ran since the last reset, as
// docs/compatibility.md names them ("HGET", "CLIENT SETINFO").
func (r *recorder) commands() map[string]bool {
	out := map[string]bool{}
	for _, c := range r.clients {
		for name := range commandStats(r.t, c) {
			n := strings.ToUpper(strings.ReplaceAll(name, "|", " "))
			if !harness[n] {
				out[n] = true
			}
		}
	}
	return out
}

// docCommands reads the table of docs/compatibility.md's section
// "Commands by capability": for each row, its first cell and the
// commands in backquotes of its second.
func docCommands(t *testing.T) map[string]map[string]bool {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "docs", "compatibility.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(src), "\n## Commands by capability\n")
	if !ok {
		t.Fatal(`docs/compatibility.md has no section "## Commands by capability"`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	tick := regexp.MustCompile("`([A-Z][A-Z_-]*(?: [A-Z][A-Z_-]*)?)`")
	rows := map[string]map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "*")
		set := map[string]bool{}
		for _, m := range tick.FindAllStringSubmatch(cells[2], -1) {
			set[m[1]] = true
		}
		rows[name] = set
	}
	if len(rows) < len(compattest.Capabilities) {
		t.Fatalf("the table of docs/compatibility.md has %d rows: %v", len(rows), rows)
	}
	return rows
}

func sorted(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// TestCommandsDocumented records every command sluice sends for each
// capability (INFO commandstats, which counts the commands that scripts
// call as well), on a standalone server, on a Cluster and on a Sentinel
// master, and checks each against the row of docs/compatibility.md that
// names the capability (or the row "every connection", or for what only
// a Cluster or Sentinel sends, the row of that deployment). It also checks
// that every command the key guard admits in scripts is documented, and
// that every documented command is one sluice was seen to send or one a
// script may call.
func TestCommandsDocumented(t *testing.T) {
	t.Parallel()
	doc := docCommands(t)
	every := doc["every connection"]
	seen := map[string]bool{}
	documented := func(row string, got map[string]bool, also ...string) {
		t.Helper()
		for _, c := range sorted(got) {
			seen[c] = true
			if doc[row][c] || every[c] {
				continue
			}
			found := false
			for _, a := range also {
				found = found || doc[a][c]
			}
			if !found {
				t.Errorf("%s sends %s, which docs/compatibility.md does not list for it", row, c)
			}
		}
	}

	srv := redistest.Standalone(t)
	rec := newRecorder(t, srv.Addr())
	for _, c := range compattest.Capabilities {
		if doc[c.Name] == nil {
			t.Errorf("docs/compatibility.md has no row %q", c.Name)
			continue
		}
		rec.reset()
		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		c.Run(t, compattest.Env{Client: client, Prefix: redistest.Prefix(t)})
		_ = client.Close()
		got := rec.commands()
		t.Logf("%s: %v", c.Name, sorted(got))
		documented(c.Name, got)
	}

	var all []string
	for _, c := range compattest.Capabilities {
		all = append(all, c.Name)
	}
	cl := redistest.Cluster(t)
	rec = newRecorder(t, cl.Addrs()...)
	rec.reset()
	cc := cl.Client(t, nil)
	for _, c := range compattest.Capabilities {
		c.Run(t, compattest.Env{Client: cc, Prefix: redistest.Prefix(t)})
	}
	got := rec.commands()
	t.Logf("Redis Cluster: %v", sorted(got))
	documented("Redis Cluster", got, all...)

	sen := redistest.Sentinel(t)
	master, err := sen.Master(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec = newRecorder(t, master.Addr())
	rec.reset()
	sc := sen.Client(t, nil)
	for _, c := range compattest.Capabilities {
		c.Run(t, compattest.Env{Client: sc, Prefix: redistest.Prefix(t)})
	}
	got = rec.commands()
	delete(got, "REPLCONF") // the replica's, not sluice's
	t.Logf("Sentinel (master): %v", sorted(got))
	documented("Sentinel", got, all...)

	for name := range keyguard.Commands {
		seen[name] = true
		found := false
		for _, row := range doc {
			found = found || row[name]
		}
		if !found {
			t.Errorf("scripts may call %s (keyguard.Commands), which docs/compatibility.md does not list", name)
		}
	}
	for row, cmds := range doc {
		if row == "Sentinel" {
			continue // what the client sends the sentinels is not recorded here
		}
		for c := range cmds {
			if !seen[c] && !newerOnly[c] {
				t.Errorf("docs/compatibility.md lists %s for %q, which sluice was not seen to send", c, row)
			}
		}
	}
}
