//go:build !unix

package redispipe

import "syscall"

// canPeek is set where peek and drain can look at a socket.
const canPeek = false

// peek reports that nothing waits on sock: where it cannot look, a read
// that timed out is taken at its word.
func peek(sock syscall.RawConn, buf []byte) (bool, error) { return false, nil }

// drain does nothing: where it cannot read without waiting, a watch
// connection serves again only after a whole reply.
func drain(sock syscall.RawConn, buf []byte) error { return nil }
