//go:build unix

package redispipe

import (
	"io"
	"syscall"
)

// canPeek is set where peek and drain can look at a socket.
const canPeek = true

// peek reports whether bytes wait to be read on sock, without reading
// them and without waiting; io.EOF means that the peer closed the
// connection.
func peek(sock syscall.RawConn, buf []byte) (bool, error) {
	var (
		n    int
		rerr error
	)
	err := sock.Read(func(fd uintptr) bool {
		for {
			n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK)
			if rerr != syscall.EINTR {
				return true // done, whatever the outcome: never wait
			}
		}
	})
	switch {
	case err != nil:
		return false, err
	case rerr == syscall.EAGAIN:
		return false, nil
	case rerr != nil:
		return false, rerr
	case n == 0:
		return false, io.EOF
	}
	return true, nil
}

// drain reads and discards whatever waits on sock, without waiting for
// more; io.EOF means that the peer closed the connection.
func drain(sock syscall.RawConn, buf []byte) error {
	var rerr error
	err := sock.Read(func(fd uintptr) bool {
		for {
			var n int
			n, rerr = syscall.Read(int(fd), buf)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr == syscall.EAGAIN:
				rerr = nil
				return true
			case rerr != nil:
				return true
			case n == 0:
				rerr = io.EOF
				return true
			}
		}
	})
	if err != nil {
		return err
	}
	return rerr
}
