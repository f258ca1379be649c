package sysutil

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestEventsSettle: a burst of updates on two subscriptions is read once,
// a later burst again, and the follower stops when a subscription ends.
func TestEventsSettle(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	a, b := make(chan int), make(chan string)
	ev := NewEvents()
	Follow(ev, done, a)
	Follow(ev, done, b)
	var calls atomic.Int32
	stopped := make(chan struct{})
	go func() {
		ev.Settle(done, 50*time.Millisecond, func() { calls.Add(1) })
		close(stopped)
	}()
	waitCalls := func(want int32) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Second); calls.Load() < want && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // no more than want
		if got := calls.Load(); got != want {
			t.Fatalf("%d reads, want %d", got, want)
		}
	}
	for i := range 10 { // one burst across both
		a <- i
		b <- "x"
	}
	waitCalls(1)
	b <- "y"
	waitCalls(2)
	close(a)
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("settle went on after a subscription ended")
	}
}
