// Package earlysignal subscribes to SIGHUP while the program initialises,
// so that a SIGHUP sent right after the agent starts (a configuration tool
// reloading just after a restart) never meets Go's default action for it,
// which is to exit.
//
// Go initialises a package as soon as its imports are, so this one runs
// its init right after os/signal's, before the packages that take longest
// to initialise (protobuf, Prometheus, cobra) and long before main. What
// remains unprotected is the Go runtime's own start, before any package
// initialises: about a millisecond on an idle machine. SIGINT and SIGTERM
// keep their default action (exit) until main subscribes to them: before
// main, nothing has been changed that would need cleaning up.
package earlysignal

import (
	"os"
	"os/signal"
	"syscall"
)

// HUP receives the process's SIGHUPs from the start. It holds one pending
// signal: more SIGHUPs before it is read are one reload.
var HUP = make(chan os.Signal, 1)

func init() { signal.Notify(HUP, syscall.SIGHUP) }
