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
	info := &scriptInfo{script: s, src: r.src, sha: sha, shaArg: sha}
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
