package fleet

import "context"

// backgroundKey marks the context of a call no request waits for.
type backgroundKey struct{}

// Background returns ctx marked as the context of calls no request waits
// for (a syncer's tick, the next slice asked for ahead): a backend bounds
// them by their own deadline, not by the bound of a decision, so that a
// shared store too slow for decisions still serves them.
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// IsBackground reports whether ctx was marked by Background.
func IsBackground(ctx context.Context) bool {
	v, _ := ctx.Value(backgroundKey{}).(bool)
	return v
}
