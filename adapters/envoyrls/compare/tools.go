//go:build tools

// Package compare holds rlsbench, which measures sluice-rls beside
// envoyproxy/ratelimit; this file keeps envoyproxy/ratelimit in go.mod so
// that rlsbench can build it.
package compare

import (
	_ "github.com/envoyproxy/ratelimit/src/service_cmd"
	_ "github.com/sluicehq/sluice/adapters/envoyrls/cmd/sluice-rls"
)
