//go:build !linux

package rawio

import "net"

// Wrap returns c: raw I/O is Linux's only.
func Wrap(c net.Conn) net.Conn { return c }
