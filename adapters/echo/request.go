package sluiceecho

import (
	"context"

	"github.com/labstack/echo/v4"
)

// request is the keyfunc.Request of an Echo request. It is used through a
// pointer, recycled by the requests pool.
type request struct{ c echo.Context }

func (r *request) Context() context.Context    { return r.c.Request().Context() }
func (r *request) Method() string              { return r.c.Request().Method }
func (r *request) Path() string                { return r.c.Request().URL.Path }
func (r *request) Route() string               { return r.c.Path() }
func (r *request) RemoteAddr() string          { return r.c.Request().RemoteAddr }
func (r *request) Header(name string) string   { return r.c.Request().Header.Get(name) }
func (r *request) Values(name string) []string { return r.c.Request().Header.Values(name) }

// Query implements keyfunc.QueryRequest.
func (r *request) Query(name string) string { return r.c.QueryParam(name) }
