//go:build !linux

package main

import (
	"os"
	"syscall"
)

// terminate is the signal stop sends first.
var terminate os.Signal = os.Interrupt

// childAttr leaves redis-server's process attributes as they are.
func childAttr() *syscall.SysProcAttr { return nil }
