package fleet

import "github.com/sluicehq/sluice/internal/window"

// ID names a counter in the shared store: Tag picks its bucket (and so its
// Redis Cluster slot) and Field the counter in the bucket, as exact mode
// names it (internal/redisstore), so that both modes count in one place.
type ID struct {
	Tag   [3]byte
	Field [12]byte
}

// Call is one operation on one counter of the shared store: a write-back
// push of Delta, or, when Lease is set, a lease that gives back Give units
// counted in the window that starts at From and grants at most Want.
type Call struct {
	ID    ID
	Limit *window.Limit
	// Now is the instant to decide at in Unix ms, or -1 for the store's
	// clock.
	Now   int64
	Delta Delta
	Lease bool
	Want  int64
	Give  int64
	From  int64
	// Holder identifies the app server among the lease holders of the
	// counter, and Until is when its lease ends (Unix ms).
	Holder uint32
	Until  int64
}

// Reply is the shared store's answer to a Call.
type Reply struct {
	// Now is the instant the store decided at (Unix ms).
	Now int64
	// Granted is what a lease granted.
	Granted int64
	// Servers is how many app servers hold leases on the counter, this
	// one included (0 for a push).
	Servers int64
	// State is the counter after the call, rolled to Now.
	State window.State
}
