package earlysignal

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestHUPCaught: a SIGHUP to the process lands in HUP instead of killing
// it: init subscribed before any test ran.
func TestHUPCaught(t *testing.T) {
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-HUP:
		if s != syscall.SIGHUP {
			t.Fatalf("got %v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SIGHUP not delivered to HUP")
	}
}
