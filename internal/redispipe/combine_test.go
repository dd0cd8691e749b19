package redispipe

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// This file holds the alternative to pipelining EVALSHA that the
// benchmarks measure: one EVALSHA of a generated script that decides every
// call of a batch (of one slot, on a Cluster), each sub-call under pcall so
// that one failure does not fail the others.

// wrapperSrc returns the batch script of src: src becomes the body of a
// local function, called once per sub-call. ARGV[1] is the number of
// sub-calls n; ARGV[2i] and ARGV[2i+1] the numbers of keys and arguments of
// sub-call i; then come the arguments of every sub-call in turn, and KEYS
// holds their keys in turn. It returns one {1, reply} or {0, error} per
// sub-call.
func wrapperSrc(src string) string {
	head := ""
	if strings.HasPrefix(src, "#!") { // a shebang with flags stays on top
		nl := strings.IndexByte(src, '\n')
		if nl < 0 {
			nl = len(src)
		}
		head, src = src[:nl+1], src[min(nl+1, len(src)):]
	}
	return head + `local function redispipe_call(KEYS, ARGV)
` + src + `
end
local n = tonumber(ARGV[1])
local out = {}
local k, a = 1, 2 + 2 * n
for i = 1, n do
	local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
	local keys, args = {}, {}
	for j = 1, nk do keys[j] = KEYS[k]; k = k + 1 end
	for j = 1, na do args[j] = ARGV[a]; a = a + 1 end
	local ok, res = pcall(redispipe_call, keys, args)
	if ok and not (type(res) == 'table' and res.err) then
		out[i] = {1, res}
	else
		if type(res) == 'table' and res.err then res = res.err end
		out[i] = {0, tostring(res)}
	end
end
return out
`
}

// wrappers caches the batch script of each script.
var wrappers sync.Map // *scriptInfo → *redis.Script

func wrapperOf(s *scriptInfo) *scriptInfo {
	if w, ok := wrappers.Load(s); ok {
		return infoOf(w.(*redis.Script))
	}
	w, _ := wrappers.LoadOrStore(s, redis.NewScript(wrapperSrc(s.src)))
	return infoOf(w.(*redis.Script))
}

// subError is the error reply of one sub-call.
type subError string

func (e subError) Error() string { return string(e) }

// RedisError marks subError as an error reply.
func (subError) RedisError() {}

// group is the calls of one batch script.
type group struct {
	script *scriptInfo
	slot   int
	calls  []*call
	cmd    *redis.Cmd
}

// sendCombined sends the calls of sent that share a script (and a slot, on
// a Cluster) as one EVALSHA of the batch script, and the others alone.
func sendCombined(d *dest, ctx context.Context, sent []*call) bool {
	var groups []*group
	cluster := d.p.kind == kindCluster
	for _, c := range sent {
		slot := -1
		if cluster && c.nkeys > 0 {
			slot = Slot(c.args[3].(string))
		}
		var g *group
		for _, o := range groups {
			if o.script == c.script && o.slot == slot {
				g = o
				break
			}
		}
		if g == nil {
			g = &group{script: c.script, slot: slot}
			groups = append(groups, g)
		}
		g.calls = append(g.calls, c)
	}
	client := d.client.Load()
	pipe := client.Pipeline()
	var singles []*call
	for _, g := range groups {
		if len(g.calls) == 1 {
			c := g.calls[0]
			c.cmd = redis.NewCmd(ctx, c.args...)
			_ = pipe.Process(ctx, c.cmd)
			singles = append(singles, c)
			continue
		}
		g.cmd = redis.NewCmd(ctx, g.args()...)
		_ = pipe.Process(ctx, g.cmd)
	}
	_, err := pipe.Exec(ctx)
	if isConnError(err) && d.p.ctx.Err() == nil {
		d.markDown(err)
		uerr := &unavailableError{dest: d.name, cause: err}
		for _, c := range sent {
			c.complete(nil, uerr)
		}
		return false
	}
	d.finish(ctx, client, singles)
	var cold []*group
	for _, g := range groups {
		if g.cmd != nil {
			if redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
				cold = append(cold, g)
			} else {
				g.spread()
			}
		}
	}
	if len(cold) > 0 {
		pipe := client.Pipeline()
		for _, g := range cold {
			pipe.ScriptLoad(ctx, wrapperOf(g.script).src)
			g.cmd = redis.NewCmd(ctx, g.args()...)
			_ = pipe.Process(ctx, g.cmd)
		}
		_, _ = pipe.Exec(ctx)
		for _, g := range cold {
			g.spread()
		}
	}
	return err == nil || isRedisError(err)
}

