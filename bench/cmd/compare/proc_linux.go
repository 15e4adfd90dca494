package main

import (
	"os"
	"syscall"
)

// terminate is the signal stop sends first.
var terminate os.Signal = syscall.SIGTERM

// childAttr puts redis-server in a process group of its own, so that the terminal's
// Ctrl-C reaches only this command, which then stops the server itself; and the kernel
// kills the server if this command dies without stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
