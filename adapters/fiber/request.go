package sluicefiber

import (
	"context"
	"net"
	"net/netip"
	"unsafe"

	"github.com/gofiber/fiber/v2"
)

// request is the keyfunc.Request of a Fiber request. It holds one pointer,
// so it fits in an interface without allocating. The strings it returns
// point into fasthttp's buffers, as Fiber's own getters do by default: they
// are valid only while the handler runs, which is all key functions may
// use them for.
type request struct{ c *fiber.Ctx }

func (r request) Context() context.Context  { return r.c.UserContext() }
func (r request) Method() string            { return r.c.Method() }
func (r request) Path() string              { return r.c.Path() }
func (r request) Route() string             { return r.c.Route().Path }
func (r request) Header(name string) string { return r.c.Get(name) }

// RemoteAddr is the TCP peer, not c.IP(), which may come from a header. It
// reads as net/http's RemoteAddr does, such as "192.0.2.1:4711".
func (r request) RemoteAddr() string {
	addr := r.c.Context().RemoteAddr()
	if tcp, ok := addr.(*net.TCPAddr); ok {
		// One allocation where TCPAddr.String makes two.
		ap := tcp.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	return addr.String()
}

func (r request) Values(name string) []string {
	all := r.c.Request().Header.PeekAll(name)
	if len(all) == 0 {
		return nil
	}
	vals := make([]string, len(all))
	for i, v := range all {
		vals[i] = unsafe.String(unsafe.SliceData(v), len(v))
	}
	return vals
}

// Query implements keyfunc.QueryRequest.
func (r request) Query(name string) string { return r.c.Query(name) }
