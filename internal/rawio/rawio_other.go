//go:build !linux || msan || asan

package rawio

import "net"

// Wrap returns c: raw I/O is Linux's only, and not in builds with the memory or address
// sanitizer (-msan, -asan), which check a system call's buffer only through syscall's
// own Read and Write.
func Wrap(c net.Conn) net.Conn { return c }
