//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own, and makes its cancellation kill the
// group: cmd is go test, which runs the simulator as a process of its own, and killing
// go alone would leave the simulator running, writing to -out after the command said
// it gave up.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
