package redispipe

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"sync"

	"github.com/redis/go-redis/v9"
)

// scriptInfo is what the Pipeliner needs of a *redis.Script: its source,
// for SCRIPT LOAD and EVAL, and its SHA-1 digest, for EVALSHA. The digest
// is computed here rather than taken from Script.Hash, which is empty for
// scripts made with redis.NewScriptServerSHA until they are loaded.
type scriptInfo struct {
	script *redis.Script
	src    string
	sha    string
	// shaArg is sha boxed once, as a command argument.
	shaArg any
	// batch is set for scripts made with NewBatchScript, which speak the
	// batch protocol.
	batch bool
}

// batchScripts holds the scripts made with NewBatchScript.
var batchScripts sync.Map // *redis.Script → struct{}

// NewBatchScript returns a script whose calls a Pipeliner may merge: the
// calls of one batch that go to the same server (and, on a Cluster, the
// same hash slot) are sent as one EVALSHA, so that the server runs the
// script once for all of them. src must speak this protocol:
//
//   - KEYS holds the keys of every call, one call after the other;
//   - ARGV[1] is the number of calls n; ARGV[2] holds, for each call in
//     turn, its number of keys and its number of arguments, as 2-byte
//     little-endian unsigned integers (struct.unpack('<HH', ARGV[2],
//     4*i-3) for call i); the arguments of every call follow, one call
//     after the other, from ARGV[3] on;
//   - the reply is an array of n replies, the i-th being call i's: its
//     value, or an error reply ({err = "..."}) that fails call i alone;
//     when n is 1, the reply is the call's own reply, not an array of one
//     (which spares the server and the client an array per lone call).
//
// A call on its own is sent the same way, with n = 1. Run returns each
// call's own reply, as for any script. The script must read the server's
// clock (TIME) once per run at most, and decide each call as though it ran
// on its own, which is what makes merging calls invisible to them.
func NewBatchScript(src string) *redis.Script {
	s := redis.NewScript(src)
	batchScripts.Store(s, struct{}{})
	return s
}

// scripts caches the scriptInfo of every script run.
var scripts sync.Map // *redis.Script → *scriptInfo

// infoOf returns the scriptInfo of s.
func infoOf(s *redis.Script) *scriptInfo {
	if v, ok := scripts.Load(s); ok {
		return v.(*scriptInfo)
	}
	// Script keeps its source to itself, but hands it to the Scripter
	// given to Eval.
	var r srcRecorder
	s.Eval(context.Background(), &r, nil)
	sum := sha1.Sum([]byte(r.src))
	sha := hex.EncodeToString(sum[:])
	_, batch := batchScripts.Load(s)
	info := &scriptInfo{script: s, src: r.src, sha: sha, shaArg: sha, batch: batch}
	v, _ := scripts.LoadOrStore(s, info)
	return v.(*scriptInfo)
}

// srcRecorder is a redis.Scripter that records the source given to Eval
// and sends nothing.
type srcRecorder struct{ src string }

func (r *srcRecorder) Eval(ctx context.Context, script string, _ []string, _ ...any) *redis.Cmd {
	r.src = script
	return redis.NewCmd(ctx)
}

func (r *srcRecorder) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmd(ctx)
}

func (r *srcRecorder) EvalRO(ctx context.Context, script string, _ []string, _ ...any) *redis.Cmd {
	r.src = script
	return redis.NewCmd(ctx)
}

func (r *srcRecorder) EvalShaRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmd(ctx)
}

func (r *srcRecorder) ScriptExists(ctx context.Context, _ ...string) *redis.BoolSliceCmd {
	return redis.NewBoolSliceCmd(ctx)
}

func (r *srcRecorder) ScriptLoad(ctx context.Context, _ string) *redis.StringCmd {
	return redis.NewStringCmd(ctx)
}

// RunDirect runs script once through c, without a Pipeliner, and returns
// its reply as Pipeliner.Run would: a script made with NewBatchScript is
// sent as a batch of one call, and its call's own reply returned.
func RunDirect(ctx context.Context, c redis.Scripter, script *redis.Script, keys []string, args ...any) (any, error) {
	info := infoOf(script)
	if !info.batch {
		return script.Run(ctx, c, keys, args...).Result()
	}
	all := make([]any, 0, 2+len(args))
	all = append(all, 1, headerOf(len(keys), len(args)))
	all = append(all, args...)
	return script.Run(ctx, c, keys, all...).Result()
}

// AppendHeader appends to b the numbers of keys and of arguments of a call
// in the form ARGV[2] of a batch script holds them (see NewBatchScript).
// A call may have at most 65,535 of each.
func AppendHeader(b []byte, nkeys, nargs int) []byte {
	return append(b, byte(nkeys), byte(nkeys>>8), byte(nargs), byte(nargs>>8))
}

// oneHeader holds the header of a call on its own, boxed as a command
// argument, for up to 8 keys and 8 arguments, so that most calls need not
// make one.
var oneHeader = func() (t [9][9]any) {
	for k := range t {
		for a := range t[k] {
			t[k][a] = string(AppendHeader(nil, k, a))
		}
	}
	return t
}()

// headerOf returns the header of a call on its own with nkeys keys and
// nargs arguments, boxed as a command argument.
func headerOf(nkeys, nargs int) any {
	if nkeys < len(oneHeader) && nargs < len(oneHeader[0]) {
		return oneHeader[nkeys][nargs]
	}
	return string(AppendHeader(nil, nkeys, nargs))
}
