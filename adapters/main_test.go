// The tests of this directory check that every front end of sluice
// (net/http's Limiter.Handler and the Gin, Echo and Fiber adapters) answers
// the same requests with the same bytes.
package adapters_test

import (
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	redistest.Main(m)
}
