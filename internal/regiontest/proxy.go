package regiontest

import (
	"time"

	"github.com/sluicehq/sluice/internal/delayproxy"
)

// Proxy forwards TCP connections from a loopback listener to a peer's
// Redis, delaying each direction (package delayproxy).
type Proxy = delayproxy.Proxy

// NewProxy listens on a free loopback port and forwards to target, each
// byte delayed by delay in each direction.
func NewProxy(target string, delay time.Duration) (*Proxy, error) {
	return delayproxy.New(target, delay)
}