// args returns the EVALSHA command of the group's batch script.
func (g *group) args() []any {
	w := wrapperOf(g.script)
	nkeys := 0
	for _, c := range g.calls {
		nkeys += c.nkeys
	}
	args := []any{"evalsha", w.shaArg, nkeys}
	for _, c := range g.calls {
		args = append(args, c.args[3:3+c.nkeys]...)
	}
	args = append(args, len(g.calls))
	for _, c := range g.calls {
		args = append(args, c.nkeys, len(c.userArgs()))
	}
	for _, c := range g.calls {
		args = append(args, c.userArgs()...)
	}
	return args
}

// spread completes the group's calls from the batch script's reply.
func (g *group) spread() {
	val, err := g.cmd.Result()
	if err != nil {
		for _, c := range g.calls {
			c.complete(nil, err)
		}
		return
	}
	replies, ok := val.([]any)
	if !ok || len(replies) != len(g.calls) {
		err := errors.New("redispipe: batch script returned a malformed reply")
		for _, c := range g.calls {
			c.complete(nil, err)
		}
		return
	}
	for i, c := range g.calls {
		r, _ := replies[i].([]any)
		switch {
		case len(r) == 2 && r[0] == int64(1) && r[1] != nil:
			c.complete(r[1], nil)
		case len(r) <= 2 && len(r) > 0 && r[0] == int64(1):
			c.complete(nil, redis.Nil) // the script returned false or nil
		case len(r) == 2 && r[0] == int64(0):
			msg, _ := r[1].(string)
			c.complete(nil, subError(msg))
		default:
			c.complete(nil, errors.New("redispipe: batch script returned a malformed reply"))
		}
	}
}

// TestBatchScript checks the batch-script alternative that the benchmarks
// measure: every sub-call gets its own reply, errors stay with their
// sub-call, and a cold script cache is loaded.
func TestBatchScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	h := &pipeCounter{}
	c.AddHook(h)
	p := newPipeliner(t, c, Config{StallThreshold: testStall})
	p.send = sendCombined
	ctx := context.Background()
	picky := redis.NewScript(`
if ARGV[1] == 'fail' then return redis.error_reply('ERR asked to fail') end
if ARGV[1] == 'raise' then return redis.call('NOSUCHCOMMAND') end
if ARGV[1] == 'nil' then return false end
return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}
`)
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arg := []string{"ok", "fail", "raise", "nil"}[g%4]
			key := prefix + arg + ":" + string(rune('a'+g))
			for i := 1; i <= 20; i++ {
				v, err := p.Run(ctx, picky, []string{key}, arg)
				switch arg {
				case "ok":
					a, _ := v.([]any)
					if err != nil || len(a) != 3 || a[0] != key || a[2] != int64(i) {
						t.Errorf("ok: %#v, %v", v, err)
					}
				case "fail":
					if err == nil || !strings.Contains(err.Error(), "asked to fail") {
						t.Errorf("fail: %v, %v", v, err)
					}
				case "raise":
					if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown") {
						t.Errorf("raise: %v, %v", v, err)
					}
				case "nil":
					if err != redis.Nil {
						t.Errorf("nil: %v, %v", v, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	pipes, cmds, largest := h.stats()
	t.Logf("%d calls in %d pipelines of %d commands, largest %d", 64*20, pipes, cmds, largest)
}
