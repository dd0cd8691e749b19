package window

import "time"

// Slot is one request's hold on a concurrency limit: one of at most Limit
// requests of (Name, Key) in flight at once.
type Slot struct {
	// Key and Name identify the counter, as for a Charge. A store that
	// keeps Key must copy it.
	Key, Name string
	// Limit is how many slots of (Name, Key) may be held at once.
	Limit int
	// ID identifies this hold among the others of the counter: a random
	// string, unique per request, that Release and Renew name.
	ID string
	// Lease is how long a store that is shared by several processes keeps
	// the slot unless it is renewed or released, so that the slots of a
	// process that died come back.
	Lease time.Duration
}
