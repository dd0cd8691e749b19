package sluicegin

import (
	"context"

	"github.com/gin-gonic/gin"
)

// request is the keyfunc.Request of a Gin request. It holds one pointer, so
// it fits in an interface without allocating.
type request struct{ c *gin.Context }

func (r request) Context() context.Context    { return r.c.Request.Context() }
func (r request) Method() string              { return r.c.Request.Method }
func (r request) Path() string                { return r.c.Request.URL.Path }
func (r request) Route() string               { return r.c.FullPath() }
func (r request) RemoteAddr() string          { return r.c.Request.RemoteAddr }
func (r request) Header(name string) string   { return r.c.Request.Header.Get(name) }
func (r request) Values(name string) []string { return r.c.Request.Header.Values(name) }

// Query implements keyfunc.QueryRequest.
func (r request) Query(name string) string { return r.c.Query(name) }
